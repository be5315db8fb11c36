"""The design article's dispatcher, as the baseline: claim a batch in one short transaction,
then one fenced UPDATE transaction per message (sync psycopg, as in the article).

    python -m bench.peers.article DSN BATCH
"""

from __future__ import annotations

import sys
from datetime import timedelta

import psycopg

CLAIM = """
WITH picked AS (
    SELECT id FROM outbox
     WHERE (status = 'pending' AND available_at <= now())
        OR (status = 'processing' AND lease_until < now() AND attempts < %(max_attempts)s)
     ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
)
UPDATE outbox AS o
   SET status = 'processing', lease_owner = %(owner)s, lease_until = now() + %(lease)s,
       lease_version = o.lease_version + 1, attempts = o.attempts + 1
  FROM picked WHERE o.id = picked.id
RETURNING o.id, o.lease_version, o.aggregate_id, o.event_type, o.payload
"""
REAP = """
UPDATE outbox SET status = 'dead', last_error = 'lease expired after max attempts',
       lease_owner = NULL, lease_until = NULL
 WHERE status = 'processing' AND lease_until < now() AND attempts >= %(max_attempts)s
"""
DONE = """
UPDATE outbox SET status = 'done', done_at = now(), last_error = NULL,
       lease_owner = NULL, lease_until = NULL
 WHERE id = %(id)s AND status = 'processing' AND lease_version = %(version)s
"""


def main() -> None:
    dsn, batch = sys.argv[1], int(sys.argv[2])
    params = {
        "batch": batch,
        "owner": "article",
        "lease": timedelta(seconds=60),
        "max_attempts": 12,
    }
    with psycopg.connect(dsn) as conn:
        while True:
            with conn.transaction():
                conn.execute(REAP, params)
                rows = conn.execute(CLAIM, params).fetchall()
            if not rows:
                return
            for message_id, version, *_ in sorted(rows):
                # publish(...) is a no-op here; the finalize is one transaction per message
                with conn.transaction():
                    conn.execute(DONE, {"id": message_id, "version": version})


if __name__ == "__main__":
    main()
