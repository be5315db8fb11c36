"""The operator's JSON flags given JSON nested deeper than Python's parser recurses: they
failed with a RecursionError traceback, exit 1. Now one line naming the flag, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

DEEP = '{"a":' * 5000 + "1" + "}" * 5000
ENV = {"POD_NAMESPACE": "outbox-system", "POD_NAME": "outbox-controller-abc"}


@pytest.mark.parametrize(
    "flag", ["--worker-defaults", "--publisher-defaults", "--worker-metrics-from"]
)
def test_json_nested_too_deeply_is_one_line_and_exit_2(flag: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outbox.controller", flag, DEEP],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stderr[-2000:]
    assert result.stderr == (
        f"outbox-controller: error: {flag}: not JSON this program reads (nested too deeply)\n"
    )
