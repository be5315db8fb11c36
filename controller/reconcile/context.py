"""What every resource's loop shares (`Context`), and how a step names itself in an error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.database import Database, Pools
from outbox.controller.kube import Kube, failure_reason
from outbox.controller.metrics import Metrics
from outbox.controller.settings import ControllerSettings
from outbox.controller.tables import Tables


@dataclass
class Context:
    """What every loop shares: the settings, the writer, the metrics, which resource serves
    which table, and the door to the databases (a pool kept per database)."""

    settings: ControllerSettings
    kube: Kube
    metrics: Metrics
    tables: Tables = field(default_factory=Tables)
    database: Database = field(default_factory=Pools)


class StepFailed(Exception):
    """The API server refused what a step of a pass did, or did not answer it in time
    (kube.REQUEST_SECONDS); `step` says which, for people."""

    def __init__(self, step: str, error: ApiException | TimeoutError) -> None:
        super().__init__(f"{step}: {failure_reason(error)}")
        self.step = step
        self.error = error


@contextmanager
def step(what: str) -> Iterator[None]:
    """Name the step whose API calls follow (`reading Deployment ns/x-worker`): an error
    the server answers them with, or its silence, says what the pass was doing."""
    try:
        yield
    except (ApiException, TimeoutError) as exc:
        raise StepFailed(what, exc) from exc
