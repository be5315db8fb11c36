from outbox.entry import controller

controller()
