"""One description per publisher (outbox.publisher_options): the built-in publishers'
options name the fields of their blocks in the CRD, each of the shape its carriage needs,
the docs' option tables are generated from them, and a publisher's table can be printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox.controller.defaults import PUBLISHER_TYPES
from outbox.publisher_options import INVALID_PUBLISHER_OPTIONS, PLUGIN, Carried, Option, installed

ROOT = Path(__file__).resolve().parent.parent
CRD = yaml.safe_load((ROOT / "crds" / "outboxdispatchers.yaml").read_text())
PUBLISHER = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
    "properties"
]["publisher"]["properties"]
BUILT_IN = [kind for kind in PUBLISHER_TYPES if kind != PLUGIN]
# The blocks' fields that set the worker's own settings, not the publisher's options.
WORKER_FIELDS = {"timeout": "--publish-timeout"}
SECRET_NAME = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


def _shape_fits(carried: Carried, schema: dict[str, Any]) -> bool:
    match carried:
        case Carried.VALUE:
            return schema.get("type") == "string"
        case Carried.LINES:
            return schema.get("type") == "array" and schema["items"].get("type") == "string"
        case Carried.PAIRS:
            return schema.get("additionalProperties", {}).get("type") == "string"
        case Carried.SECRET_KEY | Carried.SECRET_FILE:
            return schema.get("required") == ["name", "key"] and (
                schema["properties"]["name"]["pattern"] == SECRET_NAME
            )
        case Carried.SECRET_DIR:
            return schema.get("pattern") == SECRET_NAME


@pytest.mark.parametrize("kind", BUILT_IN)
def test_each_built_in_block_of_the_crd_is_its_publishers_description(kind: str) -> None:
    block = (PUBLISHER.get(kind) or {}).get("properties") or {}
    bindings = installed(kind).bindings(kind)
    described = {field.path for _, field in bindings}
    assert set(block) - set(WORKER_FIELDS) == described
    for option, field in bindings:
        assert _shape_fits(field.carried, block[field.path]), (option.flag, field.path)
        # A secret option is never set from a plain field of the resource.
        assert field.carried.secret or not option.secret or field.carried is Carried.PAIRS


def test_only_the_plugin_block_sets_a_publisher_without_a_block_of_its_own() -> None:
    plugin = PUBLISHER[PLUGIN]["properties"]
    assert set(plugin) == {"name", "options", "secretRefs", *WORKER_FIELDS}
    # A built-in has a block exactly when its options name fields there (null and log: none).
    for kind in BUILT_IN:
        assert (kind in PUBLISHER) == any(o.fields for o in installed(kind).options), kind


def test_the_docs_option_tables_are_generated_from_the_descriptions() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "publisher_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_a_publishers_table_is_printed_by_name_and_an_unknown_one_is_one_line() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "outbox.publisher_options", "kafka"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "`config` (a map, one KEY=VALUE a line), `configSecretRef`" in shown.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "outbox.publisher_options", "sqs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (unknown.returncode, unknown.stderr) == (2, "error: no publisher 'sqs' is installed\n")


# -- a Secret's value for an option, read by the option's own description -------------------

GOOD_KEY = "whsec_" + "A" * 32  # 24 bytes of base64


def _refused(option: Option, text: str) -> str:
    with pytest.raises(ValueError) as caught:
        option.from_secret(text)
    return str(caught.value)


def test_a_secrets_value_is_read_as_the_worker_reads_the_options_variable() -> None:
    signing = installed("http").option("http-signing-secret")
    assert signing is not None and signing.refused_as == "InvalidSigningSecret"
    # One value a line, blank lines skipped (a trailing newline, a gap while rotating).
    assert len(signing.from_secret(f"{GOOD_KEY}\n\n{GOOD_KEY}\n")) == 2
    refused = _refused(signing, f"{GOOD_KEY}\nsk_live_0123456789abcdefHunter2\n")
    assert refused == "line 2: a signing secret starts with 'whsec_' followed by base64"
    # A Secret named for the option that gives it nothing would start the worker unsigned.
    assert _refused(signing, "\n") == "no value for --http-signing-secret"


def test_any_other_option_is_refused_under_the_generic_reason_never_quoting_the_value() -> None:
    header = installed("http").option("http-header")
    assert header is not None and header.refused_as == INVALID_PUBLISHER_OPTIONS
    assert header.from_secret("Authorization: Bearer t0ken\n") == [
        ("Authorization", "Bearer t0ken")
    ]
    assert _refused(header, "Authorization: Bearer t0ken\nBearer t0ken") == (
        "line 2: expected 'Name: value'"
    )

    # A plugin's converter may raise anything and quote what it was given: masked all the same.
    def strict(text: str) -> str:
        raise KeyError(f"unknown region {text}")

    region = Option("--sqs-region", "region", convert=strict)
    refused = _refused(region, "eu-hidden-1")
    assert "KeyError" in refused and "eu-hidden-1" not in refused
    assert not refused.startswith("line")  # one value: the whole text, no line to name
