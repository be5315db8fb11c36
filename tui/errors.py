"""Which exceptions the TUI survives as the database's trouble rather than its own bug.

Whether such an error passes by itself is `outbox.plumbing.dberrors.is_transient`, the one
classification every component uses: transient errors drop the connection and the next poll
reconnects; the others are the statement's own fault (a filter's path the database refused).
"""

from __future__ import annotations

import psycopg

# Failures a poll or an action reports and survives: the server is gone, restarting, or
# refused a query. The app never exits on them.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (psycopg.Error, OSError)
