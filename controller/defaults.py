"""The operator's defaults for the resources' fields (--worker-defaults,
--publisher-defaults), checked as the CRD checks a resource's: the workers' env and pod are
rendered from them without the API server seeing them first. The CRD's enums and patterns
they share are kept here, and tests compare them with the CRD.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

# spec.worker's fields the admin may give defaults for (applied when a resource omits the
# field; an admin's choice, so not held to the pod policy that binds resource authors).
WORKER_DEFAULT_FIELDS = (
    "resources",
    "imagePullSecrets",
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "tracing",
)
# spec.worker.tracing, as the CRD has it (tests/test_tracing_crd.py compares): the collector's
# OTLP/HTTP URL without credentials, and what the stored context is to a span (the worker's
# --otel-parent choices).
# Printable ASCII written out (no \s): the API server's RE2 and Python read it alike.
TRACING_ENDPOINT = re.compile(
    r"^https?://[\x21\x22\x24-\x2e\x30-\x3e\x41-\x7e]+(/[\x21\x22\x24-\x3e\x40-\x7e]*)?$"
)
TRACING_PARENTS = ("link", "parent")
TRACING_FIELDS = ("endpoint", "parent", "samplingRatio", "serviceName")
# spec.publisher's wire format fields the admin may give defaults for (--publisher-defaults),
# as the CRD has them (tests/chart/test_publisher_defaults.py compares): the format's enum,
# and the CloudEvents source's pattern (printable ASCII, no spaces) and length.
PUBLISHER_FORMATS = ("envelope", "cloudevents-binary", "cloudevents-structured")
CLOUDEVENTS_SOURCE = re.compile(r"^[\x21-\x7e]+$")
CLOUDEVENTS_SOURCE_MAX_LENGTH = 1024
PUBLISHER_DEFAULT_FIELDS = ("format", "cloudEventsSource")
# spec.publisher.type's enum and a resource quantity's pattern, as the CRD has them (the same
# test compares): the built-in publishers, which have a block of their own, and `plugin`,
# the generic block any other publisher is set by; and what --worker-defaults' resources
# may ask for (the API server refused a bad quantity only when each Deployment was written).
PUBLISHER_TYPES = ("null", "log", "http", "nats", "kafka", "plugin")
QUANTITY = re.compile(
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


_MAPS = ("nodeSelector",)
_LISTS = ("imagePullSecrets", "tolerations", "topologySpreadConstraints")


def _fields_of(section: str, text: str, fields: Sequence[str]) -> dict[str, Any]:
    """A JSON object of some of `section`'s fields (an operator's defaults for them)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    except RecursionError:  # the parser recurses once per level: `[[[[...` thousands deep
        raise ValueError("not JSON this program reads (nested too deeply)") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object of {section} fields")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not one of {', '.join(fields)}")
    return value


def worker_defaults(text: str) -> Mapping[str, Any]:
    """A JSON object of spec.worker fields (WORKER_DEFAULT_FIELDS), each of its shape; the
    API server checks the rest when the workers' Deployment is written."""
    value = _fields_of("spec.worker", text, WORKER_DEFAULT_FIELDS)
    for key, item in value.items():
        if key in _LISTS and not (
            isinstance(item, list) and all(isinstance(i, dict) for i in item)
        ):
            raise ValueError(f"{key}: expected a list of objects")
        if key in _MAPS and not (
            isinstance(item, dict) and all(isinstance(v, str) for v in item.values())
        ):
            raise ValueError(f"{key}: expected an object of strings")
        if key in ("resources", "affinity") and not isinstance(item, dict):
            raise ValueError(f"{key}: expected an object")
        if key == "resources":
            _resources(item)
        if key == "priorityClassName" and not (isinstance(item, str) and NAME.match(item)):
            raise ValueError("priorityClassName: expected a priority class's name")
        if key == "tracing":
            _tracing(item)
    return value


def _resources(item: Mapping[str, Any]) -> None:
    if not set(item) <= {"requests", "limits"}:
        raise ValueError("resources: expected requests and limits only")
    for part, amounts in item.items():
        if not isinstance(amounts, dict):
            raise ValueError(f"resources.{part}: expected an object of quantities")
        for name, amount in amounts.items():
            if not _quantity(amount):
                raise ValueError(
                    f"resources.{part}.{name}: expected a quantity (100m, 0.5, 128Mi, 1G)"
                )


def _quantity(amount: Any) -> bool:
    if isinstance(amount, bool):  # JSON true is no number of anything
        return False
    if isinstance(amount, int):
        return amount >= 0
    return isinstance(amount, str) and QUANTITY.match(amount) is not None


def _tracing(item: Any) -> None:
    """spec.worker.tracing's shape and ranges, as the CRD checks a resource's: the workers'
    env is rendered from it without the API server seeing it first."""
    if not isinstance(item, dict):
        raise ValueError("tracing: expected an object")
    unknown = sorted(set(item) - set(TRACING_FIELDS))
    if unknown:
        raise ValueError(f"tracing: {', '.join(unknown)}: not one of {', '.join(TRACING_FIELDS)}")
    endpoint = item.get("endpoint")
    if not (
        isinstance(endpoint, str) and len(endpoint) <= 2048 and TRACING_ENDPOINT.match(endpoint)
    ):
        # The value is not quoted back: a URL given with credentials would be shown.
        raise ValueError(
            "tracing.endpoint: expected an http:// or https:// URL without credentials"
        )
    if "parent" in item and item["parent"] not in TRACING_PARENTS:
        raise ValueError(f"tracing.parent: expected one of {', '.join(TRACING_PARENTS)}")
    ratio = item.get("samplingRatio", 0)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        raise ValueError("tracing.samplingRatio: expected a number from 0 to 1")
    name = item.get("serviceName", "x")
    if not (isinstance(name, str) and 1 <= len(name) <= 253):
        raise ValueError("tracing.serviceName: expected a name of 1 to 253 characters")


def publisher_defaults(text: str) -> Mapping[str, Any]:
    """A JSON object of spec.publisher's wire format fields, checked as the CRD checks a
    resource's: the workers' env is rendered from it without the API server seeing it."""
    value = _fields_of("spec.publisher", text, PUBLISHER_DEFAULT_FIELDS)
    if "format" in value and value["format"] not in PUBLISHER_FORMATS:
        raise ValueError(f"format: expected one of {', '.join(PUBLISHER_FORMATS)}")
    if "cloudEventsSource" in value:
        source = value["cloudEventsSource"]
        if not (
            isinstance(source, str)
            and len(source) <= CLOUDEVENTS_SOURCE_MAX_LENGTH
            and CLOUDEVENTS_SOURCE.match(source)
        ):
            raise ValueError(
                "cloudEventsSource: expected a URI-reference of 1 to "
                f"{CLOUDEVENTS_SOURCE_MAX_LENGTH} printable ASCII characters, no spaces"
            )
    return value
