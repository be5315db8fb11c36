"""The receiving API's business side: every delivery applied once, through the inbox.

What the demo's API (and the chaos suite's downstream) does with a request it accepts, before
it answers 2xx: in one transaction of the receiver's own database, `outbox.inbox.record` the
message id and, only if this delivery is the first, insert the effect. A duplicate (a retry
after a late answer, a takeover after a SIGKILL) finds the id and changes nothing.

The effects table has no unique key on purpose: a second effect for one message would be
stored, not refused, so `double_effects` counts what the inbox failed to prevent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from outbox import inbox

CONSUMER = "api"
EFFECTS_TABLE = "effects"
# Requests beyond this many at once wait for a connection: each holds one for a transaction
# of two statements, well under a millisecond on a local server.
POOL_SIZE = 8


@dataclass(frozen=True)
class EffectCounts:
    effects: int  # effect rows
    messages: int  # distinct message ids among them

    @property
    def double(self) -> int:
        """Effects beyond the first of a message: what the inbox is there to make zero."""
        return self.effects - self.messages


class InboxEffects:
    """Applies deliveries to `dsn`'s effects table, each message once (`apply`)."""

    def __init__(self, dsn: str, *, consumer: str = CONSUMER) -> None:
        self.consumer = consumer
        self._effects = sql.Identifier(EFFECTS_TABLE)
        with psycopg.connect(dsn, autocommit=True) as conn:
            inbox.migrate(conn)
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {t} (message_id text NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(t=self._effects)
            )
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn, min_size=1, max_size=POOL_SIZE, kwargs={"autocommit": True}, open=True
        )

    def apply(self, message_id: str) -> bool:
        """True if this delivery applied the message, False for a duplicate (not applied)."""
        with self._pool.connection() as conn, conn.transaction():
            first = inbox.record(conn, consumer=self.consumer, message_id=message_id)
            if first:
                conn.execute(
                    sql.SQL("INSERT INTO {t} (message_id) VALUES (%s)").format(t=self._effects),
                    (message_id,),
                )
            return first

    def per_message(self) -> dict[str, int]:
        """Effects applied, by message id."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT message_id, count(*) FROM {t} GROUP BY 1").format(t=self._effects)
            ).fetchall()
        return {str(message_id): int(n) for message_id, n in rows}

    def counts(self) -> EffectCounts:
        applied = self.per_message()
        return EffectCounts(sum(applied.values()), len(applied))

    def close(self) -> None:
        self._pool.close()
