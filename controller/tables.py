"""One table, one resource: which table each served resource dispatches (`Tables`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from outbox.controller.database import TableIdentity


@dataclass
class Tables:
    """Which table each served resource dispatches, by the server's identity of it: one
    table, one resource. The first (the older resource; by namespace and name on a tie)
    keeps it; any other gets `TableConflict` and runs no workers. A resource keeps its
    entry while its reading fails (its table is still its own), until it is deleted."""

    served: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # (namespace, name) -> (identity key, creationTimestamp)

    def first(
        self, namespace: str, name: str, created: str, identity: TableIdentity
    ) -> tuple[str, str] | None:
        """Record what this resource serves; the resource that had the table first, if
        not this one."""
        me = (namespace, name)
        self.served[me] = (identity.key, created)
        rivals = [key for key, (other, _) in self.served.items() if other == identity.key]
        first = min(rivals, key=lambda key: (self.served[key][1], key))
        return None if first == me else first

    def forget(self, namespace: str, name: str) -> None:
        self.served.pop((namespace, name), None)
