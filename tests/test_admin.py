"""Dead letters for people (outbox.views.dead_letters, filters, error_groups, dashboard, repair):
listing, filters, error groups, fenced requeue/skip, the audit log, and the v1 -> v2
migration that adds it."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from helpers import row, seed, statuses

from outbox.operations import repair
from outbox.operations.repair import Seen
from outbox.runner import fetch, fetch_async
from outbox.schema import SCHEMA_VERSION, migrate, migration_statements
from outbox.table import Table
from outbox.tui.session import configure_session
from outbox.views import dashboard, dead_letters
from outbox.views.filters import DeadFilter, FilterError, parse_filter


def _dead(conn, ids: list[int], error: str | None = "boom", attempts: int = 12) -> None:
    conn.execute(
        "UPDATE outbox SET status = 'dead', attempts = %s, last_error = %s WHERE id = ANY(%s)",
        (attempts, error, ids),
    )


# -- filters ---------------------------------------------------------------------------------


def test_parse_filter_reads_keys_words_json_and_paths():
    f = parse_filter('type:OrderPaid agg:o-1 aggtype:order error:"connection refused"')
    assert f == DeadFilter(
        event_type="OrderPaid",
        aggregate_id="o-1",
        aggregate_type="order",
        error="connection refused",
    )
    assert parse_filter("  timed out  ") == DeadFilter(error="timed out")
    assert parse_filter('{"customer": {"id": "c 1"}} type:X') == DeadFilter(
        event_type="X", payload={"customer": {"id": "c 1"}}
    )
    assert parse_filter('type:X $.items[*] ? (@.sku == "a b")') == DeadFilter(
        event_type="X", payload_path='$.items[*] ? (@.sku == "a b")'
    )
    assert parse_filter('group:"HTTP 422: {\\"id\\": <n>}"').error_group == 'HTTP 422: {"id": <n>}'
    assert parse_filter("").is_empty()


@pytest.mark.parametrize(
    "text",
    [
        'type:OrderPaid agg:"a b" error:x {"k": [1, 2]} $.n > 1',
        'group:"HTTP 422: {\\"id\\": <n>}"',
        "aggtype:order",
    ],
)
def test_describe_round_trips(text):
    f = parse_filter(text)
    assert parse_filter(f.describe()) == f


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour:red", "unknown filter colour:"),
        ("type:a type:b", "given twice"),
        ('{"k": ', "not valid JSON"),
        ("error:x more words", "given twice"),
    ],
)
def test_parse_filter_errors_say_what_is_wrong(text, message):
    with pytest.raises(FilterError, match=message):
        parse_filter(text)


def test_filters_match_exactly_what_they_say(conn, table):
    ids = seed(conn, 8)
    conn.execute("UPDATE outbox SET event_type = 'Paid', aggregate_id = 'o-7', "
                 "payload = '{\"customer\": \"c-1\", \"amount\": 120, \"tags\": [\"vip\"]}' "
                 "WHERE id = ANY(%s)", (ids[:3],))  # fmt: skip
    _dead(conn, ids[:6], "HTTP 503: upstream 100% busy_now")
    _dead(conn, [ids[0]], "connection refused")

    def matching(text: str) -> list[int]:
        return [s.id for s in fetch(conn, repair.select_targets(table, parse_filter(text)))]

    assert matching("") == sorted(ids[:6], reverse=True)
    assert matching("type:Paid") == sorted(ids[:3], reverse=True)
    assert matching("agg:o-7 refused") == [ids[0]]
    assert matching("REFUSED") == [ids[0]]  # case-insensitive
    assert matching("100%") == sorted(ids[1:6], reverse=True)  # LIKE wildcards are literal
    assert matching("busy_now") == sorted(ids[1:6], reverse=True)
    assert matching("100_") == []
    assert matching('{"customer": "c-1"}') == sorted(ids[:3], reverse=True)
    assert matching('{"tags": ["vip"]}') == sorted(ids[:3], reverse=True)
    assert matching("$.amount > 100") == sorted(ids[:3], reverse=True)
    assert matching("$.amount > 1000") == []
    assert matching("$.customer") == sorted(ids[:3], reverse=True)  # the path must exist
    assert matching("$.nothing") == []
    # Only dead rows: the pending ones with the same payload never match.
    assert matching("type:Tested") == sorted(ids[3:6], reverse=True)


def test_an_invalid_path_is_a_database_error_not_a_crash(conn, table):
    seed(conn, 1)
    with pytest.raises(psycopg.Error):
        fetch(conn, dead_letters.dead_count(table, parse_filter("$.a ==")))
    assert fetch(conn, dead_letters.dead_count(table)) == 0  # the connection is still usable


# -- listing and paging ----------------------------------------------------------------------


def test_dead_pages_are_newest_first_and_keyset_paged(conn, table):
    ids = seed(conn, 30)
    dead = ids[::2]  # 15 dead rows among pending ones
    _dead(conn, dead)
    newest_first = sorted(dead, reverse=True)

    first = fetch(conn, dead_letters.dead_page(table, limit=6))
    assert [m.id for m in first.messages] == newest_first[:6]
    assert (first.has_newer, first.has_older) == (False, True)
    second = fetch(conn, dead_letters.dead_page(table, before=first.messages[-1].id, limit=6))
    assert [m.id for m in second.messages] == newest_first[6:12]
    assert (second.has_newer, second.has_older) == (True, True)
    third = fetch(conn, dead_letters.dead_page(table, before=second.messages[-1].id, limit=6))
    assert [m.id for m in third.messages] == newest_first[12:]
    assert (third.has_newer, third.has_older) == (True, False)
    # Back up: the page just newer than the third's first row is the second page again.
    back = fetch(conn, dead_letters.dead_page(table, after=third.messages[0].id, limit=6))
    assert [m.id for m in back.messages] == newest_first[6:12]
    assert (back.has_newer, back.has_older) == (True, True)
    top = fetch(conn, dead_letters.dead_page(table, after=back.messages[0].id, limit=6))
    assert [m.id for m in top.messages] == newest_first[:6]
    assert top.has_newer is False

    m = first.messages[0]
    assert (m.aggregate_type, m.event_type, m.attempts, m.last_error) == (
        "order", "Tested", 12, "boom"
    )  # fmt: skip
    assert fetch(conn, dead_letters.dead_count(table)) == 15


# -- error groups ----------------------------------------------------------------------------

NORMALISED = [
    ('HTTP 422: {"status": 422, "id": "abc"}', 'HTTP 422: {"status": <n>, "id": <str>}'),
    ("HTTP 503", "HTTP 503"),  # status codes are the kind of failure: kept
    ("can't reach 'db-1' at 10.0.0.5:5432", "can't reach <str> at <n>:<n>"),
    ("order 550e8400-e29b-41d4-a716-446655440000 failed", "order <uuid> failed"),
    ("trace deadbeef0123 at 0x1F", "trace <hex> at <hex>"),
    ("req_123 agg-42 took 1.5s", "req_<n> agg-<n> took <n>s"),
    ("  two\n  lines  ", "two lines"),
    (None, ""),
]


@pytest.mark.parametrize(("error", "key"), NORMALISED)
def test_error_normaliser(conn, table, error, key):
    ids = seed(conn, 1)
    _dead(conn, ids, error)
    [group] = fetch(conn, dead_letters.error_groups(table))
    assert group.key == key
    assert group.example == error
    # The key selects the group back.
    assert fetch(conn, dead_letters.dead_count(table, DeadFilter(error_group=key))) == 1


def test_error_groups_count_variants_together_biggest_first(conn, table):
    ids = seed(conn, 10)
    for n, i in enumerate(ids[:6]):
        _dead(conn, [i], f"timeout after {n}.5s for order {i}")
    _dead(conn, ids[6:9], 'HTTP 422: {"reason": "bad"}')
    groups = fetch(conn, dead_letters.error_groups(table))
    assert [(g.key, g.count) for g in groups] == [
        ("timeout after <n>s for order <n>", 6),
        ('HTTP 422: {"reason": <str>}', 3),
    ]
    assert groups[0].newest_id == ids[5]
    assert groups[0].example == f"timeout after 5.5s for order {ids[5]}"
    # Groups respect the filter too.
    only = fetch(conn, dead_letters.error_groups(table, parse_filter("422")))
    assert [g.count for g in only] == [3]


# -- lease holders, blocked aggregates, detail -----------------------------------------------


def test_lease_holders_and_blocked_aggregates(conn, table):
    ids = seed(conn, 12, aggregates=3)  # agg-0: ids 0,3,6,9; agg-1: 1,4,7,10; agg-2: ...
    conn.execute("UPDATE outbox SET status = 'processing', lease_owner = 'w1', "
                 "lease_until = now() + interval '1 minute' WHERE id = ANY(%s)",
                 (ids[9:11],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'processing', lease_owner = 'w2', "
                 "lease_until = now() - interval '1 minute' WHERE id = %s", (ids[11],))  # fmt: skip
    holders = fetch(conn, dashboard.lease_holders(table))
    assert [(h.owner, h.held, h.expired) for h in holders] == [("w1", 2, 0), ("w2", 1, 1)]

    conn.execute("UPDATE outbox SET status = 'done' WHERE id = ANY(%s)", ([ids[0], ids[1]],))
    _dead(conn, [ids[3]])  # agg-0's head is dead: blocked, 6 and 9 wait behind it
    _dead(conn, [ids[7]])  # agg-1: 4 is still pending before it: not a dead head
    blocked = fetch(conn, dashboard.blocked_aggregates(table))
    assert (blocked.aggregates, blocked.waiting) == (1, 2)

    head = fetch(conn, dead_letters.message(table, ids[3]))
    assert head is not None
    assert head.is_head and head.waiting_behind == 2
    behind = fetch(conn, dead_letters.message(table, ids[7]))
    assert behind is not None and not behind.is_head
    assert fetch(conn, dead_letters.message(table, 10**9)) is None


def test_message_detail_has_every_column_with_its_type(conn, table):
    conn.execute("ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 't-1'")
    [message_id] = seed(conn, 1)
    _dead(conn, [message_id], 'HTTP 422: {"id": 7}')
    detail = fetch(conn, dead_letters.message(table, message_id))
    assert detail is not None
    assert list(detail.columns)[:3] == ["id", "aggregate_type", "aggregate_id"]
    assert detail.columns["tenant"] == "t-1"  # an application's extra column is shown too
    # The payload is read bounded, as its text, never decoded (it may be nested thousands
    # deep): the first characters and the whole length.
    assert "payload" not in detail.columns
    assert json.loads(detail.payload_text) == {"n": 0, "text": "x" * 20}
    assert detail.payload_bytes == len(detail.payload_text.encode())
    assert detail.error_group == 'HTTP 422: {"id": <n>}'
    assert detail.seen == Seen(message_id, "dead", 0)


# -- actions ---------------------------------------------------------------------------------


def test_requeue_is_fenced_on_what_was_seen_and_recorded(conn, table):
    ids = seed(conn, 5)
    _dead(conn, ids[:4])
    conn.execute("UPDATE outbox SET lease_version = 3, lease_owner = 'gone' WHERE id = %s",
                 (ids[0],))  # fmt: skip
    seen = fetch(conn, repair.select_targets(table))
    assert [s.id for s in seen] == sorted(ids[:4], reverse=True)

    # Meanwhile: one row is requeued by someone else and claimed again (new version), one
    # is skipped, and a new dead row appears. None of that may be touched.
    conn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s", (ids[1],))
    conn.execute("UPDATE outbox SET status = 'done' WHERE id = %s", (ids[2],))
    _dead(conn, [ids[4]])

    result = fetch(conn, repair.repair(table, "requeue", seen, actor="alice", filter={"query": ""}))
    assert result.changed == sorted([ids[0], ids[3]])
    assert result.changed_meanwhile == sorted([ids[1], ids[2]])
    assert result.summary() == "requeued 2 of 4; 2 changed since shown, left alone"

    requeued = row(conn, ids[0])
    assert requeued["status"] == "pending"
    assert requeued["attempts"] == 0
    assert requeued["lease_owner"] is None and requeued["lease_until"] is None
    assert requeued["lease_version"] == 3  # the fencing token is the claim's, not ours
    assert requeued["last_error"] == "boom"  # kept for people until the next attempt
    ready = conn.execute("SELECT available_at <= now() FROM outbox WHERE id = %s", (ids[0],))
    assert ready.fetchone() == (True,)
    assert row(conn, ids[1])["status"] == "dead"
    assert row(conn, ids[2])["status"] == "done"
    assert row(conn, ids[4])["status"] == "dead"

    [record] = fetch(conn, repair.recent_actions(table))
    assert record.id == result.audit_id
    assert (record.actor, record.action, record.requested, record.count) == (
        "alice", "requeue", 4, 2
    )  # fmt: skip
    assert record.message_ids == sorted([ids[0], ids[3]])
    assert record.filter == {"query": ""}
    assert record.db_user == conn.info.user
    assert [a.id for a in fetch(conn, repair.history(table, ids[0]))] == [record.id]
    assert fetch(conn, repair.history(table, ids[1])) == []


def test_skip_marks_done_and_unblocks_the_aggregate(conn, table):
    ids = seed(conn, 3)  # one aggregate
    _dead(conn, [ids[0]])
    assert fetch(conn, dashboard.blocked_aggregates(table)).aggregates == 1
    seen = fetch(conn, repair.select_targets(table, ids=[ids[0], ids[1], 10**9]))
    assert seen == [Seen(ids[1], "pending", 0), Seen(ids[0], "dead", 0)]
    result = fetch(conn, repair.repair(table, "skip", seen))
    assert result.changed == [ids[0]] and result.not_dead == [ids[1]]
    assert row(conn, ids[0])["status"] == "done"
    assert row(conn, ids[0])["done_at"] is not None
    assert row(conn, ids[1])["status"] == "pending"
    assert fetch(conn, dashboard.blocked_aggregates(table)).aggregates == 0
    [record] = fetch(conn, repair.history(table, ids[0]))
    assert record.action == "skip"
    assert record.actor == conn.info.user  # no actor given: the database user


def test_an_action_that_changes_nothing_is_still_recorded(conn, table):
    [message_id] = seed(conn, 1)
    result = fetch(
        conn, repair.repair(table, "requeue", [Seen(message_id, "dead", 0)], actor="bob")
    )
    assert result.count == 0 and result.changed_meanwhile == [message_id]
    assert statuses(conn) == {"pending": 1}
    [record] = fetch(conn, repair.recent_actions(table))
    assert (record.count, record.requested, record.message_ids) == (0, 1, [])


async def test_async_apply_matches_sync(aconn, conn, table):
    ids = seed(conn, 2)
    _dead(conn, ids)
    seen = await fetch_async(aconn, repair.select_targets(table))
    result = await fetch_async(aconn, repair.repair(table, "requeue", seen, actor="carol"))
    assert result.changed == sorted(ids)
    assert statuses(conn) == {"pending": 2}


async def test_a_read_only_session_cannot_write(aconn, conn, table):
    [message_id] = seed(conn, 1)
    _dead(conn, [message_id])
    await configure_session(aconn, read_only=True)
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        await fetch_async(aconn, repair.repair(table, "requeue", [Seen(message_id, "dead", 0)]))
    assert row(conn, message_id)["status"] == "dead"


# -- the v2 migration ------------------------------------------------------------------------


def test_a_v1_table_upgrades_in_place_to_v2(empty_dsn):
    table = Table.parse("app.events")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for statement in migration_statements(table)[: _v1_statement_count(table)]:
            conn.execute(statement)
        assert _comment(conn) == "outbox-dispatcher schema v1"
        conn.execute("INSERT INTO app.events (aggregate_type, aggregate_id, event_type, payload, "
                     "status) VALUES ('a', '1', 'E', '{}', 'dead')")  # fmt: skip
        assert conn.execute("SELECT to_regclass('app.events_actions')").fetchone() == (None,)

        assert migrate(conn, table) == (1, SCHEMA_VERSION) == (1, 7)
        assert _comment(conn) == "outbox-dispatcher schema v7"
        assert conn.execute("SELECT count(*) FROM app.events").fetchone() == (1,)  # kept
        seen = fetch(conn, repair.select_targets(table))
        result = fetch(conn, repair.repair(table, "requeue", seen, actor="dave"))
        assert result.count == 1
        assert fetch(conn, repair.history(table, seen[0].id))[0].actor == "dave"
        index = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'events_actions_messages'"
        ).fetchone()
        assert index is not None and "gin (message_ids)" in index[0]
        assert migrate(conn, table) == (7, 7)
        # v3: the error history column, empty on the row that was there before; v4: the
        # headers column, empty too, and the destinations table beside it; v5: who serves
        # each destination; v6: the replay column, empty, and the replays' counter; v7: the
        # layout table, empty (a plain table).
        assert conn.execute("SELECT errors, headers, replay FROM app.events").fetchone() == (
            None,
            None,
            None,
        )
        assert conn.execute("SELECT nextval('app.events_replays')").fetchone() == (1,)
        assert conn.execute(
            "SELECT count(*), count(served_at) FROM app.events_destinations"
        ).fetchone() == (0, 0)


def _v1_statement_count(table: Table) -> int:
    from outbox.schema import MIGRATIONS

    return len(MIGRATIONS[0](table)) + 1  # the v1 step and its version comment


def _comment(conn) -> str:
    return str(conn.execute("SELECT obj_description('app.events'::regclass)").fetchone()[0])


# -- who is connected, which heads block -----------------------------------------------------


def test_blocking_heads_name_the_dead_head_and_what_waits_behind(conn, table):
    ids = seed(conn, 9, aggregates=3)  # agg-0: 0, 3, 6; agg-1: 1, 4, 7; agg-2: 2, 5, 8
    _dead(conn, [ids[0]])  # agg-0's head: 3 and 6 wait
    _dead(conn, [ids[4]])  # agg-1: 1 is still pending before it: not a head
    conn.execute("UPDATE outbox SET status = 'done' WHERE id = %s", (ids[2],))
    _dead(conn, [ids[5]])  # agg-2's head once 2 is done: 8 waits
    heads = fetch(conn, dashboard.blocking_heads(table))
    assert [(h.id, h.aggregate_id, h.waiting) for h in heads] == [
        (ids[0], "agg-0", 2), (ids[5], "agg-2", 1)
    ]  # fmt: skip
    assert heads[0].seen == Seen(ids[0], "dead", 0)
    assert fetch(conn, dashboard.blocked_aggregates(table)).aggregates == len(heads)


def test_sessions_show_workers_by_name_with_their_leases_and_last_claim(conn, dsn, table):
    from outbox.queries import queries

    ids = seed(conn, 3)
    with psycopg.connect(dsn, autocommit=True, application_name="worker-a") as worker:
        params = {
            "owner": "worker-a",
            "lease": "30s",
            "batch": 1,
            "max_attempts": 5,
            "max_payload_bytes": 1 << 20,
            "claim_bytes": 1 << 24,
        }
        assert len(worker.execute(queries(table).claim, params).fetchall()) == 1
        conn.execute(
            "UPDATE outbox SET status = 'processing', lease_owner = 'gone-1', "
            "lease_until = now() - interval '1 minute' WHERE id = %s",
            (ids[2],),
        )
        found = {s.name: s for s in fetch(conn, dashboard.sessions(table))}
    a = found["worker-a"]
    assert (a.connections, a.held, a.expired) == (1, 1, 0)
    assert a.last_claim is not None and a.connected_since is not None
    assert "idle 1" in a.states
    gone = found["gone-1"]  # leases left behind by a worker without a session
    assert (gone.connections, gone.held, gone.expired, gone.last_claim) == (0, 1, 1, None)
    # Its session closed (the backend exits soon after), worker-a's lease is what is left.
    deadline = time.monotonic() + 15
    while (after := {s.name: s for s in fetch(conn, dashboard.sessions(table))})[
        "worker-a"
    ].connections:
        assert time.monotonic() < deadline, after
        time.sleep(0.05)
    assert after["worker-a"].held == 1
