"""`Problem`: why a resource cannot be served, as every step of a pass reports it.

Its own module because every layer raises or carries one (the spec's parse, the pod policy,
the Secrets, the database, the pass itself) and the report step turns it into conditions:
none of them should import the report module to say what went wrong.
"""

from __future__ import annotations

# A retention run's failure: the reason of its Problem, of RetentionHealthy=False and of the
# Warning Event (controller/status.py).
RETENTION_FAILED = "RetentionFailed"


class Problem(Exception):
    """Why a resource cannot be served: a CamelCase reason and a message for people.

    Raised while reconciling; reported as Ready=False (and DatabaseReachable=False when
    `database` is set) with an Event, never as a traceback. `stops_workers`: the resource
    may run no workers while it stands (the cluster admin's policy, a Secret not shared),
    where other problems hold the current size.
    """

    def __init__(
        self, reason: str, message: str, *, database: bool = False, stops_workers: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.database = database
        self.stops_workers = stops_workers
