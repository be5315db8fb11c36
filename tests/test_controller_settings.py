"""The operator's settings: flags, OUTBOX_* variables, one-line errors with exit code 2."""

from __future__ import annotations

import itertools
import subprocess
import sys
from datetime import timedelta

import pytest

from outbox.controller.settings import ControllerSettings, installed_publishers, load_settings
from outbox.plumbing.errors import SettingError

ENV = {"POD_NAMESPACE": "outbox-system", "POD_NAME": "outbox-controller-abc"}


def test_defaults() -> None:
    settings = load_settings([], ENV)
    assert settings.namespaces == ()
    assert settings.health_port == 8080
    assert settings.leader_election_namespace == "outbox-system"
    assert settings.leader_election_id == "outbox-controller"
    assert settings.leader_identity == "outbox-controller-abc"
    assert settings.worker_publishers == installed_publishers()
    assert {"http", "log", "null"} <= set(settings.worker_publishers)


def test_flags_and_variables() -> None:
    settings = load_settings(
        ["--namespace", "shop", "--namespace", "billing", "--lease-duration", "6s"],
        {
            **ENV,
            "OUTBOX_HEALTH_PORT": "9100",
            "OUTBOX_RENEW_DEADLINE": "4s",
            "OUTBOX_RETRY_PERIOD": "500ms",
            "OUTBOX_WORKER_PUBLISHERS": "log,http",
        },
    )
    assert settings.namespaces == ("shop", "billing")
    assert settings.health_port == 9100
    assert (settings.lease_duration, settings.renew_deadline) == (
        timedelta(seconds=6),
        timedelta(seconds=4),
    )
    assert settings.retry_period == timedelta(milliseconds=500)
    assert settings.worker_publishers == ("log", "http")
    from_env = load_settings([], {**ENV, "OUTBOX_NAMESPACE": "a, b"})
    assert from_env.namespaces == ("a", "b")


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--health-port", "70000"], ENV, "--health-port"),
        (["--namespace", "Bad_Name"], ENV, "--namespace"),
        ([], {}, "--leader-election-namespace"),
        (["--renew-deadline", "20s"], ENV, "--renew-deadline"),
        (["--retry-period", "10s"], ENV, "--retry-period"),
        (["--lease-duration", "soon"], ENV, "--lease-duration"),
        ([], {**ENV, "OUTBOX_LOG_LEVEL": "LOUD"}, "OUTBOX_LOG_LEVEL"),
        (["--worker-publishers", "http,kafak"], ENV, "--worker-publishers: 'kafak' is no"),
    ],
)
def test_bad_settings_name_themselves(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingError, match=names):
        load_settings(argv, env)


def test_the_model_is_frozen_and_every_field_is_documented() -> None:
    import ast
    import inspect

    from outbox.controller import settings as module

    tree = ast.parse(inspect.getsource(module.ControllerSettings))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        node.target.id
        for node, after in itertools.pairwise(body)
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
    }
    fields = set(ControllerSettings.__dataclass_fields__)
    assert fields == documented
    with pytest.raises(AttributeError):
        ControllerSettings().health_port = 1  # type: ignore[misc]


def test_the_command_says_what_is_wrong_in_one_line_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outbox.controller", "--health-port", "x"],
        capture_output=True,
        text=True,
        env={"POD_NAMESPACE": "ns", "PATH": ""},
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--health-port" in result.stderr
