"""Publishes to NATS JetStream and gathers the stream's acknowledgements (PubAcks).

A batch publisher: the worker hands it the messages it holds, a batch at a time; it
publishes them all asynchronously, each with its own reply subject, and returns a result per
message once each has its PubAck (or its failure, or the ack timeout, one timer per batch).

The subject comes from a template (default `outbox.{aggregate_type}.{event_type}`); every
substituted value is made a single valid subject token (whitespace, control characters, `.`,
`*` and `>` become `_`). A subject longer than MAX_SUBJECT_BYTES makes its message permanent,
alone: the server would close the connection on it ("maximum control line exceeded") and fail
every message in flight with it. The body is the JSON envelope; the header `Nats-Msg-Id` is
the outbox id, the same on every retry, so the stream's duplicate window drops a message it
already stored: the PubAck then says `duplicate` and the worker counts it in
`outbox_broker_duplicates_total`. Headers `Outbox-Event-Type`, `Outbox-Aggregate-Type` and
`Outbox-Aggregate-Id` carry the unsanitized values. `--format` may make the message a
CloudEvent instead (formats.py: `ce-` headers in binary mode, a JSON CloudEvent in structured
mode); the row's own headers follow the project's (headers.py), never replacing them nor
JetStream's `Nats-*` control headers.

The connection is made in the background and kept up forever (`max_reconnect_attempts=-1`):
a worker starts, and keeps running, while NATS is unreachable. A publish while not connected
fails at once as retryable (the whole batch), so rows back off and are delivered once the
server is back.

| what happened                                                               | class     |
|-----------------------------------------------------------------------------|-----------|
| PubAck received; with `duplicate` true the stream dropped it as a duplicate | success   |
| no responders: no stream bound to the subject (`NoStreamResponseError`)     | dead (1)  |
| JetStream API 404, e.g. stream not found (`NotFoundError`)                  | dead (1)  |
| server -ERR "permissions violation for publish to" the subject              | dead (1)  |
| server -ERR "permissions violation for subscription to" the PubAck inbox    | dead (1)  |
| the reply is not a PubAck: a plain NATS responder answered, not a stream    | dead (1)  |
| JetStream API 503 (`ServiceUnavailableError`) or 500 (`ServerError`)        | retryable |
| any other JetStream API error, e.g. 400 message over the `max_msg_size`     | dead      |
| no PubAck in time (`nats.errors.TimeoutError`) (2)                          | retryable |
| not connected: connecting, reconnecting, closed, no servers                 | retryable |
| `ConnectionClosedError`, `NoServersError`, `StaleConnectionError`           | retryable |
| `SlowConsumerError`, `OutboundBufferLimitError`, `ConnectionDrainingError`  | retryable |
| socket errors (`OSError`) and any other `nats.errors.Error`                 | retryable |
| body over the server's `max_payload` (`MaxPayloadError`)                    | dead      |
| invalid subject or header (`BadSubjectError`, `BadHeaderError`)             | dead      |
| subject past MAX_SUBJECT_BYTES (checked before publishing)                  | dead      |

(1) `--nats-no-stream retry` makes these retryable instead: for a stream or a permission
that will be added later. (2) Also what a connection lost mid-request, or PubAcks dropped by a
slow consumer, look like. Authentication failures (wrong password, bad credentials) happen
while connecting: publishes fail as retryable "not connected", and the cause is logged.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import logging
import re
import ssl
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from outbox.errors import SettingError
from outbox.models import Message
from outbox.redact import is_secret_name, redact_text, redact_url
from outbox.worker.publishers.base import (
    PermanentError,
    PublisherBase,
    RetryableError,
    server_of,
)
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.formats import ENVELOPE, NATS, CloudEvents, encode
from outbox.worker.publishers.formats import wire_format as check_format
from outbox.worker.publishers.headers import nats_headers
from outbox.worker.publishers.registry import Option, PublisherContext
from outbox.worker.publishers.template import Template

log = logging.getLogger("outbox.worker")

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_SUBJECT = "outbox.{aggregate_type}.{event_type}"
SCHEMES = ("nats", "tls", "ws", "wss")
NO_STREAM_POLICIES = ("dead", "retry")
DEFAULT_NO_STREAM = "dead"
RECONNECT_WAIT = 2.0  # seconds between attempts on one server (the client's default)
CONNECT_TIMEOUT = 2.0  # one TCP + handshake attempt; also how long start() waits for it
NO_RESPONDERS_STATUS = "503"  # the server's status reply when nothing listens on a subject
SUBJECT_CACHE_SIZE = 4096  # rendered subjects kept; emptied when full
# A server reads `HPUB <subject> <reply> <header size> <total size>` as one control line of
# at most 4096 bytes (its default `max_control_line`), and closes the connection on a longer
# one. The reply subject (the client's inbox and a counter) and the sizes take under 100 of
# them: the rest is room for the subject.
MAX_CONTROL_LINE = 4096
MAX_SUBJECT_BYTES = MAX_CONTROL_LINE - 128

# Anything that cannot stand inside one subject token: whitespace and control characters
# break the protocol line, `.` separates tokens, `*` and `>` are wildcards.
_NOT_IN_TOKEN = re.compile(r"[\s\x00-\x1f\x7f.*>]")
_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"')


# -- subjects ----------------------------------------------------------------------------------


def subject_token(value: str) -> str:
    """`value` as one valid subject token: forbidden characters become `_`, never empty."""
    return _NOT_IN_TOKEN.sub("_", value) or "_"


def render_subject(template: str | Template, message: Message) -> str:
    """The subject of a message; PermanentError when it is too long for a server to take."""
    if isinstance(template, str):
        template = Template(template, subject_token)
    subject = template.render(message)
    size = len(subject.encode())
    if size > MAX_SUBJECT_BYTES:
        raise PermanentError(
            f"subject {template.text!r} renders {size} bytes for this message, more than the "
            f"{MAX_SUBJECT_BYTES} a NATS server's control line leaves for a subject; not sent"
        )
    return subject


def subject_template(text: str) -> str:
    """Check a subject template: known placeholders only, and a valid subject around them."""
    sample = Template(text, subject_token).sample()
    if len(sample.encode()) > MAX_SUBJECT_BYTES:
        raise ValueError(f"longer than the {MAX_SUBJECT_BYTES} bytes a subject may take")
    for token in sample.split("."):
        if not token:
            raise ValueError(f"{text!r}: empty subject token (leading, trailing or double dot)")
        if token != subject_token(token):
            raise ValueError(f"{text!r}: no whitespace, control characters, * or > allowed")
    return text


# -- settings ----------------------------------------------------------------------------------


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
            raise ValueError(f"{redact_url(url)!r} is not a URL") from None
        if parts.scheme not in SCHEMES:
            # Without `scheme://`, urllib takes a user name for the scheme (`tok:en@h`): named
            # only when the URL has its `://`, which redact_url then masks behind.
            scheme = parts.scheme if "://" in url else ""
            raise ValueError(
                f"{redact_url(url)!r}: scheme {scheme or '(none)'!r} is not one of "
                + ", ".join(f"{s}://" for s in SCHEMES)
            )
        if not parts.hostname:
            raise ValueError(f"{redact_url(url)!r} has no host")
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


def _tls_files(values: dict[str, Any]) -> dict[str, str | None]:
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


def no_stream_policy(text: str) -> str:
    if text not in NO_STREAM_POLICIES:
        raise ValueError(f"{text!r} is not one of {', '.join(NO_STREAM_POLICIES)}")
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


# -- classification ----------------------------------------------------------------------------


class _Acks:
    """The PubAcks of one batch: a verdict per message (the PubAck `Msg`, or the exception
    that ended it) and one future, set once every message has its verdict. Only the event
    loop touches it: no future, task or timer per message."""

    __slots__ = ("future", "left", "subjects", "verdicts")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.verdicts: list[Msg | Exception | None] = [None] * size
        self.subjects: list[str] = [""] * size
        self.left = 0  # sent, still without a verdict
        self.future: asyncio.Future[None] = loop.create_future()

    def decide(self, index: int, verdict: Msg | Exception) -> None:
        if self.verdicts[index] is None:
            self.verdicts[index] = verdict
            self.left -= 1
            if self.left == 0 and not self.future.done():
                self.future.set_result(None)

    def refuse(self, index: int, verdict: Exception, *, counted: bool = False) -> None:
        """A verdict for a message that never left (`counted` if it was in `left`). The
        batch is still being sent: the future is not set here, even if every message sent
        so far has its PubAck (the batch would end before the messages still to send)."""
        if self.verdicts[index] is None:
            self.verdicts[index] = verdict
            if counted:
                self.left -= 1

    def expire(self) -> None:
        """The ack timeout: every message still waiting gets no PubAck in time."""
        for index, verdict in enumerate(self.verdicts):
            if verdict is None:
                self.verdicts[index] = nats.errors.TimeoutError()
        self.left = 0
        if not self.future.done():
            self.future.set_result(None)


def _no_stream(reason: str, policy: str) -> PermanentError | RetryableError:
    return RetryableError(reason) if policy == "retry" else PermanentError(reason)


def classify(exc: Exception, subject: str, no_stream: str = DEFAULT_NO_STREAM) -> Exception:
    """The failure class (see the table above) for an exception from publishing to `subject`;
    an exception of no known kind is returned as it is: a bug for the loop to report."""
    if isinstance(exc, NoStreamResponseError | nats.errors.NoRespondersError):
        return _no_stream(f"no stream bound to subject {subject!r} (no responders)", no_stream)
    if isinstance(exc, ValueError | TypeError):
        # json.loads or PubAck(**reply) failed: whatever answered is not a JetStream stream.
        return _no_stream(
            f"subject {subject!r} was answered by a plain NATS responder, not a stream ({exc})",
            no_stream,
        )
    if isinstance(exc, NotFoundError):
        return _no_stream(f"stream not found for subject {subject!r}: {exc.description}", no_stream)
    if isinstance(exc, ServiceUnavailableError | ServerError):
        return RetryableError(f"JetStream unavailable ({exc.code}): {exc.description}")
    if isinstance(exc, APIError):
        return PermanentError(
            f"JetStream refused the message ({exc.code}, err_code {exc.err_code}): "
            f"{exc.description}"
        )
    if isinstance(exc, TimeoutError):  # nats-py's own subclasses the builtin it also raises
        return RetryableError(f"no PubAck for subject {subject!r} in time")
    if isinstance(
        exc, nats.errors.MaxPayloadError | nats.errors.BadSubjectError | nats.errors.BadHeaderError
    ):
        return PermanentError(f"{exc} (subject {subject!r})")
    if isinstance(exc, nats.errors.Error | OSError):
        # Connection states (closed, reconnecting, draining, no servers, stale, outbound buffer
        # full, slow consumer) and socket errors: all pass once the connection is back.
        return RetryableError(str(exc) or type(exc).__name__)
    return exc


# -- the publisher -----------------------------------------------------------------------------


class NatsPublisher(PublisherBase):
    name = "nats"
    batched = True
    options = (
        Option(
            "--nats-url",
            f"NATS server URL, nats:// tls:// ws:// or wss://; several separated by commas "
            f"(default {DEFAULT_URL})",
            convert=server_urls,
            repeatable=True,
        ),
        Option(
            "--nats-subject",
            "subject template; placeholders {aggregate_type}, {aggregate_id}, {event_type} "
            f"(default {DEFAULT_SUBJECT})",
            convert=subject_template,
            default=DEFAULT_SUBJECT,
        ),
        Option("--nats-creds", "NATS credentials file (JWT + nkey seed)", convert=creds_file),
        Option("--nats-user", "NATS user name; never logged", secret=True),
        Option("--nats-password", "NATS password; never logged", secret=True),
        Option("--nats-token", "NATS authentication token; never logged", secret=True),
        Option(
            "--nats-tls-ca", "CA certificate(s) to verify the server, PEM", convert=readable_file
        ),
        Option("--nats-tls-cert", "client certificate for mutual TLS, PEM", convert=readable_file),
        Option("--nats-tls-key", "client certificate's private key, PEM", convert=readable_file),
        Option(
            "--nats-tls-dir",
            "directory as a Kubernetes TLS Secret mounts: tls.crt and tls.key (mutual TLS) and "
            "ca.crt, each used when present; not with --nats-tls-cert/--nats-tls-key",
            convert=readable_dir,
        ),
        Option(
            "--nats-no-stream",
            "no stream for the subject, or permission denied: dead (default) or retry",
            convert=no_stream_policy,
            default=DEFAULT_NO_STREAM,
        ),
    )

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> NatsPublisher:
        servers = [url for urls in values.get("nats_url") or () for url in urls] or [DEFAULT_URL]
        websocket = {urllib.parse.urlsplit(url).scheme in ("ws", "wss") for url in servers}
        if len(websocket) > 1:
            raise SettingError("--nats-url: ws:// and wss:// URLs cannot be mixed with others")
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
        return cls(
            servers,
            subject=values.get("nats_subject") or DEFAULT_SUBJECT,
            no_stream=values.get("nats_no_stream") or DEFAULT_NO_STREAM,
            # Our own deadline fires just before the loop's, so a lost PubAck is reported as
            # such rather than as a generic publish timeout.
            ack_timeout=context.publish_timeout * 0.9,
            name=context.owner,
            on_duplicate=context.count_broker_duplicate,
            tls=tls_context(**_tls_files(values)),
            auth=auth,
            wire_format=context.format,
            source=context.cloudevents_source,
        )

    def __init__(
        self,
        servers: Sequence[str] = (DEFAULT_URL,),
        *,
        subject: str = DEFAULT_SUBJECT,
        no_stream: str = DEFAULT_NO_STREAM,
        ack_timeout: float = 5.0,
        name: str = "outbox-dispatcher",
        on_duplicate: Callable[[], None] = lambda: None,
        tls: ssl.SSLContext | None = None,
        auth: dict[str, str] | None = None,
        reconnect_wait: float = RECONNECT_WAIT,
        wire_format: str = ENVELOPE,
        source: str = "/outbox/outbox",
    ) -> None:
        self.servers = list(servers)
        self.format = check_format(wire_format)
        self._cloudevents = CloudEvents(source)
        self._row_headers = nats_headers()
        self.subject_template = self.destination_template = subject_template(subject)
        self.no_stream = no_stream_policy(no_stream)
        self._ack_timeout = ack_timeout
        self._name = name
        self._on_duplicate = on_duplicate
        self._tls = tls
        self._auth = auth or {}
        self._reconnect_wait = reconnect_wait
        self._shown = ", ".join(redact_url(url) for url in self.servers)
        self.destination = f"nats {self._shown}"  # the cluster: health is shared by its servers
        # The first server: the span's `server.address` and `server.port`.
        self.server = server_of(self.servers[0], default_port=4222) if self.servers else None
        self._nc: Client | None = None
        self._inbox = ""  # the client's PubAck inbox prefix: `<inbox>.<token>` per publish
        self._connecting: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._closing = False
        self._last_error = "not connected yet"
        self._logged_error = ""
        # Messages waiting for their PubAck, by reply token: their batch and place in it (a
        # permissions violation for the subject a message went to ends it at once).
        self._waiting: dict[str, tuple[_Acks, int]] = {}
        self._tokens = itertools.count()
        self._acks_denied: str | None = None
        # Rendering a subject is three regex substitutions; messages of one aggregate type and
        # event type share theirs (and the aggregate id, when the template uses it).
        self._template = Template(self.subject_template, subject_token)
        self._by_id = self._template.by_id
        self._subjects: dict[tuple[str, str, str], str] = {}

    def subject(self, message: Message) -> str:
        key = (
            message.aggregate_type,
            message.event_type,
            message.aggregate_id if self._by_id else "",
        )
        subject = self._subjects.get(key)
        if subject is None:
            if len(self._subjects) >= SUBJECT_CACHE_SIZE:
                self._subjects.clear()
            # May raise: nothing is kept then.
            subject = self._subjects[key] = render_subject(self._template, message)
        return subject

    def destination_name(self, message: Message) -> str:
        return self.subject(message)

    async def start(self) -> None:
        self._connect()
        # Wait briefly so the first claims do not all bounce off a connection still being set
        # up; an unreachable server must not stop the worker from starting, though.
        try:
            await asyncio.wait_for(self._connected.wait(), CONNECT_TIMEOUT)
        except TimeoutError:
            log.warning(
                "nats: not connected to %s yet (%s); publishes are retried until it is",
                self._shown, self._last_error,
            )  # fmt: skip

    def _connect(self) -> None:
        """Start a client that connects in the background and then reconnects forever."""
        self._nc = Client()
        self._inbox = ""
        self._connected.clear()
        self._connecting = asyncio.create_task(self._run_connect(self._nc), name="nats connect")

    async def _run_connect(self, nc: Client) -> None:
        try:
            await nc.connect(
                self.servers,
                name=self._name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,  # never give up: the server may be down for hours
                reconnect_time_wait=self._reconnect_wait,  # type: ignore[arg-type]
                connect_timeout=CONNECT_TIMEOUT,  # type: ignore[arg-type]
                tls=self._tls,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                closed_cb=self._on_closed,
                **self._auth,  # type: ignore[arg-type]
            )
            # One subscription receives every PubAck (the client resubscribes it after a
            # reconnect), as nats-py's own requests do; each publish has its reply token.
            inbox = nc.new_inbox()
            await nc.subscribe(f"{inbox}.*", cb=self._on_reply)
        except Exception as exc:  # e.g. an unreadable credentials file: reported per publish
            self._note_error(exc)
            return
        self._inbox = f"{inbox}."
        self._connected.set()
        log.info("nats: connected to %s", self._current_url(nc))

    def _current_url(self, nc: Client) -> str:
        url = nc.connected_url
        return redact_url(url.geturl()) if url is not None else self._shown

    def _note_error(self, exc: BaseException) -> None:
        # The client's and the server's words may hold a server URL with its credentials.
        self._last_error = redact_text(
            (str(exc) or type(exc).__name__).removeprefix("nats: "),
            secrets=[value for name, value in self._auth.items() if is_secret_name(name)],
        )
        if self._last_error != self._logged_error:  # once per streak, not once per attempt
            self._logged_error = self._last_error
            log.warning("nats: %s", self._last_error)

    async def _on_error(self, exc: Exception) -> None:
        violation = _VIOLATION.search(str(exc))
        if violation is not None:
            self._permission_denied(violation[1], violation[2])
        self._note_error(exc)

    def _permission_denied(self, kind: str, subject: str) -> None:
        if kind == "subscription":
            # The only subscription is the inbox PubAcks arrive on: no publish can succeed.
            self._acks_denied = (
                f"permission denied: subscription to {subject!r}, where PubAcks arrive"
            )
        # The client lower-cases the server's -ERR line: compare subjects lower-cased too.
        for acks, index in list(self._waiting.values()):
            sent_to = acks.subjects[index]
            if kind == "subscription" or sent_to.lower() == subject:
                reason = self._acks_denied if kind == "subscription" else None
                reason = reason or f"permission denied: publish to subject {sent_to!r}"
                acks.decide(index, self._refused(reason))

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self._waiting.get(msg.subject[len(self._inbox) :])
        if waiting is not None:
            waiting[0].decide(waiting[1], msg)

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("nats: disconnected from %s; reconnecting", self._shown)

    async def _on_reconnected(self) -> None:
        self._acks_denied = None  # permissions may have changed; the next -ERR tells
        if self._nc is not None:
            log.info("nats: reconnected to %s", self._current_url(self._nc))

    async def _on_closed(self) -> None:
        # The client closes for good on some server errors; a worker must keep going.
        if not self._closing:
            log.warning("nats: connection closed (%s); connecting anew", self._last_error)
            self._connect()

    def _client(self) -> Client:
        if (
            self._connecting is not None
            and self._connecting.done()
            and not self._connected.is_set()
        ):
            self._connect()  # the last attempt gave up with an error: try again
        if self._nc is None or not self._inbox or not self._nc.is_connected:
            raise RetryableError(f"not connected to NATS ({self._shown}): {self._last_error}")
        return self._nc

    async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
        """Publish every message, then gather their PubAcks: a result per message, None when
        the stream stored it (or already had it: a duplicate), else its failure class."""
        try:
            nc = self._client()
            if self._acks_denied is not None:
                raise self._refused(self._acks_denied)
        except (PermanentError, RetryableError) as exc:
            return [exc] * len(messages)
        loop = asyncio.get_running_loop()
        acks = _Acks(len(messages), loop)
        tokens: list[str] = []
        deadline = loop.call_later(self._ack_timeout, acks.expire)
        try:
            await self._send(nc, messages, acks, tokens)
            if acks.left:
                await acks.future
        finally:
            deadline.cancel()
            waiting = self._waiting
            for token in tokens:
                waiting.pop(token, None)
        return [self._result(acks, index) for index in range(len(messages))]

    async def _send(
        self, nc: Client, messages: Sequence[Message], acks: _Acks, tokens: list[str]
    ) -> None:
        """What js.publish_async does, with the replies gathered per batch: each message goes
        out with its reply token; a PubAck, the batch's timeout or a permissions violation
        for the subject (the server drops such a message silently apart from an asynchronous
        -ERR) gives it its verdict."""
        waiting, inbox, subject_of, counter = self._waiting, self._inbox, self.subject, self._tokens
        subjects, publish, plain = acks.subjects, nc.publish, self.format == ENVELOPE
        for index, message in enumerate(messages):
            try:
                subject = subjects[index] = subject_of(message)
            except PermanentError as exc:  # a subject no server takes: this message alone
                acks.refuse(index, exc)
                continue
            token = str(next(counter))
            waiting[token] = (acks, index)
            tokens.append(token)
            acks.left += 1
            headers = {
                "Nats-Msg-Id": str(message.id),
                "Outbox-Event-Type": message.event_type,
                "Outbox-Aggregate-Type": message.aggregate_type,
                "Outbox-Aggregate-Id": message.aggregate_id,
            }
            try:
                if plain and not message.headers:
                    body = envelope(message).encode()
                else:
                    body = self._encode(message, headers)
                await publish(subject, body, reply=inbox + token, headers=headers)
            except Exception as exc:  # refused before it left, e.g. over max_payload
                del waiting[token]
                acks.refuse(index, exc, counted=True)

    def _encode(self, message: Message, headers: dict[str, str]) -> bytes:
        """The body of a message in the chosen format, its headers completed: the format's,
        then the row's own (PermanentError if one cannot be sent)."""
        row = self._row_headers.of(message)
        body, attributes = encode(message, self.format, self._cloudevents, NATS)
        headers.update(attributes)
        headers.update(row)
        return body

    def _result(self, acks: _Acks, index: int) -> Exception | None:
        """A message's verdict as its result; an exception of no known kind stays as it is:
        a bug, which the worker reports with its traceback."""
        verdict = acks.verdicts[index]
        if isinstance(verdict, Msg):
            try:
                duplicate = self._duplicate(verdict)
            except Exception as exc:
                return classify(exc, acks.subjects[index], self.no_stream)
            if duplicate:
                self._on_duplicate()  # the stream already had this id: nothing stored twice
            return None
        assert verdict is not None, "every message has a verdict once its batch is done"
        return classify(verdict, acks.subjects[index], self.no_stream)

    @staticmethod
    def _duplicate(msg: Msg) -> bool:
        """Whether the stream already had this message id; raises what the reply says went
        wrong (classified by the caller)."""
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS:
            raise NoStreamResponseError
        answer = json.loads(msg.data)  # ValueError: not JSON, so not a stream
        if not isinstance(answer, dict):
            raise TypeError(f"not a PubAck: {msg.data[:100]!r}")
        if "error" in answer:
            raise APIError.from_error(answer["error"])
        # The fields a PubAck must have, checked without building nats-py's PubAck (reading
        # it field by field cost more than the rest of the reply's handling).
        if "stream" not in answer or "seq" not in answer:
            raise TypeError(f"not a PubAck: {msg.data[:100]!r}")
        return answer.get("duplicate") is True

    def _refused(self, reason: str) -> Exception:
        return _no_stream(reason, self.no_stream)

    async def close(self) -> None:
        self._closing = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()
