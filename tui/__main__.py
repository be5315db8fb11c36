from outbox.entry import tui

tui()
