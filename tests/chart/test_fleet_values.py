"""The chart's fleet.* values: their ranges are the operator's (one source each,
controller/settings.py), and each reaches the operator as its flag."""

from __future__ import annotations

import json

from chart import chart as c
from outbox.controller.settings import (
    API_REQUESTS_IN_FLIGHT,
    DATABASE_CONNECTIONS,
    SECRET_RECHECK,
    load_settings,
)
from outbox.plumbing.durations import format_duration


def _schema() -> dict:  # type: ignore[type-arg]
    schema = json.loads((c.CHART / "values.schema.json").read_text())
    return schema["properties"]["fleet"]["properties"]


def test_the_schema_holds_the_operators_ranges() -> None:
    schema = _schema()
    for value, bounded in (
        ("databaseConnections", DATABASE_CONNECTIONS),
        ("apiRequestsInFlight", API_REQUESTS_IN_FLIGHT),
    ):
        assert (schema[value]["minimum"], schema[value]["maximum"]) == (bounded.low, bounded.high)


def _args(values: dict) -> list[str]:  # type: ignore[type-arg]
    [container] = c.render(values).one("Deployment")["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_the_defaults_are_the_operators_and_each_value_reaches_it() -> None:
    defaults = load_settings(_args({}), env={"POD_NAMESPACE": "ops"})
    assert defaults.database_connections == DATABASE_CONNECTIONS.default
    assert defaults.api_requests_in_flight == API_REQUESTS_IN_FLIGHT.default
    assert defaults.secret_recheck == SECRET_RECHECK
    fleet = {"databaseConnections": 8, "apiRequestsInFlight": 32, "secretRecheck": "15s"}
    settings = load_settings(_args({"fleet": fleet}), env={"POD_NAMESPACE": "ops"})
    assert (settings.database_connections, settings.api_requests_in_flight) == (8, 32)
    assert format_duration(settings.secret_recheck) == "15s"
