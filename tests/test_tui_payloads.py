"""Payloads of any shape on screen: laid out as text, bounded in depth and size, never decoded.

PostgreSQL takes jsonb nested 15,000 deep; Python's json module gives up near 1,000
(RecursionError), and so did the detail view, even with --read-only."""

from __future__ import annotations

import json

import pytest
from helpers import seed
from test_tui import SIZE, _app, screen_text, until
from textual.containers import VerticalScroll

from outbox.plumbing.jsontext import MAX_LAYOUT_DEPTH, layout, loads_bounded, nesting_depth
from outbox.tui.screens.detail import DetailScreen
from outbox.views.dead_letters import PAYLOAD_PREVIEW

DEEP = 15_000


def _dead_row(conn, payload_sql: str, **columns: str) -> int:
    """A dead row whose payload (and any other json column) is made in the database."""
    names = "".join(f", {name}" for name in columns)
    values = "".join(f", ({value})::jsonb" for value in columns.values())
    return conn.execute(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, "
        f"last_error{names}) VALUES ('doc', 'd-1', 'Nested', ({payload_sql})::jsonb, 'dead', "
        f"'HTTP 400: too deep'{values}) RETURNING id"
    ).fetchone()[0]


async def test_the_detail_of_a_payload_nested_15000_deep_shows_it_read_only(conn, dsn):
    seed(conn, 2)
    # PostgreSQL before 18 parses a jsonb this deep only with more stack than its default
    # 2MB (`stack depth limit exceeded`); the test's superuser raises it for the insert.
    conn.execute("SET max_stack_depth = '7MB'")
    message_id = _dead_row(
        conn,
        f"repeat('[', {DEEP}) || '\"core\"' || repeat(']', {DEEP})",
        headers="repeat('{\"h\": ', 2000) || '1' || repeat('}', 2000)",
        errors=f"repeat('[', {DEEP}) || repeat(']', {DEEP})",
    )
    app = _app(dsn, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await until(pilot, lambda: "Nested" in screen_text(app), "the dead list")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail")
        assert app.screen.message_id == message_id
        await until(pilot, lambda: app.screen.detail is not None, "the message")
        _show_payload(app)
        await until(pilot, lambda: "nested 15,000 deep" in screen_text(app), "the payload")
        text = screen_text(app)
        assert f"levels past {MAX_LAYOUT_DEPTH} on one line" in text
        lines = [line.strip() for line in text.splitlines()]
        # Laid out a level a line, then the rest kept on one line (folded at the pane's edge).
        assert lines.count("[") >= 20 and any(line.startswith("[[[[[[[[") for line in lines)
        _show_top(app)
        await until(pilot, lambda: '{"h": {"h":' in screen_text(app), "the headers")
        assert "HTTP 400: too deep" in screen_text(app)  # the rest of the message is all there
        # A deep header: its text, not decoded, and no more than a screenful of it.
        assert "… (14,001 characters)" in screen_text(app)  # 2,000 times `{"h": `, 1, `}`
        detail = app.screen.detail
        assert detail is not None and detail.payload_bytes == 2 * DEEP + len('"core"')
        assert isinstance(detail.columns["errors"], str)  # too deep to decode: shown as text
        # The screen goes on working: back to the list and in again.
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DetailScreen), "the list")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail again")
        await until(pilot, lambda: app.screen.detail is not None, "the message again")
        _show_payload(app)
        await until(pilot, lambda: "nested 15,000 deep" in screen_text(app), "the payload again")


def _show_payload(app) -> None:
    screen = app.screen
    screen.query_one(VerticalScroll).scroll_to_widget(
        screen.query_one("#payload"), animate=False, top=True
    )


def _show_top(app) -> None:
    app.screen.query_one(VerticalScroll).scroll_home(animate=False)


async def test_a_large_payload_is_shown_from_its_first_characters(conn, dsn):
    message_id = _dead_row(conn, "jsonb_build_object('blob', repeat('x', 3000000))")
    app = _app(dsn, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(DetailScreen(message_id))
        note = f"the first {PAYLOAD_PREVIEW:,} characters of 3,000,012 bytes"
        await until(pilot, lambda: note in screen_text(app), "the bounded payload")
        detail = app.screen.detail
        assert detail is not None and detail.payload_text is not None
        assert len(detail.payload_text) == PAYLOAD_PREVIEW
        assert detail.payload_text.startswith('{"blob": "xxx')


async def test_an_ordinary_payload_is_laid_out_as_postgresql_keeps_it(conn, dsn):
    payload = {"order": "o-1", "lines": [{"sku": "BK-42", "qty": 2}], "empty": {}, "z": None}
    message_id = _dead_row(conn, "'null'", headers='\'{"trace": "t-1"}\'')
    conn.execute("UPDATE outbox SET payload = %s::jsonb WHERE id = %s",
                 (json.dumps(payload), message_id))  # fmt: skip
    app = _app(dsn, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await app.push_screen(DetailScreen(message_id))
        await until(pilot, lambda: '"sku": "BK-42"' in screen_text(app), "the payload")
        text = screen_text(app)
        assert "nested" not in text and "first" not in text  # no note: shown whole
        assert '"qty": 2,' in text and '"lines": [' in text and '"empty": {},' in text
        assert '{"trace": "t-1"}' in text


# -- the layout, without a screen -----------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1, "b": [1, 2.5, {}], "c": {"d": 'x, y: "z" [', "e": []}, "f": None},
        [],
        "plain",
        [[[1], [True, False]]],
    ],
)
def test_layout_writes_shallow_values_as_json_indented_does(value):
    assert layout(json.dumps(value)) == json.dumps(value, indent=2)


def test_layout_keeps_levels_past_the_bound_on_one_line_and_never_recurses():
    assert layout("[[[[1, 2]]]]", max_depth=2) == "[\n  [\n    [[1, 2]]\n  ]\n]"
    deep = "[" * DEEP + "]" * DEEP
    laid_out = layout(deep)
    assert laid_out.count("\n") == 2 * MAX_LAYOUT_DEPTH
    assert laid_out.replace("\n", "").replace(" ", "") == deep


def test_layout_takes_a_text_cut_short():
    assert layout('{"a": [1, "bc') == '{\n  "a": [\n    1,\n    "bc'


def test_decoding_is_refused_past_a_depth_instead_of_recursing():
    assert nesting_depth('{"a": "[[[[", "b": [[1]]}') == 3  # brackets in strings do not count
    with pytest.raises(ValueError, match="nested 15000 deep"):
        loads_bounded("[" * DEEP + "]" * DEEP)
    assert loads_bounded('[{"at": 1}]') == [{"at": 1}]
