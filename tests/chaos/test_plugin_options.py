"""A plugin may reuse a built-in publisher's options: the chaos suite's crashing publisher
is the http publisher with one more behaviour, and declares the same --http-url."""

from __future__ import annotations

import pytest

from outbox.worker.settings import load_settings

pytestmark = pytest.mark.chaos


def test_a_plugin_that_reuses_the_http_options_loads_and_reads_them():
    # This used to fail inside argparse ("conflicting option string: --http-url").
    settings = load_settings(
        ["--publisher", "chaos.plugins:CrashingHttpPublisher", "--http-url", "http://h/e"], {}
    )
    assert settings.publisher_options["http_url"] == "http://h/e"
