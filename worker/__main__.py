from outbox.entry import worker

worker()
