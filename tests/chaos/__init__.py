"""The chaos suite: real worker processes and a real PostgreSQL under faults, checked by a
Jepsen-style history checker. See docs/reliability.md."""
