"""One resource's reconcile loop and the steps of its pass, in the order they run.

A `DispatcherLoop` runs for each OutboxDispatcher resource while this replica leads (it is
the resource's reconcile loop; the workers dispatch the messages). Every
`pollIntervalSeconds` (and at once when the spec changes) it parses the resource once
(`spec.DispatcherSpec`) and runs a pass from scratch:

1. `read`: the inputs (pod policy, Secrets, the table's check and backlog through
   `Context.database`), the Deployment if it is ours, its pods → a `Reading`;
2. decide: the worker count and why (`decision.decide`, pure);
3. `apply`: create, replace or resize the Deployment, its NetworkPolicy and budget; purge
   done rows → an `Applied`;
4. `report`: metrics, Events, the status (its content from `status`, pure).

Each step is a function of what the steps before it returned; `loop.Memory` is all a pass
leaves the next. `context` holds what every loop shares.

Here `read`, `apply` and `report` name the steps' modules (each holds its step's function
of the same name), so `reconcile.report.status` is the report step's status, as it reads.
"""

from outbox.controller.reconcile.apply import Applied
from outbox.controller.reconcile.context import Context, StepFailed, step
from outbox.controller.reconcile.loop import DispatcherLoop, Memory
from outbox.controller.reconcile.read import Reading

__all__ = [
    "Applied",
    "Context",
    "DispatcherLoop",
    "Memory",
    "Reading",
    "StepFailed",
    "step",
]
