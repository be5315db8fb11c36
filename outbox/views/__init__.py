"""What people read of a table: the dashboard's and the dead letters' read models, the
filter language and error groups (the TUI and the `outbox` command share them)."""
