"""Standard Webhooks signatures for the HTTP publisher (`--http-signing-secret`).

Each request carries `webhook-id` (the outbox id: the same on every retry),
`webhook-timestamp` (seconds since the epoch, new on every attempt) and `webhook-signature`:
`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one entry per secret, separated by
spaces. Several secrets sign together while a receiver moves from the old one to the new one
(rotation): it accepts a request when any entry verifies with a secret it knows.

A secret is `whsec_` and the key in base64 (what Standard Webhooks libraries generate and
read); one that is not is refused at start, naming the flag, never the value. The check is
outbox.signing_keys', which the operator applies to the Secret it names too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Sequence


class Signer:
    """Signs request bodies with every key given."""

    def __init__(self, keys: Sequence[bytes], clock: Callable[[], float] = time.time) -> None:
        if not keys:
            raise ValueError("no signing key")
        self._keys = tuple(keys)
        self._clock = clock

    def headers(self, message_id: str, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers for one attempt of a message."""
        timestamp = str(int(self._clock()))
        signed = b"%s.%s.%s" % (message_id.encode(), timestamp.encode(), body)
        signatures = " ".join(
            "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            for key in self._keys
        )
        return {
            "webhook-id": message_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": signatures,
        }
