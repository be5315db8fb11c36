from outbox.extras import tui

tui()
