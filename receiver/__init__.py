"""The receiving end: helpers that apply each received message once through `outbox.inbox`.

| module                     | for                                              |
|----------------------------|--------------------------------------------------|
| `outbox.receiver.aiohttp`  | an aiohttp handler (`inbox_handler`)             |
| `outbox.receiver.asgi`     | an ASGI app (`InboxEndpoint`): Starlette, FastAPI |
| `outbox.receiver.nats`     | a NATS JetStream consumer (`NatsInbox`)          |
| `outbox.receiver.kafka`    | a confluent-kafka consumer (`KafkaInbox`)        |
| `outbox.receiver.core`     | `apply_async` / `apply`: what they all do        |

Each imports its framework only when imported itself: the application brings the one it
uses; `pip install outbox-dispatcher[receiver]` adds the Standard Webhooks verifier and
psycopg-pool. The inbox table comes from `outbox inbox migrate`; docs/receiving.md tells the
whole story.
"""

from outbox.receiver.core import Applied, apply, apply_async

__all__ = ["Applied", "apply", "apply_async"]
