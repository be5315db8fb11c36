"""`outbox-tui`: watch an outbox table live and repair its dead messages from a terminal.

Small modules with one job each: `config` (flags), `source` (the database, through the
dead-letter, dashboard, repair and stats queries of `outbox` only), `session` (its
connections' settings), `errors` (what counts as a database failure), `poller`
(non-overlapping refresh workers), `rates` (sparkline series from successive snapshots),
`format` (numbers, ages, durations), `widgets`, `host` (what the screens use from the app),
`screens/` and `app`. See docs/tui.md.
"""
