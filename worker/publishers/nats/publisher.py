"""The NATS publisher: a batch published at once, a result per message from its PubAck."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from outbox.models import REPLAY_HEADER, Message
from outbox.plumbing.redact import is_secret_name, redact_text, redact_url
from outbox.plumbing.waiting import cancel_and_wait
from outbox.publisher_options import Carried, Field, Option
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
from outbox.worker.publishers.nats.acks import BatchAcks
from outbox.worker.publishers.nats.config import (
    DEFAULT_URL,
    auth_of,
    creds_file,
    readable_dir,
    readable_file,
    server_urls,
    servers_of,
    tls_context,
    tls_files,
)
from outbox.worker.publishers.nats.errors import (
    DEFAULT_NO_STREAM,
    PERMISSION_VIOLATION,
    classify,
    is_duplicate,
    no_stream_error,
    no_stream_policy,
)
from outbox.worker.publishers.nats.subjects import (
    DEFAULT_SUBJECT,
    SUBJECT_CACHE_SIZE,
    render_subject,
    subject_template,
    subject_token,
)
from outbox.worker.publishers.registry import PublisherContext
from outbox.worker.publishers.template import Renderings, Template

log = logging.getLogger("outbox.worker")

RECONNECT_WAIT = 2.0  # seconds between attempts on one server (the client's default)
CONNECT_TIMEOUT = 2.0  # one TCP + handshake attempt; also how long start() waits for it


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
            fields=(Field("urls", Carried.LINES),),
        ),
        Option(
            "--nats-subject",
            "subject template; placeholders {aggregate_type}, {aggregate_id}, {event_type} "
            f"(default {DEFAULT_SUBJECT})",
            convert=subject_template,
            default=DEFAULT_SUBJECT,
            fields=(Field("subject"),),
        ),
        Option(
            "--nats-creds",
            "NATS credentials file (JWT + nkey seed)",
            convert=creds_file,
            fields=(Field("credsSecretRef", Carried.SECRET_FILE),),
        ),
        Option(
            "--nats-user",
            "NATS user name; never logged",
            secret=True,
            fields=(Field("userSecretRef", Carried.SECRET_KEY),),
        ),
        Option(
            "--nats-password",
            "NATS password; never logged",
            secret=True,
            fields=(Field("passwordSecretRef", Carried.SECRET_KEY),),
        ),
        Option(
            "--nats-token",
            "NATS authentication token; never logged",
            secret=True,
            fields=(Field("tokenSecretRef", Carried.SECRET_KEY),),
        ),
        # A resource names one TLS Secret, mounted whole (--nats-tls-dir): these are for
        # workers run by hand.
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
            fields=(Field("tlsSecretName", Carried.SECRET_DIR),),
        ),
        Option(
            "--nats-no-stream",
            "no stream for the subject, or permission denied: dead (default) or retry",
            convert=no_stream_policy,
            default=DEFAULT_NO_STREAM,
            fields=(Field("noStream"),),
        ),
    )

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> NatsPublisher:
        servers = servers_of(values)
        auth = auth_of(values)
        return cls(
            servers,
            subject=values.get("nats_subject") or DEFAULT_SUBJECT,
            no_stream=values.get("nats_no_stream") or DEFAULT_NO_STREAM,
            # Our own deadline fires just before the loop's, so a lost PubAck is reported as
            # such rather than as a generic publish timeout.
            ack_timeout=context.publish_timeout * 0.9,
            name=context.owner,
            on_duplicate=context.count_broker_duplicate,
            tls=tls_context(**tls_files(values)),
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
        self.destination = f"nats {self._shown}"  # the cluster: its servers share one breaker
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
        self._waiting: dict[str, tuple[BatchAcks, int]] = {}
        self._tokens = itertools.count()
        self._acks_denied: str | None = None
        # Rendering a subject is three regex substitutions; messages of one aggregate type and
        # event type share theirs (and the aggregate id, when the template uses it).
        template = Template(self.subject_template, subject_token)
        self._subjects = Renderings(template, partial(render_subject, template), SUBJECT_CACHE_SIZE)

    def subject(self, message: Message) -> str:
        return self._subjects.of(message)

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
        violation = PERMISSION_VIOLATION.search(str(exc))
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
        acks = BatchAcks(len(messages), loop)
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
        self, nc: Client, messages: Sequence[Message], acks: BatchAcks, tokens: list[str]
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
            if message.replay is not None:
                headers[REPLAY_HEADER] = str(message.replay)
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

    def _result(self, acks: BatchAcks, index: int) -> Exception | None:
        """A message's verdict as its result; an exception of no known kind stays as it is:
        a bug, which the worker reports with its traceback."""
        verdict = acks.verdicts[index]
        if isinstance(verdict, Msg):
            try:
                duplicate = is_duplicate(verdict)
            except Exception as exc:
                return classify(exc, acks.subjects[index], self.no_stream)
            if duplicate:
                self._on_duplicate()  # the stream already had this id: nothing stored twice
            return None
        assert verdict is not None, "every message has a verdict once its batch is done"
        return classify(verdict, acks.subjects[index], self.no_stream)

    def _refused(self, reason: str) -> Exception:
        return no_stream_error(reason, self.no_stream)

    async def close(self) -> None:
        self._closing = True
        if self._connecting is not None:
            # It connects until it succeeds, for ever while the server is unreachable: cancelled
            # again should it drop the cancellation (nats-py waits for the server with
            # asyncio.wait_for, which on Python 3.11 drops one that comes with the answer).
            await cancel_and_wait([self._connecting])
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()
