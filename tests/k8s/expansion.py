"""Kubernetes' `$(VAR)` expansion, as the kubelet applies it to a container's `command`,
`args` and `env[].value` (k8s.io/kubernetes third_party/forked/golang/expansion), so that
the local kubelet and the tests see what a real node would run:

- `$(NAME)` is the value of NAME when the mapping has it, else left as written; the name is
  everything up to the next `)`, whatever its characters;
- `$$` is one literal `$` (how a value says `$(NAME)` without expanding it);
- a `$` before anything else, or at the very end, or a `$(` without its `)`, stays as it is.

The mapping of an `env[].value` is the variables declared before it (and `envFrom`'s);
that of `command` and `args` is the container's whole environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def expand(text: str, mapping: Mapping[str, str]) -> str:
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":  # escaped: one literal `$`
                out.append("$")
                advance = 1
            elif rest[0] == "(" and (end := rest.find(")", 1)) != -1:
                name = rest[1:end]
                out.append(mapping.get(name, f"$({name})"))
                advance = end + 1
            elif rest[0] == "(":  # an incomplete reference: `$(` as written
                out.append("$(")
                advance = 1
            else:  # not an expression: `$` and the character after it
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def container_environment(
    container: Mapping[str, Any], values_from: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The environment and the command line a real kubelet gives `container`'s process:
    each `env[].value` expanded from the variables declared before it, each `valueFrom`
    taken from `values_from` by the variable's name (as a Secret's key or a field would give
    it), then `command` and `args` expanded from the whole environment."""
    env: dict[str, str] = {}
    for item in container.get("env") or ():
        name = item["name"]
        env[name] = expand(item["value"], env) if "value" in item else values_from[name]
    argv = [*(container.get("command") or ()), *(container.get("args") or ())]
    return env, [expand(str(part), env) for part in argv]
