"""`outbox-tui`: watch an outbox table live and repair its dead messages from a terminal.

Small modules with one job each: `config` (flags), `source` (the database, through
`outbox.admin` and `outbox.stats` only), `poller` (non-overlapping refresh workers),
`rates` (sparkline series from successive snapshots), `format` (numbers and ages),
`widgets`, `screens/` and `app`. See docs/tui.md.
"""
