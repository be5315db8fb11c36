"""Hostile values: secrets in every form a program may be handed, and the check that none of
them shows. One table, pushed through every path that echoes something (the masking
functions, `outbox`, `outbox-worker`, `outbox-tui`, the operator's status, Events and log).

A value leaks if any 8-character piece of one of its secrets appears in what was shown: a
secret cut short, re-encoded around its ends or shown by halves still counts.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Hostile:
    name: str
    value: str
    """What is handed over: a DSN, a URL, a Secret's value."""
    secrets: tuple[str, ...]
    """What must never show, whole or in part."""
    parses: bool = False
    """A DSN libpq parses (its secrets sit in parameters that are masked), pointing at
    127.0.0.1 port 1, where nothing listens."""


def leaks(text: str, secrets: tuple[str, ...] | list[str]) -> list[str]:
    """Every 8-character piece of a secret found in `text`."""
    return sorted(
        {
            secret[i : i + 8]
            for secret in secrets
            for i in range(max(1, len(secret) - 7))
            if secret[i : i + 8] in text
        }
    )


def assert_no_leak(text: str, secrets: tuple[str, ...] | list[str], where: str = "") -> None:
    found = leaks(text, secrets)
    assert not found, f"secret pieces {found} shown{' in ' + where if where else ''}: {text!r}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# A signed token of the shape a Kubernetes service account or an OIDC provider issues.
JWT = ".".join((
    _b64url(json.dumps({"alg": "RS256", "kid": "k1", "typ": "JWT"}).encode()),
    _b64url(json.dumps({"sub": "system:serviceaccount:payments:api", "exp": 1900000000}).encode()),
    _b64url(hashlib.sha512(b"signature").digest() * 4),
))  # fmt: skip

# A private key block as `kubectl create secret tls` stores it (the body is not a real key:
# the shape is what matters to a masker).
_BODY = base64.b64encode(b"".join(hashlib.sha256(bytes([i])).digest() for i in range(36)))
PEM_KEY = (
    "-----BEGIN PRIVATE KEY-----\n"
    + "\n".join(_BODY[i : i + 64].decode() for i in range(0, len(_BODY), 64))
    + "\n-----END PRIVATE KEY-----\n"
)

# A NATS user's credentials file: a JWT and the user's nkey seed.
NKEY_SEED = "SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY"
NATS_CREDS = (
    f"-----BEGIN NATS USER JWT-----\n{JWT}\n------END NATS USER JWT------\n\n"
    "************************* IMPORTANT *************************\n"
    f"-----BEGIN USER NKEY SEED-----\n{NKEY_SEED}\n------END USER NKEY SEED------\n"
)

HOST = "host=127.0.0.1 port=1 connect_timeout=2"

# Values for a DSN: what a Secret key, --dsn or OUTBOX_DSN may hold.
DSNS = (
    Hostile("jwt", JWT, (JWT,)),
    Hostile("pem private key", PEM_KEY, (PEM_KEY.strip(),)),
    Hostile("base64 with padding", "c2lnbmluZy1rZXktdmFsdWU9PQ==", ("c2lnbmluZy1rZXktdmFsdWU9PQ",)),
    Hostile("pwd typo", f"{HOST} user=app pwd=Hunter2PwdTypo dbname=orders", ("Hunter2PwdTypo",)),
    Hostile("passwd typo", f"{HOST} passwd=Hunter2Passwd9", ("Hunter2Passwd9",)),
    Hostile("misspelt password", f"{HOST} pasword=Hunter2Misspelt", ("Hunter2Misspelt",)),
    Hostile("capitalised keyword", f"{HOST} Password=Hunter2Capital", ("Hunter2Capital",)),
    Hostile(
        "unknown keyword", f"{HOST} api_token=tok_live_8f7d6e5c4b3a", ("tok_live_8f7d6e5c4b3a",)
    ),
    Hostile(
        "password with a space",
        f"{HOST} password=correcthorse batterystaple",
        ("correcthorse", "batterystaple"),
    ),
    Hostile(
        "unterminated quote",
        f"{HOST} password='Hunter2OpenQuote9 dbname=orders",
        ("Hunter2OpenQuote9",),
    ),
    Hostile(
        "every secret keyword",
        f"{HOST} dbname=orders user=app password=Hunter2Password sslpassword=Hunter2SslPass "
        "oauth_client_secret=Hunter2OauthSecret scram_client_key=Hunter2ScramClient "
        "scram_server_key=Hunter2ScramServer",
        (
            "Hunter2Password",
            "Hunter2SslPass",
            "Hunter2OauthSecret",
            "Hunter2ScramClient",
            "Hunter2ScramServer",
        ),
        parses=True,
    ),
    Hostile(
        "dbname holding a url",
        f"{HOST} dbname='postgresql://app:Hunter2Nested@db.example/orders'",
        ("Hunter2Nested",),
        parses=True,
    ),
    Hostile(
        "url password",
        "postgresql://app:Hunter2UrlPass@127.0.0.1:1/orders?connect_timeout=2",
        ("Hunter2UrlPass",),
        parses=True,
    ),
    Hostile(
        "url password with an unencoded @",
        "postgresql://app:Hunter2@AtSign@127.0.0.1:1/orders",
        ("Hunter2@AtSign",),
    ),
    Hostile(
        "url percent-encoded password",
        "postgresql://app:Hunter2%2FSlash%40At@127.0.0.1:1/orders?connect_timeout=2",
        ("Hunter2%2FSlash%40At", "Hunter2/Slash@At"),
        parses=True,
    ),
    Hostile(
        "url query secrets",
        "postgresql://app@127.0.0.1:1/orders?password=Hunter2QueryPass&sslpassword="
        "Hunter2QuerySsl&connect_timeout=2",
        ("Hunter2QueryPass", "Hunter2QuerySsl"),
        parses=True,
    ),
    Hostile(
        "url query typo",
        "postgresql://app@127.0.0.1:1/orders?pwd=Hunter2QueryPwd",
        ("Hunter2QueryPwd",),
    ),
    Hostile(
        "url with spaces in the password",
        "postgresql://app:Hunter2 Spaced@127.0.0.1:1/orders",
        ("Hunter2 Spaced",),
    ),
)

# URLs a publisher is given (user-info, a token as the user, query values, fragments).
URLS = (
    Hostile(
        "http credentials and query",
        "https://deploy:HttpPassword99@api.example/hook?token=HttpQueryToken1&v=2#FragSecret99",
        ("HttpPassword99", "HttpQueryToken1", "FragSecret99"),
    ),
    Hostile(
        "token as the user",
        "https://ghp_TokenAsUser12345:x-oauth-basic@git.example/hook",
        ("ghp_TokenAsUser12345",),
    ),
    Hostile(
        "nats password", "nats://natsuser:NatsPassword99@nats.example:4222", ("NatsPassword99",)
    ),
    Hostile("nats token", "tls://NatsTokenAsUser77@nats.example:4222", ("NatsTokenAsUser77",)),
)

# Settings by name: Kafka properties, NATS connect options, HTTP headers.
KAFKA_CONFIG = {
    "security.protocol": "sasl_ssl",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "orders-producer",
    "sasl.password": "KafkaSaslPass99",
    "ssl.key.password": "KafkaKeyPass99",
    "ssl.key.pem": PEM_KEY,
    "sasl.oauthbearer.client.secret": "KafkaOauthSecret9",
    "sasl.oauthbearer.config": "principal=admin extension_token=KafkaOauthCfg99",
}
KAFKA_SECRETS = (
    "KafkaSaslPass99", "KafkaKeyPass99", PEM_KEY.strip(), "KafkaOauthSecret9", "KafkaOauthCfg99",
)  # fmt: skip
NATS_OPTIONS = {
    "user": "orders",
    "password": "NatsPassword99",
    "token": "NatsToken99xyz",
    "nkeys_seed": NKEY_SEED,
    "user_credentials": NATS_CREDS,
}
NATS_SECRETS = ("NatsPassword99", "NatsToken99xyz", NKEY_SEED, JWT)
HEADERS = {
    "Authorization": f"Bearer {JWT}",
    "X-Api-Key": "ApiKeyValue1234",
    "Cookie": "session=CookieSecret99",
    "Proxy-Authorization": "Basic YWRtaW46UHJveHlQYXNz",
    "X-Tenant": "acme",
}
HEADER_SECRETS = (JWT, "ApiKeyValue1234", "CookieSecret99", "YWRtaW46UHJveHlQYXNz")

# Free text as a receiver, a driver or a broker may answer it.
TEXTS = (
    Hostile(
        "echoed request",
        f"400 bad request: POST https://deploy:HttpPassword99@api.example/hook?token=HttpQueryTok"
        f"en1\r\nAuthorization: Bearer {JWT}\r\nX-Api-Key: ApiKeyValue1234\r\n",
        ("HttpPassword99", "HttpQueryToken1", JWT, "ApiKeyValue1234"),
    ),
    Hostile(
        "json body",
        '{"error": "rejected", "password": "JsonPassword99", "api_key": "JsonApiKey99", '
        '"client_secret": "JsonClientSecret9"}',
        ("JsonPassword99", "JsonApiKey99", "JsonClientSecret9"),
    ),
    Hostile("pem in a message", f"cannot load key: {PEM_KEY}", (PEM_KEY.strip(),)),
    Hostile("nats credentials file", f"bad creds:\n{NATS_CREDS}", (JWT, NKEY_SEED)),
    Hostile("jwt alone", f"token {JWT} expired", (JWT,)),
    Hostile(
        "dsn fragments",
        "connection failed: pwd=Hunter2PwdTypo sslpassword=Hunter2SslPass",
        ("Hunter2PwdTypo", "Hunter2SslPass"),
    ),
)
