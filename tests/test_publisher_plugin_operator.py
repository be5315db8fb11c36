"""A publisher is added by one description. The plugin in tests/publisher_plugin, written
against the plugin API alone (a name and a tuple of `Option`), is rendered by the operator
from the resource's generic block, checked by its consent and policy rules, admitted or
refused by the CRD, documented, and delivered by the workers the operator renders; no other
file of the project names it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from chart.chart import crd_schema, custom_resource_errors
from helpers import seed, wait_until
from workers import stop_worker

from outbox.controller.consent import secret_uses
from outbox.controller.policy import violations
from outbox.controller.render import render_deployment
from outbox.controller.settings import ControllerSettings, load_settings
from outbox.controller.spec import DispatcherSpec
from outbox.publisher_options import Carried, describe, installed, options_table

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = Path(__file__).resolve().parent / "publisher_plugin"
SEAL = {"name": "owlpost-seal", "key": "seal"}


@pytest.fixture
def owlpost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin installed, as its own package would be: on the path, with its entry point."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))


def dispatcher(**plugin: Any) -> dict[str, Any]:
    block = {
        "name": "owlpost",
        "options": {"owlpost-roost": "/var/roost", "owlpost-tag": "red\nfast"},
        "secretRefs": {"owlpost-seal": SEAL},
        **plugin,
    }
    body: dict[str, Any] = {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "generation": 1},
        "spec": {
            "database": {"dsnSecretRef": {"name": "orders-db"}},
            "publisher": {"type": "plugin", "plugin": {k: v for k, v in block.items() if v}},
        },
    }
    crd_schema().default(body)  # as the API server stores it
    return body


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def render(body: dict[str, Any]) -> dict[str, Any]:
    return render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="outbox-dispatcher:test"
    )


def test_the_plugin_is_described_by_its_options_alone(owlpost: None) -> None:
    from outbox_owlpost import OwlPostPublisher

    description = installed("owlpost")
    assert description == describe(OwlPostPublisher)
    assert [option.key for option in description.options] == [
        "owlpost-roost",
        "owlpost-seal",
        "owlpost-tag",
    ]
    # A secret option comes from a Secret only; the others from either.
    fields: dict[str, list[tuple[str, Carried]]] = {}
    for option, field in description.bindings("plugin"):
        fields.setdefault(option.key, []).append((field.path, field.carried))
    assert fields == {
        "owlpost-roost": [
            ("options.owlpost-roost", Carried.VALUE),
            ("secretRefs.owlpost-roost", Carried.SECRET_KEY),
        ],
        "owlpost-seal": [("secretRefs.owlpost-seal", Carried.SECRET_KEY)],
        "owlpost-tag": [
            ("options.owlpost-tag", Carried.VALUE),
            ("secretRefs.owlpost-tag", Carried.SECRET_KEY),
        ],
    }


def test_the_plugin_is_documented_from_its_description(owlpost: None) -> None:
    table = options_table(installed("owlpost"), "plugin").splitlines()
    assert table[0].startswith("| flag (env) | `spec.publisher.plugin` |")
    [seal] = [row for row in table if row.startswith("| `--owlpost-seal`")]
    assert "`OUTBOX_OWLPOST_SEAL`" in seal and "(secret)" in seal and "required" in seal
    assert "`secretRefs.owlpost-seal` (a Secret key, never copied)" in seal
    assert "options.owlpost-seal" not in seal


def test_the_crd_admits_the_generic_block_and_the_operator_renders_it(owlpost: None) -> None:
    body = dispatcher()
    assert custom_resource_errors(body) == []
    deployment = render(body)
    env = env_of(deployment)
    assert env["OUTBOX_PUBLISHER"] == "owlpost"
    assert env["OUTBOX_OWLPOST_ROOST"] == "/var/roost"
    assert env["OUTBOX_OWLPOST_TAG"] == "red\nfast"
    assert env["OUTBOX_OWLPOST_SEAL"] == {"secretKeyRef": SEAL}  # never copied
    assert env["OUTBOX_PUBLISH_TIMEOUT"] == "10s"  # the block's timeout, the CRD's default
    kubernetes_validate.validate(deployment, "1.30", strict=True)


async def test_the_workers_the_operator_renders_deliver_through_the_plugin(
    owlpost: None, conn: Any, dsn: str, tmp_path: Path
) -> None:
    """The rendered environment, the Secrets' values filled in as the kubelet would, runs a
    real worker that delivers every message through the plugin."""
    roost = tmp_path / "roost"
    ids = seed(conn, 5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    secrets = {"OUTBOX_DSN": dsn, "OUTBOX_OWLPOST_SEAL": "seal-42"}
    for name, value in env_of(render(dispatcher(options={"owlpost-roost": str(roost)}))).items():
        if isinstance(value, str):
            env[name] = value
        elif "secretKeyRef" in value:
            env[name] = secrets[name]
        else:
            env[name] = "orders-worker-abc12"  # fieldRef metadata.name
    env["PYTHONPATH"] = str(PLUGIN_DIR)
    del env["OUTBOX_METRICS_PORT"]  # a free machine's port 9000 is not ours to take
    proc = subprocess.Popen([sys.executable, "-m", "outbox.worker"], env=env)
    try:
        await wait_until(lambda: roost.exists() and len(roost.read_text().splitlines()) == 5)
    finally:
        assert stop_worker(proc) == 0
    assert sorted(roost.read_text().splitlines()) == sorted(f"{i} seal-42" for i in ids)


def test_consent_covers_every_secret_ref_of_the_block(owlpost: None) -> None:
    spec = dispatcher(secretRefs={"owlpost-seal": SEAL, "owlpost-roost": {"name": "l", "key": "k"}})
    assert [(use.field, use.name) for use in secret_uses(spec["spec"])] == [
        ("spec.database.dsnSecretRef", "orders-db"),
        ("spec.publisher.plugin.secretRefs.owlpost-roost", "l"),
        ("spec.publisher.plugin.secretRefs.owlpost-seal", "owlpost-seal"),
    ]


def test_the_policy_passes_it_and_the_operator_knows_it_is_installed(owlpost: None) -> None:
    body = dispatcher()
    assert violations(body["spec"], ControllerSettings(worker_image="i:1"), "orders") == []
    assert DispatcherSpec.parse(body).problems == ()
    assert DispatcherSpec.parse(body).publisher_type == "owlpost"
    settings = load_settings(["--worker-publishers", "http,owlpost"], {"POD_NAMESPACE": "o"})
    assert settings.worker_publishers == ("http", "owlpost")


@pytest.mark.parametrize(
    ("plugin", "said"),
    [
        (
            {"options": {"owlpost-roost": "/l", "owlpost-seal": "hunter2"}},
            "spec.publisher.plugin.options.owlpost-seal: --owlpost-seal is a secret: give it in "
            "secretRefs (a Secret key), never in the resource",
        ),
        (
            {"options": {"owlpost-roost": "/l", "owlpost-wings": "2"}},
            "spec.publisher.plugin.options.owlpost-wings: owlpost has no option --owlpost-wings",
        ),
        (
            {"options": {"owlpost-tag": "red"}},
            "spec.publisher.plugin: owlpost requires --owlpost-roost",
        ),
        (
            {"secretRefs": {"owlpost-seal": SEAL, "owlpost-roost": SEAL}},
            "spec.publisher.plugin: give options.owlpost-roost or secretRefs.owlpost-roost, "
            "not both",
        ),
    ],
)
def test_the_block_is_checked_against_the_plugins_description(
    owlpost: None, plugin: dict[str, Any], said: str
) -> None:
    body = dispatcher(**plugin)
    assert custom_resource_errors(body) == []  # the CRD cannot know a plugin's options
    [problem] = DispatcherSpec.parse(body).problems
    assert problem.reason == "InvalidPublisherOptions"
    assert said in problem.message.split("; ")
    assert "hunter2" not in problem.message


def test_a_plugin_not_installed_is_unavailable() -> None:
    body = dispatcher(name="albatross")
    [problem] = DispatcherSpec.parse(body).problems
    assert problem.reason == "PublisherUnavailable"
    assert "albatross" in problem.message


@pytest.mark.parametrize(
    ("publisher", "refused"),
    [
        ({"type": "plugin"}, "publisher.plugin is required when type is plugin"),
        (
            {"type": "log", "plugin": {"name": "owlpost"}},
            "publisher.plugin is required when type is plugin and not allowed otherwise",
        ),
        (
            {"type": "plugin", "plugin": {"name": "http"}},
            "a built-in publisher is set by its own block",
        ),
        ({"type": "plugin", "plugin": {"name": "Owlpost!"}}, "spec.publisher.plugin.name"),
        (
            {"type": "plugin", "plugin": {"name": "owlpost", "timeout": "90s"}},
            "lease must be longer than publisher.plugin.timeout",
        ),
        (
            {"type": "plugin", "plugin": {"name": "owlpost", "secretRefs": {"r": {"name": "x"}}}},
            "spec.publisher.plugin.secretRefs.r.key",
        ),
    ],
)
def test_the_crd_refuses_a_malformed_plugin_block(publisher: dict[str, Any], refused: str) -> None:
    body = copy.deepcopy(dispatcher())
    body["spec"]["publisher"] = publisher
    errors = custom_resource_errors(body)
    assert any(refused in error for error in errors), errors


def test_no_other_file_of_the_project_names_the_plugin() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    # The plugin, and the tests that install it (this one, and the operator's in k8s/).
    ours = {
        str(PLUGIN_DIR.relative_to(ROOT)),
        str(Path(__file__).relative_to(ROOT)),
        "tests/k8s/test_operator_plugin.py",
    }
    naming = []
    for name in filter(None, listed):
        if any(name == own or name.startswith(own + "/") for own in ours):
            continue
        path = ROOT / name
        if path.is_file() and "owlpost" in path.read_bytes().decode("utf-8", "replace").lower():
            naming.append(name)
    assert naming == []


def test_a_reference_in_a_plugin_option_reaches_the_worker_as_written(owlpost: None) -> None:
    """The route test_controller_render.py leaves to the plugin: the kubelet would expand
    $(OUTBOX_DSN) in an option's value; the worker gets the text instead."""
    from test_controller_render import REF, process_of

    body = dispatcher(options={"owlpost-roost": f"/var/{REF}", "owlpost-tag": REF})
    assert custom_resource_errors(body) == []
    env, argv = process_of(render(body))
    assert (env["OUTBOX_OWLPOST_ROOST"], env["OUTBOX_OWLPOST_TAG"]) == (f"/var/{REF}", REF)
    assert [name for name, value in env.items() if "hunter2" in value] == ["OUTBOX_DSN"]
    assert "hunter2" not in str(argv)


def test_the_operator_reads_a_plugins_secret_values_by_its_options(owlpost: None) -> None:
    publisher = DispatcherSpec.parse(dispatcher()).publisher
    [(option, ref)] = publisher.secret_keys()
    assert (option.flag, ref.name, ref.key) == ("--owlpost-seal", SEAL["name"], SEAL["key"])
    assert option.from_secret("wax") == ["wax"]
    with pytest.raises(ValueError, match=r"^no value for --owlpost-seal$"):
        option.from_secret("")
