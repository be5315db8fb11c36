"""The shape of a Standard Webhooks signing secret: `whsec_` and the key in base64.

One check for the worker (`--http-signing-secret`, `OUTBOX_HTTP_SIGNING_SECRET`) and the
operator (the Secret `spec.publisher.http.signingSecretRef` names), so that a secret the
operator accepts is one the worker starts with. Errors never hold the value.
"""

from __future__ import annotations

import base64
import binascii

PREFIX = "whsec_"
# The spec's range for a symmetric key.
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


def signing_key(text: str) -> bytes:
    """`whsec_<base64>` as the key bytes; ValueError (without the value) if malformed."""
    text = text.strip()
    if not text.startswith(PREFIX):
        raise ValueError(f"a signing secret starts with {PREFIX!r} followed by base64")
    encoded = text[len(PREFIX) :]
    try:
        # Unpadded base64 too, as the reference library reads it.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the part after {PREFIX!r} is not valid base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(
            f"the key is {len(key)} bytes; a signing secret holds {MIN_KEY_BYTES} to "
            f"{MAX_KEY_BYTES} bytes"
        )
    return key


def signing_keys(text: str) -> list[bytes]:
    """The keys of a Secret's text, one secret a line; blank lines (a trailing newline, a
    gap between two secrets) are skipped. ValueError names the line, never its value, and
    when there is none."""
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            keys.append(signing_key(line))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    if not keys:
        raise ValueError(f"no signing secret (one {PREFIX}<base64> a line)")
    return keys
