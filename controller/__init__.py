"""The operator (`outbox-controller`): a kopf controller for `OutboxDispatcher` resources.

It renders and sizes the worker Deployments; the sizing rule is the pure policy in
`outbox.controller.scaling`. Needs the `[operator]` extra.
"""
