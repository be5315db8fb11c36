"""The checks of names, labels and annotations every API server applies, worded as it does.

A label value longer than 63 characters (an operator that copies a long resource name into a
label), a label key with a space, an environment variable name starting with a digit: a real
server refuses them with 422, so the emulator does too.
"""

from __future__ import annotations

import re
from typing import Any

from .validation import FieldError

JSON = dict[str, Any]

_QUALIFIED = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_ENV_NAME = "[-._a-zA-Z][-._a-zA-Z0-9]*"


def _key_errors(field: str, key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    problems = []
    if prefix and (len(prefix) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, prefix)):
        problems.append(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case "
            "alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character"
        )
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    elif not re.fullmatch(_QUALIFIED, name):
        problems.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'MyName',"
            "  or 'my.name',  or '123-abc', regex used for validation is "
            f"'{_QUALIFIED}')"
        )
    return problems


def check_meta(meta: JSON, path: str) -> list[FieldError]:
    """Labels (keys and values) and annotation keys of one ObjectMeta at `path`."""
    errors = []
    for key, value in (meta.get("labels") or {}).items():
        for problem in _key_errors(f"{path}.labels", key):
            errors.append(FieldError(f"{path}.labels", "FieldValueInvalid", problem, key))
        value = str(value)
        if len(value) > 63:
            errors.append(
                FieldError(
                    f"{path}.labels",
                    "FieldValueInvalid",
                    "must be no more than 63 characters",
                    value,
                )
            )
        elif not re.fullmatch(_LABEL_VALUE, value):
            errors.append(
                FieldError(
                    f"{path}.labels",
                    "FieldValueInvalid",
                    "a valid label must be an empty string or consist of alphanumeric characters, "
                    "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
                    "'MyValue',  or 'my_value',  or '12345', regex used for validation is "
                    f"'{_LABEL_VALUE}')",
                    value,
                )
            )
    for key in meta.get("annotations") or {}:
        for problem in _key_errors(f"{path}.annotations", key):
            errors.append(FieldError(f"{path}.annotations", "FieldValueInvalid", problem, key))
    return errors


def check_pod_spec(spec: JSON, path: str) -> list[FieldError]:
    """Container names, port names and environment variable names of a pod spec."""
    errors = []
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(kind) or []):
            where = f"{path}.{kind}[{index}]"
            name = str(container.get("name", ""))
            if name and (len(name) > 63 or not re.fullmatch(_DNS_LABEL, name)):
                errors.append(
                    FieldError(
                        f"{where}.name",
                        "FieldValueInvalid",
                        "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                        "characters or '-', and must start and end with an alphanumeric character",
                        name,
                    )
                )
            for number, port in enumerate(container.get("ports") or []):
                port_name = port.get("name")
                if port_name is not None and (
                    len(port_name) > 15
                    or not re.fullmatch("[a-z0-9]([-a-z0-9]*[a-z0-9])?", port_name)
                    or not re.search("[a-z]", port_name)
                    or "--" in port_name
                ):
                    errors.append(
                        FieldError(
                            f"{where}.ports[{number}].name",
                            "FieldValueInvalid",
                            "must be no more than 15 characters, contain only lowercase "
                            "alphanumeric characters or '-', at least one letter, and no '--'",
                            port_name,
                        )
                    )
            for number, variable in enumerate(container.get("env") or []):
                env_name = str(variable.get("name", ""))
                if not re.fullmatch(_ENV_NAME, env_name):
                    errors.append(
                        FieldError(
                            f"{where}.env[{number}].name",
                            "FieldValueInvalid",
                            "a valid environment variable name must consist of alphabetic "
                            "characters, digits, '_', '-', or '.', and must not start with a digit",
                            env_name,
                        )
                    )
    return errors
