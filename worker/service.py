"""What every service of a replica shares, given to each in one piece."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outbox.claim_window import ClaimWindow
from outbox.worker.ledger import Ledger
from outbox.worker.metrics import Metrics
from outbox.worker.retry import DatabaseRetry
from outbox.worker.settings import WorkerSettings


@dataclass(frozen=True)
class Shared:
    settings: WorkerSettings
    ledger: Ledger  # the messages the replica holds
    connection: Callable[[], Any]  # the pool's: `async with connection() as conn`
    retry: DatabaseRetry  # the one way to wait for the database
    metrics: Metrics
    # Where claims look in a partitioned table; its layout is learnt when the table is checked.
    window: ClaimWindow = field(default_factory=ClaimWindow)


class Service:
    """A replica's service: the shared parts as its attributes."""

    def __init__(self, shared: Shared) -> None:
        self.settings = shared.settings
        self.ledger = shared.ledger
        self.connection = shared.connection
        self.retry = shared.retry
        self.metrics = shared.metrics
        self.window = shared.window
