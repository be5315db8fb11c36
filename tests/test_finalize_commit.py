"""The deliveries' finalize commits without waiting for a WAL flush; claims still wait.

On a database that flushes each commit, the finalize's flush took milliseconds and the next
claim's commit queued behind it: the latency benchmark's slowest messages had a finalize in
flight. Losing such a finalize in a crash of the database only redelivers (the lease runs
out, the id de-duplicates downstream); losing a claim would hand its lease_version out
twice, so a claim must stay synchronous. Checked by what each statement leaves set in its
own transaction, on a session whose setting is `on` (the test server's default is off).
"""

from __future__ import annotations

from datetime import timedelta

from helpers import row, seed

from outbox import Outcome
from outbox.lease import claim, finalize, finalize_applied

LEASE = timedelta(seconds=30)


async def _synchronous_commit(aconn) -> str:  # type: ignore[no-untyped-def]
    cur = await aconn.execute("SHOW synchronous_commit")
    return str((await cur.fetchone())[0])


async def test_the_deliveries_finalize_waits_for_no_flush_and_the_claim_does(conn, aconn, table):
    ids = seed(conn, 3)
    await aconn.execute("SET synchronous_commit = on")
    async with aconn.transaction():
        messages = await claim(aconn, table, owner="A", batch=10, lease=LEASE, max_attempts=5)
        assert await _synchronous_commit(aconn) == "on"  # the claim commits durably
    async with aconn.transaction():
        applied = await finalize(aconn, table, [Outcome.done(m) for m in messages[:2]])
        assert await _synchronous_commit(aconn) == "off"  # for this transaction's commit only
    assert applied == set(ids[:2])
    assert await _synchronous_commit(aconn) == "on"  # the session's own setting is back
    assert [row(conn, i)["status"] for i in ids] == ["done", "done", "processing"]


async def test_a_finalize_that_lost_a_lease_still_commits_without_a_flush(conn, aconn, table):
    ids = seed(conn, 2)
    messages = await claim(aconn, table, owner="A", batch=10, lease=LEASE, max_attempts=5)
    conn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s", (ids[1],))
    await aconn.execute("SET synchronous_commit = on")
    async with aconn.transaction():
        applied = await finalize_applied(aconn, table, [Outcome.done(m) for m in messages])
        assert await _synchronous_commit(aconn) == "off"
    assert dict(applied) == {(ids[0], messages[0].lease_version): "done"}
    assert row(conn, ids[1])["status"] == "processing"  # fenced: the other lease is untouched
