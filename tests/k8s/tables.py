"""Server-side printing: the `Table` objects `kubectl get` asks for (`Accept: ...;as=Table`).

A CRD's `additionalPrinterColumns` are evaluated here, as the real server does (kubectl prints
what it is given), so a test of `kubectl get <custom resource>` sees the CRD's own columns.
Built-in kinds get the columns kubectl users know for the few kinds the tests print.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .selectors import jsonpath

if TYPE_CHECKING:
    from .emulator import ResourceType

JSON = dict[str, Any]


def human_duration(seconds: float) -> str:
    """apimachinery's HumanDuration: `45s`, `3m20s`, `2h10m`, `5d`."""
    if seconds < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"


def _age(timestamp: Any) -> str | None:
    if not isinstance(timestamp, str):
        return None
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())


def _ready(obj: JSON) -> str:
    status = obj.get("status", {})
    return f"{status.get('readyReplicas', 0)}/{obj.get('spec', {}).get('replicas', 0)}"


# Built-in columns: (name, type, cell function), the Age column excluded (always last).
_BUILTIN: dict[str, list[tuple[str, str, Callable[[JSON], Any]]]] = {
    "Deployment": [
        ("Ready", "string", _ready),
        ("Up-to-date", "integer", lambda o: o.get("status", {}).get("updatedReplicas", 0)),
        ("Available", "integer", lambda o: o.get("status", {}).get("availableReplicas", 0)),
    ],
    "Pod": [
        (
            "Ready",
            "string",
            lambda o: "{}/{}".format(
                sum(1 for c in o.get("status", {}).get("containerStatuses", []) if c.get("ready")),
                len(o.get("spec", {}).get("containers", [])),
            ),
        ),
        ("Status", "string", lambda o: o.get("status", {}).get("phase", "Pending")),
        (
            "Restarts",
            "integer",
            lambda o: sum(
                c.get("restartCount", 0) for c in o.get("status", {}).get("containerStatuses", [])
            ),
        ),
    ],
    "Secret": [
        ("Type", "string", lambda o: o.get("type")),
        ("Data", "integer", lambda o: len(o.get("data") or {})),
    ],
    "Namespace": [("Status", "string", lambda o: o.get("status", {}).get("phase"))],
    "Lease": [("Holder", "string", lambda o: o.get("spec", {}).get("holderIdentity"))],
    "Event": [
        ("Type", "string", lambda o: o.get("type")),
        ("Reason", "string", lambda o: o.get("reason")),
        (
            "Object",
            "string",
            lambda o: "{}/{}".format(
                o.get("involvedObject", {}).get("kind", "").lower(),
                o.get("involvedObject", {}).get("name"),
            ),
        ),
        ("Message", "string", lambda o: o.get("message")),
    ],
}


def _column_cell(column: JSON, obj: JSON) -> Any:
    try:
        values = jsonpath(obj, column["jsonPath"])
    except ValueError:
        return None
    if not values:
        return None
    value = values[0]
    if column.get("type") == "date":
        return _age(value)
    if isinstance(value, dict | list):
        return str(value)
    return value


def table(
    rtype: ResourceType, items: list[JSON], resource_version: str, include: str | None
) -> JSON:
    definitions: list[JSON] = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name of the object",
            "priority": 0,
        }
    ]
    cells: list[Callable[[JSON], Any]] = [lambda o: o["metadata"]["name"]]
    if rtype.printer_columns:
        for column in rtype.printer_columns:
            definitions.append(
                {
                    "name": column["name"],
                    "type": column.get("type", "string"),
                    "format": column.get("format", ""),
                    "description": column.get("description", ""),
                    "priority": column.get("priority", 0),
                }
            )
            cells.append(functools.partial(_column_cell, column))
    else:
        for name, kind, cell in _BUILTIN.get(rtype.kind, []):
            definitions.append(
                {"name": name, "type": kind, "format": "", "description": "", "priority": 0}
            )
            cells.append(cell)
        definitions.append(
            {
                "name": "Age",
                "type": "string",
                "format": "",
                "description": "Time since creation",
                "priority": 0,
            }
        )
        cells.append(lambda o: _age(o["metadata"].get("creationTimestamp")))
    rows = []
    for obj in items:
        row: JSON = {"cells": [cell(obj) for cell in cells]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
