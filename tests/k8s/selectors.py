"""Label selectors, field selectors and the small JSONPath that printer columns use."""

from __future__ import annotations

import re
from typing import Any

JSON = dict[str, Any]

_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current)
    return terms


def match_labels(selector: str | None, labels: dict[str, str]) -> bool:
    """Whether `labels` satisfy a label selector string (`a=b,c!=d,e in (f,g),!h,i`)."""
    for term in _split_terms(selector or ""):
        term = term.strip()
        if not term:
            continue
        if found := _SET_TERM.match(term):
            key, op, values = found.groups()
            choices = {v.strip() for v in values.split(",")}
            if (labels.get(key) in choices) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.split("==" if "==" in term else "=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def selector_string(selector: JSON | None) -> str:
    """A LabelSelector object written as the string form (the Scale's `status.selector`)."""
    if not selector:
        return ""
    terms = [f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())]
    for expression in selector.get("matchExpressions", []):
        key, op = expression["key"], expression["operator"]
        values = ",".join(expression.get("values", []))
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[op]
        )
    return ",".join(terms)


def match_fields(selector: str | None, obj: JSON) -> bool:
    """Field selectors by dotted path (`metadata.name=x,involvedObject.uid=y`)."""
    for term in _split_terms(selector or ""):
        if not term.strip():
            continue
        negate = "!=" in term
        key, value = (s.strip() for s in re.split(r"!=|==|=", term, maxsplit=1))
        actual: Any = obj
        for part in key.split("."):
            actual = actual.get(part) if isinstance(actual, dict) else None
        actual = "" if actual is None else str(actual)
        if (actual == value) == negate:
            return False
    return True


_TOKEN = re.compile(
    r"\.([A-Za-z0-9_\-]+)|\[(\d+|\*)\]|\[\?\(@\.([\w.\-]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]"
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """The values a printer-column JSONPath selects (`.a.b`, `[0]`, `[*]`, `[?(@.k=="v")]`)."""
    values = [obj]
    path = path.strip().removeprefix("{").removesuffix("}").removeprefix("$")
    position = 0
    while position < len(path):
        token = _TOKEN.match(path, position)
        if token is None:
            raise ValueError(f"unsupported JSONPath: {path}")
        position = token.end()
        key, index, filter_key, filter_value = token.groups()
        selected: list[Any] = []
        for value in values:
            if key is not None and isinstance(value, dict) and key in value:
                selected.append(value[key])
            elif index is not None and isinstance(value, list):
                if index == "*":
                    selected.extend(value)
                elif int(index) < len(value):
                    selected.append(value[int(index)])
            elif filter_key is not None and isinstance(value, list):
                for item in value:
                    found: Any = item
                    for part in filter_key.split("."):
                        found = found.get(part) if isinstance(found, dict) else None
                    if found is not None and str(found) == filter_value:
                        selected.append(item)
        values = selected
    return values
