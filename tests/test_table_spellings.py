"""The table's NOTIFY channel is one however the table is spelled: `outbox migrate --table
outbox` and `--table public.outbox` replaced each other's trigger, each notifying a channel
of its own spelling (`outbox:outbox`, `outbox:public.outbox`), and a worker given the other
spelling heard nothing and waited for its polls."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from outbox.producer import enqueue
from outbox.table import Table
from outbox.worker.listener import listen
from tests.helpers import outbox_on

INSERT = (
    "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)"
    " VALUES ('a', '1', 'e', '{{}}')"
)


def _channels(conn: psycopg.Connection[tuple[object, ...]], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT convert_from(rtrim(tgargs, '\\x00'::bytea), 'UTF8') FROM pg_trigger"
        " WHERE tgrelid = to_regclass(%s) AND NOT tgisinternal",
        (table,),
    ).fetchall()
    return [str(row[0]) for row in rows]


def test_two_spellings_of_migrate_agree_on_the_trigger(empty_dsn: str) -> None:
    first = outbox_on(empty_dsn, "migrate", "--table", "outbox")
    assert first.returncode == 0, first.stderr
    second = outbox_on(empty_dsn, "migrate", "--table", "public.outbox")
    assert second.returncode == 0, second.stderr
    assert "NOTIFY trigger" not in second.stdout, second.stdout
    assert "already at schema v" in second.stdout
    third = outbox_on(empty_dsn, "migrate", "--table", "outbox")
    assert "NOTIFY trigger" not in third.stdout, third.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _channels(conn, "outbox") == ["outbox:outbox"]


@pytest.mark.parametrize(
    ("migrated", "worker"),
    [
        ("outbox", "public.outbox"),
        ("public.outbox", "outbox"),
        ("app.events", "app.events"),
        # The trigger is made by a dollar-quoted DO block: a name holding its first tag.
        ("a$trigger$b", "public.a$trigger$b"),
    ],
)
async def test_a_worker_hears_the_trigger_whatever_the_spelling(
    empty_dsn: str, migrated: str, worker: str
) -> None:
    done = outbox_on(empty_dsn, "migrate", "--table", migrated)
    assert done.returncode == 0, done.stderr
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as listener:
        await listener.execute(await listen(listener, Table.parse(worker)))
        with psycopg.connect(empty_dsn, autocommit=True) as producer:
            producer.execute(sql.SQL(INSERT).format(t=Table.parse(worker).ident))
        heard = [n async for n in listener.notifies(timeout=10, stop_after=1)]
    assert len(heard) == 1


def test_a_search_path_spelling_in_another_schema_is_its_qualified_channel(
    empty_dsn: str,
) -> None:
    """`events` reached through the search_path in schema `app` is `app.events`."""
    done = outbox_on(empty_dsn, "migrate", "--table", "app.events")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = app, public")
        found = conn.execute(sql.SQL("SELECT {c}").format(c=Table.parse("events").channel_sql))
        assert found.fetchone() == ("outbox:app.events",)
        assert _channels(conn, "app.events") == ["outbox:app.events"]


def test_migrate_mends_a_trigger_an_earlier_version_made_with_the_other_spelling(
    empty_dsn: str,
) -> None:
    """An existing deployment: the trigger notifies `outbox:public.outbox`, as an earlier
    `outbox migrate --table public.outbox` made it; the new migrate, however spelled, makes
    it notify the table's one channel, which the new workers listen on."""
    done = outbox_on(empty_dsn, "migrate", "--table", "public.outbox")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON public.outbox"
            " FOR EACH STATEMENT EXECUTE FUNCTION public.outbox_notify('outbox:public.outbox')"
        )
    mended = outbox_on(empty_dsn, "migrate", "--table", "public.outbox")
    assert mended.returncode == 0, mended.stderr
    assert "made the NOTIFY trigger outbox_notify" in mended.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _channels(conn, "outbox") == ["outbox:outbox"]


def test_a_long_name_hashes_in_sql_as_it_did_in_python(empty_dsn: str) -> None:
    """Past an identifier's length the channel is a hash: the SQL one is the one the
    Python code made before (a long-named table keeps its trigger's channel)."""
    long = Table.parse("s" * 40 + "." + "u" * 40)
    done = outbox_on(empty_dsn, "migrate", "--table", str(long))
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _channels(conn, str(long)) == [long.channel]
        plain = Table.parse("ü" * 30)  # multi-byte, no schema: public
        conn.execute(sql.SQL("CREATE TABLE {t} ()").format(t=plain.ident))
        found = conn.execute(sql.SQL("SELECT {c}").format(c=plain.channel_sql)).fetchone()
        assert found == (plain.channel,)


def test_producers_of_two_spellings_take_one_aggregate_lock(dsn: str) -> None:
    """`lock_aggregate=True` keyed its advisory lock on the table as named: a producer
    given `public.outbox` did not wait for one given `outbox` holding the same aggregate,
    and their rows could commit out of order. It waits now (its lock_timeout ends it)."""
    event = {"aggregate_type": "order", "aggregate_id": "o-1", "event_type": "Placed"}
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        enqueue(first, **event, payload={}, table="outbox", lock_aggregate=True)
        second.execute("SET lock_timeout = '500ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            enqueue(second, **event, payload={}, table="public.outbox", lock_aggregate=True)
        second.rollback()
        first.commit()
        assert enqueue(second, **event, payload={}, table="public.outbox", lock_aggregate=True)
        second.commit()
