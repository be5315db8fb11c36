"""The `outbox` command's groups of subcommands beside `outbox.cli` (inbox; replay and
reconcile)."""
