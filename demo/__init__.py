"""The demo: an application of the protocol, not part of it.

`outbox demo` starts an embedded PostgreSQL (`embedded`), a local HTTP API that misbehaves on
purpose (`sink`), real worker processes, and reports what was delivered (`run`). Needs the
`[demo]` extra.
"""
