"""Masking secrets: the one place that decides what of a value may be shown.

Anything a program echoes (a log line, an error, `last_error`, a Kubernetes status or Event)
goes through here when it may hold a secret. One mask, `MASK`; one vocabulary of names that
hold secrets, `is_secret_name`; and one function per form a secret comes in:

- DSNs (`redact_dsn`; where one points: `describe_dsn` for messages, `dsn_label` for a
  title): a parameter is shown only if it is on a list of libpq keywords known to hold
  nothing secret; every other one (password, sslpassword, oauth_client_secret, scram keys,
  whatever a later libpq adds) is masked. A DSN that does not parse is not shown at all
  (outbox.plumbing.dsn says what is wrong with it).
- URLs (`redact_url`): the whole user-info (`user:password@`, or a token as the user), the
  values of the query and the fragment; scheme, host, port and path stay readable. A URL not
  well formed (no `scheme://`, a password holding `/`, `?` or `#`) loses all before its last `@`;
  one refused with neither `scheme://` nor `@` is not quoted at all (`refused_url`).
- free text (`redact_text`): every URL in it, PEM blocks, JWTs, NATS seeds, `Bearer`/`Basic`
  credentials and `name=value` / `name: value` pairs whose name is a secret's; plus, when the
  caller knows them, given secret values and a DSN's.
- settings as a mapping (`redact_mapping`): Kafka properties, NATS options, HTTP headers.
- a value known to be secret inside a message about it (`mask_values`), e.g. a publisher
  option marked secret that its converter quoted (`shown_option`, `masked_option`).

When in doubt a value is masked: showing too little costs a look elsewhere, too much leaks.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.plumbing.dsn import is_url, url_authority

MASK = "***"

# -- names --------------------------------------------------------------------------------------

# Parts of a name (a Kafka property, a NATS option, an HTTP header, a key in free text) that
# say its value is secret: `sasl.password`, `ssl.key.password`, `ssl.key.pem`,
# `sasl.oauthbearer.client.secret`, `Authorization`, `X-Api-Key`, `nkeys_seed`,
# `user_credentials`, `pwd`, `passwd`... Matched anywhere in the name, case-insensitively:
# a harmless name that happens to hold one (`keepalive`s do not) is masked, which is safe.
SECRET_NAME_PARTS = (
    "pass", "pwd", "psw", "secret", "token", "key", "cred", "auth", "cookie", "sign", "seed",
    "jwt", "private", "bearer", "session", "jaas",
)  # fmt: skip


def is_secret_name(name: str) -> bool:
    """Whether a setting, header or field of this name holds a secret."""
    lowered = name.lower()
    return any(part in lowered for part in SECRET_NAME_PARTS)


# -- DSNs ---------------------------------------------------------------------------------------

# libpq keywords whose values are never secret and help a person see where a DSN points.
# Any other keyword is masked: those libpq marks secret (password, sslpassword,
# oauth_client_secret) or debug-only (scram_client_key, scram_server_key), and any it adds
# later. `dbname` is shown unless it holds a connection string of its own.
SHOWN_PARAMETERS = frozenset({
    "service", "user", "passfile", "channel_binding", "connect_timeout", "dbname", "host",
    "hostaddr", "port", "client_encoding", "options", "application_name",
    "fallback_application_name", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout", "sslmode", "sslnegotiation", "sslcompression",
    "sslcert", "sslkey", "sslcertmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni",
    "requirepeer", "require_auth", "min_protocol_version", "max_protocol_version",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "gssencmode", "krbsrvname",
    "gsslib", "gssdelegation", "target_session_attrs", "load_balance_hosts", "oauth_issuer",
    "oauth_client_id", "oauth_scope",
})  # fmt: skip
# What stands for a DSN that does not parse: no piece of it is ever shown.
UNPARSEABLE_DSN = "(a connection string libpq cannot parse, not shown)"


def _mask_url_userinfo(dsn: str) -> str:
    """A URL DSN with the password part of its user-info replaced by the mask.

    libpq ends the user-info at the first `@`, so a password with an unencoded `@` would
    leave its tail in the host: the user-info is taken up to the last `@` of the authority
    (before the first `/` or `?`), which hides the whole password in both readings. The user
    stays: in a DSN it is a role name (a token goes in the password).
    """
    scheme, _, rest = dsn.partition("://")
    authority = url_authority(dsn)
    tail = rest[len(authority) :]
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return dsn
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user}{colon and ':' + MASK}@{host}{tail}"


def _parameters(dsn: str) -> dict[str, str] | None:
    """The DSN's parameters with every secret one masked, or None if libpq cannot parse it."""
    try:
        params = conninfo_to_dict(_mask_url_userinfo(dsn) if is_url(dsn) else dsn)
    except psycopg.ProgrammingError:
        return None
    shown: dict[str, str] = {}
    for key, value in params.items():
        text = str(value)
        if key not in SHOWN_PARAMETERS or (key == "dbname" and _holds_a_dsn(text)):
            text = MASK
        shown[key] = text
    return shown


def _holds_a_dsn(text: str) -> bool:
    # libpq reads a dbname holding "=" or a URL scheme as a connection string of its own
    # (with expand_dbname), password and all.
    return "=" in text or "://" in text


def redact_dsn(dsn: str) -> str:
    """The DSN in key/value form with every value that may be secret masked, safe to log.

    Both forms are covered: key/value (`password=...`) and URL (user-info and query
    parameters). A DSN that does not parse gives UNPARSEABLE_DSN: none of it is shown.
    """
    params = _parameters(dsn)
    if params is None:
        return UNPARSEABLE_DSN
    return make_conninfo("", **params)


def describe_dsn(dsn: str) -> str:
    """Where a DSN points, for messages: `host port 5432 (database d, user u)`, nothing
    secret; a DSN that does not parse is not shown."""
    params = _parameters(dsn)
    if params is None:
        return UNPARSEABLE_DSN
    host = params.get("host") or params.get("hostaddr") or "the local socket"
    port = params.get("port") or "5432"
    extra = [f"{label} {params[key]}" for key, label in (("dbname", "database"), ("user", "user"))
             if params.get(key)]  # fmt: skip
    return f"{host} port {port}" + (f" ({', '.join(extra)})" if extra else "")


def dsn_label(dsn: str) -> str:
    """Where a DSN points, short, for a title (the TUI's top bar): `user@host:port/db`,
    nothing secret; `?` for a DSN that does not parse."""
    params = _parameters(dsn)
    if params is None:
        return "?"
    host = params.get("host") or params.get("hostaddr") or "local"
    return address_label(params.get("user"), host, params.get("port"), params.get("dbname"))


def address_label(user: str | None, host: str, port: str | None, dbname: str | None) -> str:
    """`user@host:port/db`, each part left out when unknown: a DSN's (`dsn_label`), or a
    connection's once made (what the server says it is)."""
    text = f"{host}{':' + port if port else ''}{'/' + dbname if dbname else ''}"
    return f"{user}@{text}" if user else text


def dsn_secrets(dsn: str) -> set[str]:
    """The values of a DSN that redact_dsn masks, as written and as libpq reads them, for
    masking them wherever a message quotes them. A DSN that does not parse is all secret."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return {dsn} if dsn else set()
    found = {
        str(value)
        for key, value in params.items()
        if key not in SHOWN_PARAMETERS or (key == "dbname" and _holds_a_dsn(str(value)))
    }
    if is_url(dsn):
        userinfo = url_authority(dsn).rpartition("@")[0]
        password = userinfo.partition(":")[2]
        found |= {password, urllib.parse.unquote(password)}
    return {value for value in found if value}


# -- URLs ---------------------------------------------------------------------------------------

# Any URL inside a text: a scheme, `://`, then everything up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
# A proper `scheme://` at the start of a URL: RFC 3986's scheme characters, and `_` for
# Kafka's `SASL_SSL://`.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+._-]*://")
# An authority a URL client reads as host and port, with no user-info: a host (a name, an
# IPv4 address or a bracketed IPv6 one) and, after a colon, digits or nothing.
_HOST_PORT = re.compile(r"(?:\[[^\]@]*\]|[^:@\[\]]*)(?::[0-9]*)?")


def mask_userinfo(text: str) -> str:
    """`text` with everything before its last `@` masked: for a value that may hold user-info
    where none belongs, or whose user-info cannot be told apart (a password holding `/`,
    `?`, `#` or `,`). Unchanged without an `@`."""
    return f"{MASK}@{text.rpartition('@')[2]}" if "@" in text else text


def redact_url(url: str) -> str:
    """The URL with its user-info (`user:password@`, or a token as user) and the values of
    its query and fragment replaced by the mask: scheme, host, port and path stay readable.

    The whole user-info goes, the user too: many services take a token as the user
    (`https://TOKEN@host`, `https://TOKEN:x-oauth-basic@host`, `nats://TOKEN@host`).

    A URL that is not well formed is quoted by the very errors that refuse it, so where its
    user-info ends is not guessed: without a proper `scheme://` (`https//u:p@h`, `//u:p@h`,
    `http:/u:p@h`, `u:p@h`), or when what stands where the authority should is no host and
    port (a `/`, `?` or `#` in the password ends it early: `https://u:p/w@h`), everything
    before the last `@` is masked. That may hide a path holding an `@` too: safe.
    """
    scheme = _SCHEME.match(url)
    prefix = scheme[0] if scheme else ""
    rest = url[len(prefix) :]
    # The authority of a well-formed URL: up to the first `/`, `?` or `#`.
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    authority_end = min(ends, default=len(rest))
    authority = rest[:authority_end]
    if scheme and "@" in authority:
        rest = f"{MASK}@{authority.rpartition('@')[2]}{rest[authority_end:]}"
    elif "@" in rest and not (scheme and _HOST_PORT.fullmatch(authority)):
        # Masked before the query and the fragment are looked for: a `?` or a `#` in the
        # password would otherwise leave its head outside them, shown.
        rest = mask_userinfo(rest)
    rest, hash_sign, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    if question:
        query = "&".join(
            f"{key}={MASK}" if has_value else key
            for key, has_value, _ in (item.partition("=") for item in query.split("&"))
        )
    return f"{prefix}{rest}{question}{query}{hash_sign}{MASK if fragment else ''}"


# -- free text ----------------------------------------------------------------------------------

# A PEM block (a private key, a NATS credentials file's JWT and seed), to its END line or,
# cut short, to the end of the text.
_PEM = re.compile(r"-{3,}\s*BEGIN [^-\n]*-{3,}.*?(?:-{3,}\s*END [^-\n]*-{3,}|\Z)", re.DOTALL)
# A JSON Web Token: base64url of `{"` (eyJ) for the header, then the payload and signature.
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]*)?")
# An nkey seed (NATS): `S` and a type letter, then base32.
_NKEY_SEED = re.compile(r"\bS[A-Z][A-Z2-7]{50,}\b")
# `Bearer xyz`, `Basic eHl6`: the credentials after an HTTP authentication scheme.
_AUTH_SCHEME = re.compile(r"\b(Bearer|Basic|Digest|Negotiate)(\s+)[A-Za-z0-9._~+/=-]+")
# `password=x`, `"api_key": "x"`, `Authorization: Token x`: a name and what separates it from
# its value; the value (quoted to its closing quote, or one word, after the authentication
# scheme that may lead it) is masked when the name is a secret's.
_NAME_SEP = re.compile(r"""(?P<name>[A-Za-z_][\w.-]*)["']?\s*[=:]\s*""")
_VALUE = re.compile(
    r""""[^"]*"|'[^']*'|(?:(?i:bearer|basic|digest|token|negotiate|apikey)\s+)?[^\s"',;&)}\]]+"""
)


def refused_url(url: str) -> str:
    """How an error refusing `url` names it: quoted and redacted (`redact_url`) when it has a
    `scheme://` or an `@` to tell a secret's place by; else not at all. A value with neither
    is no URL, and may well be a secret given to the wrong flag (a token as the URL): it is
    described, never quoted."""
    if _SCHEME.search(url) or "@" in url:
        return repr(redact_url(url))
    return "the value (not shown: no scheme://)"


def mask_values(text: str, values: Iterable[str]) -> str:
    """`text` with each of `values` masked wherever it appears: as given, stripped, escaped
    as repr() shows it, and percent-encoded. A value under 4 characters is masked only as a
    word of its own, or every "a" in the text would go."""
    forms: set[str] = set()
    for value in values:
        for form in (value, value.strip()):
            forms |= {form, repr(form)[1:-1], urllib.parse.quote(form, safe="")}
    for form in sorted(forms - {""}, key=len, reverse=True):
        if len(form) >= 4:
            text = text.replace(form, MASK)
        else:
            text = re.sub(rf"(?<!\w){re.escape(form)}(?!\w)", MASK, text)
    return text


def _named_values(text: str) -> str:
    """`text` with the value after each secret's name masked. In free text only a name whose
    last word is a secret's counts (`sasl.password`, `X-Api-Key`, `Authorization`):
    `TOPIC_AUTHORIZATION_FAILED: Broker: ...` is an error code followed by its text."""
    shown, done = [], 0
    for match in _NAME_SEP.finditer(text):
        if match.start() < done:
            continue  # inside a value already masked
        last_word = re.split(r"[^A-Za-z0-9]+", match["name"].rstrip("._-"))[-1]
        value = _VALUE.match(text, match.end())
        if value is None or not is_secret_name(last_word) or value[0].strip("\"'") == MASK:
            continue
        shown += [text[done : match.end()], MASK]
        done = value.end()
    return "".join([*shown, text[done:]])


def _by_shape(text: str) -> str:
    """`text` with what is secret by its very shape masked: PEM blocks, JWTs, NATS seeds, the
    credentials of URLs and after an HTTP authentication scheme."""
    text = _PEM.sub(MASK, text)
    text = _JWT.sub(MASK, text)
    text = _NKEY_SEED.sub(MASK, text)
    text = _URL_IN_TEXT.sub(lambda match: redact_url(match[0]), text)
    return _AUTH_SCHEME.sub(lambda match: f"{match[1]}{match[2]}{MASK}", text)


def redact_text(text: str, *, secrets: Iterable[str] = (), dsn: str = "") -> str:
    """`text` (a message, an error, a response body) safe to show: `secrets` (values the
    caller knows are secret) and the secret values of `dsn` masked wherever they appear, the
    DSN itself shown redacted, every URL redacted (see redact_url), PEM blocks, JWTs, NATS
    seeds, HTTP credentials and values named as secrets masked."""
    if dsn:
        text = text.replace(dsn, redact_dsn(dsn))
    return _named_values(_by_shape(mask_values(text, [*secrets, *dsn_secrets(dsn)])))


# -- settings -----------------------------------------------------------------------------------


def redact_mapping(settings: Mapping[str, Any]) -> dict[str, str]:
    """Settings by name (Kafka properties, NATS options, HTTP headers) safe to show: the
    value of every secret name masked, the others redacted as free text."""
    return {
        name: MASK if is_secret_name(name) else redact_text(str(value))
        for name, value in settings.items()
    }


def shown_option(value: Any, *, secret: bool) -> str:
    """A setting's value as it may appear in a message: masked when secret, else redacted
    as free text; `-` when unset, each item of a list on its own."""
    if value is None:
        return "-"
    if secret:
        return MASK
    if isinstance(value, tuple | list):
        return ", ".join(shown_option(item, secret=False) for item in value)
    return redact_text(str(value))


def masked_option(text: str, raw: str | None, *, secret: bool) -> str:
    """`text` (a message about the raw value given to a setting) safe to show: that value
    masked if the setting is secret, and in any case what is secret by its shape (a private
    key given where a file name was expected is still a private key). Names in it are the
    program's own (`expected KEY=VALUE`), so they are not taken for secrets' names."""
    if secret and raw:
        text = mask_values(text, [raw])
    return _by_shape(text)


__all__ = [
    "MASK",
    "SECRET_NAME_PARTS",
    "SHOWN_PARAMETERS",
    "UNPARSEABLE_DSN",
    "address_label",
    "describe_dsn",
    "dsn_label",
    "dsn_secrets",
    "is_secret_name",
    "mask_userinfo",
    "mask_values",
    "masked_option",
    "redact_dsn",
    "redact_mapping",
    "redact_text",
    "redact_url",
    "shown_option",
]
