"""What the README and docs/tui.md say an outage looks like matches what the breaker does
(docs/protocol.md, docs/monitoring.md): the destination opens, its messages wait unsent with
their attempts refunded, so `retrying` stays near zero and the oldest unfinished age is the
one to page on. They once said the ready age stays low and `retrying` grows."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("doc", ["README.md", "docs/tui.md", "docs/protocol.md"])
def test_an_outage_is_described_as_the_breaker_makes_it(doc):
    text = " ".join((ROOT / doc).read_text().split())
    for wrong in (
        "the ready age then stays low while the unfinished age and retrying grow",
        "so messages failing against a downstream barely move it",
        "`retrying` (messages in backoff) show an outage",
        "Messages in backoff are not ready: an outage barely moves it",
    ):
        assert wrong not in text, f"{doc}: {wrong}"
    if doc != "docs/protocol.md":
        assert "retrying` stays near zero" in text or "*retrying* stays near zero" in text, doc
        assert "page on" in text, doc
