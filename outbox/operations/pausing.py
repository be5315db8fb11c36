"""Pausing and resuming a destination by hand (`outbox pause`/`resume`, the TUI), recorded.

A pause is the `paused` rule of outbox.destinations applied under the destination's row
lock, with who and why written into the row (`changed_by`, `reason`); a resume is the
`resumed` rule: a paused destination, or an open breaker, closed (a person who knows the
destination is back need not wait for the next probe, which may be minutes away or, for a
destination no worker serves any more, never come). The same transaction writes one row to
the table's audit log (`<table>_actions`, as requeue and skip do, with no message ids and
the destination, the state it was in and the reason in `filter`), so the row and its record
commit together or not at all. A change that does nothing (pausing a paused destination,
resuming a closed one) writes nothing, not even a destination row, and says what the
destination's state is instead.

Who: the name given (`--actor`, the TUI's OS user), else the database's current_user.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from outbox import destinations as dest
from outbox.plumbing.redact import redact_url
from outbox.plumbing.text import age, first_unsafe, printable, printable_name
from outbox.runner import Query, Rollback, Row, Steps, first_row, perform, perform_async, step
from outbox.table import Table

Verb = Literal["pause", "resume"]
MAX_REASON_LENGTH = 500  # a sentence or two: the row and the audit log keep it
MAX_DESTINATION_LENGTH = 1000


# A word of a destination's name that is a URL (`https://host`, `nats nats://a:4222, ...`).
_URL_WORD = re.compile(r"\S*://\S*")


def _required_reason(text: str) -> str:
    """What every pause's reason must be (the TUI's too): given, and short enough to show."""
    if not text.strip():
        raise ValueError("a reason is required (why is it paused? people will read it)")
    if len(text) > MAX_REASON_LENGTH:
        raise ValueError(f"at most {MAX_REASON_LENGTH} characters, got {len(text)}")
    return text


def check_reason(text: str) -> str:
    """A pause's reason as typed (`outbox pause --reason`): required, short enough to show,
    and one line of text (it is printed under its destination and in messages)."""
    _required_reason(text)
    if (unsafe := first_unsafe(text)) is not None:
        raise ValueError(f"holds {unsafe}")
    return text


def check_destination(text: str) -> str:
    """A destination's name as the workers write it (`outbox destinations` lists them).

    Never one with a control character, a bidirectional override or a lone surrogate
    (`first_unsafe`), nor a URL with user-info (other than the mask), a
    query or a fragment: workers record none (an HTTP destination is its origin, a NATS one
    its servers masked as outbox.plumbing.redact shows them), so such a name would pause nothing,
    and the audit log would keep the secret. The refusal shows the name masked.
    """
    if not text.strip():
        raise ValueError("a destination is required (`outbox destinations` lists them)")
    if len(text) > MAX_DESTINATION_LENGTH:
        raise ValueError(f"at most {MAX_DESTINATION_LENGTH} characters, got {len(text)}")
    if (unsafe := first_unsafe(text)) is not None:
        raise ValueError(f"holds {unsafe}; no destination's name does")
    if any(_secretive(url) for url in _URL_WORD.findall(text)):
        masked = _URL_WORD.sub(lambda url: _masked_url(url[0]), text)
        raise ValueError(
            f"{masked} holds user-info, a query or a fragment; workers name a destination "
            "without them (an HTTP one by its origin, scheme://host:port), see `outbox "
            "destinations`"
        )
    return text


def _secretive(url: str) -> bool:
    # Credentials or a query of any kind (a bare `?TOKEN` is one too); user-info already
    # masked (`nats://***@host`, as a NATS worker records it) is not.
    return redact_url(url) != url or "?" in url


def _masked_url(url: str) -> str:
    """The URL as a refusal may show it: user-info masked, the query (all of it) too."""
    head, question, _ = redact_url(url).partition("?")
    return f"{head}{question and question + '***'}"


@dataclass(frozen=True)
class HandChange:
    """What a pause or resume did."""

    action: Verb
    destination: str
    before: dest.Destination | None  # None: no row (never failed, paused or rate limited)
    after: dest.Destination | None  # None: nothing changed (see `before` for why)
    now: datetime  # the database's
    actor: str
    new: bool = False  # the destination had no row before this pause
    audit_id: int | None = None

    @property
    def changed(self) -> bool:
        return self.after is not None

    def summary(self, shown: Callable[[str], str] = printable_name) -> str:
        """One line for people: what changed, or why nothing did. Names as `shown` shows
        them: by default as `outbox destinations` lists them (a backslash doubled), so the
        two read alike; the TUI, whose rows come escaped already, passes its own."""
        # Names and reasons come from rows, which older versions or other tools may have
        # written with control characters: shown escaped, the line stays one line.
        name = shown(self.destination)
        if self.changed:
            done = "paused" if self.action == "pause" else "resumed"
            was = self.before.state if self.before is not None else None
            note = "" if was in (None, dest.CLOSED) else f" (it was {was})"
            if self.new:
                # A typo pauses nothing: say that the name is new, so people check it.
                note = " (a name no worker has recorded yet: it must match theirs exactly)"
            return f"{done} {name}{note}, recorded as action #{self.audit_id}"
        if self.before is None:
            return f"{name} is closed (no destination of that name has a row); nothing changed"
        return f"{name} is already {_state_text(self.before, self.now, shown)}; nothing changed"


def _state_text(row: dest.Destination, now: datetime, shown: Callable[[str], str]) -> str:
    since = f" for {age((now - row.since).total_seconds())}" if row.since is not None else ""
    if row.state == dest.PAUSED:
        who, why = shown(row.changed_by or "?"), printable(row.reason or "(no reason)")
        return f"paused{since} by {who}: {why}"
    return f"{row.state}{since}"


def _who(table: Table, destination: str, actor: str | None) -> Query[tuple[str, bool]]:
    """Who acts (the given name, else current_user), and whether the destination has a row."""
    statement = sql.SQL(
        "SELECT coalesce(%(actor)s::text, current_user), "
        "EXISTS (SELECT 1 FROM {d} WHERE destination = %(destination)s)"
    ).format(d=dest.table_of(table))
    return Query(
        statement,
        {"actor": actor, "destination": destination},
        first_row(lambda row: (str(_must(row)[0]), bool(_must(row)[1]))),
    )


def _must(row: Row | None) -> Row:
    assert row is not None  # a SELECT without FROM returns one row
    return row


def _record(table: Table, verb: Verb, actor: str, filter: dict[str, Any]) -> Query[int]:
    """One audit-log row for the change: no message ids, the destination in `filter`."""
    statement = sql.SQL(
        "INSERT INTO {a} (actor, action, filter, requested, count) "
        "VALUES (%(actor)s, %(action)s, %(filter)s::jsonb, 1, 1) RETURNING id"
    ).format(a=table.sibling("actions"))
    params = {"actor": actor, "action": verb, "filter": Jsonb(filter)}
    return Query(statement, params, first_row(lambda row: int(_must(row)[0])))


def _rule(verb: Verb, actor: str, reason: str | None) -> dest.Rule:
    def pause(row: dest.Destination, now: datetime) -> dest.Destination | None:
        if row.state == dest.PAUSED:
            return None  # the first pause's who and why stand
        return dest.paused(row, by=actor, reason=reason or "", now=now)

    def resume(row: dest.Destination, now: datetime) -> dest.Destination | None:
        return dest.resumed(row, by=actor, now=now)

    return pause if verb == "pause" else resume


def _recorded(verb: Verb, change: dest.Change, reason: str | None, via: str) -> dict[str, Any]:
    recorded: dict[str, Any] = {"destination": change.before.destination}
    if reason is not None:
        recorded["reason"] = reason
    recorded["was"] = change.before.state
    recorded["via"] = via
    return recorded


def _outcome(
    verb: Verb, destination: str, change: dest.Change, existed: bool, actor: str
) -> HandChange:
    changed = change.after is not None and change.after != change.before
    return HandChange(
        verb,
        destination,
        before=change.before if existed or changed else None,
        after=change.after if changed else None,
        now=change.now,
        actor=actor,
        new=changed and not existed,
    )


def _changing_by_hand(
    table: Table, verb: Verb, destination: str, reason: str | None, actor: str | None, via: str
) -> Steps[HandChange]:
    """`change_by_hand`'s statements, once the reason is checked (before any transaction
    begins, as a plain function: a generator's body would wait for its first step)."""
    if verb == "pause" or reason is not None:
        _required_reason(reason or "")  # a resume's is optional, but kept to the same rules
    return _hand_change_steps(table, verb, destination, reason, actor, via)


def _hand_change_steps(
    table: Table, verb: Verb, destination: str, reason: str | None, actor: str | None, via: str
) -> Steps[HandChange]:
    """Run in one transaction, rolled back when nothing changes: no destination row is
    left behind."""
    who, existed = yield from step(_who(table, destination, actor))
    change = yield from dest.changing(table, destination, _rule(verb, who, reason))
    result = _outcome(verb, destination, change, existed, who)
    if not result.changed:
        raise Rollback(result)
    recorded = _recorded(verb, change, reason, via)
    audit = yield from step(_record(table, verb, who, recorded))
    return replace(result, audit_id=audit)


def change_by_hand(
    conn: psycopg.Connection[Any],
    table: Table,
    verb: Verb,
    destination: str,
    *,
    reason: str | None = None,
    actor: str | None = None,
    via: str,
) -> HandChange:
    """Pause (`reason` required) or resume (`reason` optional) `destination`, and record it,
    in one transaction."""
    steps = _changing_by_hand(table, verb, destination, reason, actor, via)
    return perform(conn, steps, transaction=True)


async def change_by_hand_async(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    verb: Verb,
    destination: str,
    *,
    reason: str | None = None,
    actor: str | None = None,
    via: str,
) -> HandChange:
    """`change_by_hand` on an async connection (the TUI)."""
    steps = _changing_by_hand(table, verb, destination, reason, actor, via)
    return await perform_async(conn, steps, transaction=True)
