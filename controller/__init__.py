"""The operator (`outbox-controller`): a kopf controller for `OutboxDispatcher` resources.

It renders and sizes the worker Deployments; the sizing rule is the pure policy in
`outbox.controller.scaling`. Needs the `[operator]` extra.

The layers, from the process down; a module imports only from the layers below it:

- process: `cli` (the entry point: settings, logging, the Lease, kopf, the health
  endpoint), `handlers` (kopf's watch: one `reconcile.DispatcherLoop` per resource),
  `leader` (the Lease), `metrics` (Prometheus and the /healthz, /metrics endpoint),
  `settings` and `defaults` (the operator's flags, and its defaults for the resources).
- the pass, `reconcile/`, in the order it runs: `context` (what every loop shares),
  `read` → decide (`decision`) → `apply` → `report`, and `loop` (`DispatcherLoop`,
  a pass every poll interval, with the `Memory` one pass leaves the next).
- pure rules, no I/O: `spec` (the resource parsed once into a typed `DispatcherSpec`),
  `decision` (the worker count, its numbered rules and the limits, applied once),
  `scaling/` (the policy's wish: `policy`, `learning`), `status` (conditions, Events),
  `policy`, `images` and `consent` (what a resource may ask for), `render`, `network`,
  `budget` and `drift` (what the cluster should hold), `resource` (names and labels),
  `problem` (why a resource cannot be served).
- doors to the outside: `kube` (every write to the API server), `database` (every read of
  and write to an outbox table, behind `Database`; the statements are `outbox`'s),
  `tables` (one table, one resource).
"""
