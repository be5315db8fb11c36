"""The connection's settings: server URLs, credentials and TLS (files or a mounted Secret)."""

from __future__ import annotations

import importlib.util
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import refused_url

DEFAULT_URL = "nats://127.0.0.1:4222"
SCHEMES = ("nats", "tls", "ws", "wss")


def server_urls(text: str) -> tuple[str, ...]:
    """One or more comma-separated server URLs, e.g. `nats://a:4222,nats://b:4222`."""
    urls = tuple(part.strip() for part in text.split(",") if part.strip())
    if not urls:
        raise ValueError("no server URL given")
    for url in urls:
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            raise ValueError(f"{refused_url(url)} is not a URL") from None
        if parts.scheme not in SCHEMES:
            # Without `scheme://`, urllib takes a user name for the scheme (`tok:en@h`): named
            # only when the URL has its `://`, which redact_url then masks behind.
            scheme = parts.scheme if "://" in url else ""
            said = f": scheme {scheme!r} is not" if scheme else " needs"
            raise ValueError(
                f"{refused_url(url)}{said} one of " + ", ".join(f"{s}://" for s in SCHEMES)
            )
        if not parts.hostname:
            raise ValueError(f"{refused_url(url)} has no host")
    return urls


def readable_file(text: str) -> str:
    try:
        found = Path(text).is_file()
    except (OSError, ValueError):  # too long a name, a NUL: e.g. a file's contents
        found = False
    if not found:
        raise ValueError(f"{text!r} is not a file")
    return text


def readable_dir(text: str) -> str:
    try:
        found = Path(text).is_dir()
    except (OSError, ValueError):
        found = False
    if not found:
        raise ValueError(f"{text!r} is not a directory")
    return text


# A directory as a Kubernetes TLS Secret mounts: (file, what it is), each used when present.
TLS_DIR_FILES = (("ca.crt", "ca"), ("tls.crt", "cert"), ("tls.key", "key"))


def tls_dir_files(folder: str) -> dict[str, str]:
    """The TLS files a directory holds, by role ("ca", "cert", "key")."""
    found = {role: str(Path(folder, name)) for name, role in TLS_DIR_FILES}
    found = {role: path for role, path in found.items() if Path(path).is_file()}
    if not found:
        names = ", ".join(name for name, _ in TLS_DIR_FILES)
        raise SettingError(f"--nats-tls-dir: {folder!r} holds none of {names}")
    if "key" in found and "cert" not in found:
        raise SettingError(f"--nats-tls-dir: {folder!r} holds tls.key but no tls.crt")
    return found


def tls_files(values: dict[str, Any]) -> dict[str, str | None]:
    """The CA, certificate and key the options name: files, or a directory's (a CA given
    as a file wins over the directory's, which may come from elsewhere)."""
    files = {role: values.get(f"nats_tls_{role}") for role in ("ca", "cert", "key")}
    folder = values.get("nats_tls_dir")
    if folder is None:
        return files
    if files["cert"] is not None or files["key"] is not None:
        raise SettingError("--nats-tls-dir: give it or --nats-tls-cert/--nats-tls-key, not both")
    found = tls_dir_files(folder)
    return {
        "ca": files["ca"] or found.get("ca"),
        "cert": found.get("cert"),
        "key": found.get("key"),
    }


def creds_file(text: str) -> str:
    readable_file(text)
    # nats-py signs the server's nonce with nkeys, an optional dependency of nats-py.
    if importlib.util.find_spec("nkeys") is None:
        raise ValueError("credentials files need the nkeys package (pip install nkeys)")
    return text


def _refuse_key_password() -> str:
    # Without this, OpenSSL would prompt on the terminal for an encrypted key's passphrase.
    raise ValueError("encrypted private keys are not supported")


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A client TLS context verifying the server (against `ca`, else the system's CAs)."""
    if ca is None and cert is None and key is None:
        return None  # tls:// URLs still get the client's default context
    if key is not None and cert is None:
        raise SettingError("--nats-tls-key: needs --nats-tls-cert")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise SettingError(f"--nats-tls-ca: cannot load {ca!r}: {exc}") from None
    if cert is not None:
        try:
            context.load_cert_chain(cert, key, password=_refuse_key_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise SettingError(f"--nats-tls-cert: cannot load {cert!r}: {exc}") from None
    return context


def servers_of(values: dict[str, Any]) -> list[str]:
    """The server URLs the options name (DEFAULT_URL if none): all WebSocket or none."""
    servers = [url for urls in values.get("nats_url") or () for url in urls] or [DEFAULT_URL]
    websocket = {urllib.parse.urlsplit(url).scheme in ("ws", "wss") for url in servers}
    if len(websocket) > 1:
        raise SettingError("--nats-url: ws:// and wss:// URLs cannot be mixed with others")
    return servers


def auth_of(values: dict[str, Any]) -> dict[str, str]:
    """The client's credentials, from at most one of the ways the options give them."""
    user, password = values.get("nats_user"), values.get("nats_password")
    if (user is None) != (password is None):
        raise SettingError("--nats-user and --nats-password: give both or neither")
    methods = [values.get("nats_creds"), user, values.get("nats_token")]
    if sum(method is not None for method in methods) > 1:
        raise SettingError(
            "--nats-creds, --nats-user/--nats-password and --nats-token: give only one"
        )
    auth: dict[str, str] = {}
    if values.get("nats_creds") is not None:
        auth["user_credentials"] = values["nats_creds"]
    if user is not None and password is not None:
        auth.update(user=user, password=password)
    if values.get("nats_token") is not None:
        auth["token"] = values["nats_token"]
    return auth
