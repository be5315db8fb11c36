"""One librdkafka producer polled by the event loop, and the delivery reports of a batch."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outbox.models import Message
from outbox.worker.publishers.kafka.errors import (
    _error_of,
    _fatal_in,
    log,
)

# The fate of a message whose delivery report never came (its producer was replaced).
_UNKNOWN = KafkaError(KafkaError._FATAL, "producer replaced before delivery was reported")
# Seconds between the loop's poll(0) calls while batches await delivery reports: a report
# waits at most this long once librdkafka has it. A poll thread instead cost ~1 µs per message
# more in CPU (bench/results/brokers.md); at 1 ms the extra loop iterations ate the gain.
POLL_BUSY = 0.003
# ... and while none do: librdkafka's log lines and errors are still served.
POLL_IDLE = 0.1


class _Batch:
    """The delivery reports of messages produced together, on one producer.

    One callback serves the whole batch (no object per message): a success is only
    counted; a failure, rare, is placed by the outbox id at the start of the message's
    value (the envelope's first field: delivery reports carry the value, not the headers).
    A CloudEvent's value holds no id where it can be read cheaply: each of its messages gets
    a callback of its own that knows its place (`report_at`).
    The last report completes `future`. Reports run on the loop (its poll(0) calls), or on
    the thread closing the session; the future is touched on the loop alone.
    """

    __slots__ = (
        "_index",
        "_loop",
        "_loop_thread",
        "end",
        "failed",
        "first",
        "future",
        "messages",
        "produced",
        "reported",
        "results",
        "unplaced",
    )

    def __init__(
        self,
        messages: Sequence[Message],
        results: list[Any],
        first: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.messages = messages
        self.results = results  # the call's: None for a message produced and not failed
        self.first = self.end = first  # the slots [first, end) are this batch's
        self.produced = -1  # not known until every message of the batch is produced
        self.reported = 0
        self.failed = 0
        # A failure that could not be placed: every message of the batch is then in doubt.
        self.unplaced: KafkaError | None = None
        self.future: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop
        self._index: dict[int, int] | None = None

    def report(self, error: KafkaError | None, message: Any) -> None:
        # Inside poll() or flush(). Anything raised here would surface from them: a failure
        # that cannot be placed is kept, not raised. Called once per message: `_reported`
        # written out here, one Python call per report instead of two.
        if error is not None:
            self._place(error, message)
        self.reported += 1
        if self.reported == self.produced:
            self._reported_all()

    def report_at(self, index: int, error: KafkaError | None, message: Any) -> None:
        """`report` for the message at `index` of the call's results."""
        if error is not None:
            self.failed += 1
            self.results[index] = error
        self._reported()

    def _reported(self) -> None:
        self.reported += 1
        if self.reported == self.produced:
            self._reported_all()

    def _reported_all(self) -> None:
        if threading.get_ident() == self._loop_thread:
            self.complete()
        else:  # the thread closing the session
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self.complete)

    def _place(self, error: KafkaError, message: Any) -> None:
        self.failed += 1
        try:
            value = message.value()
            outbox_id = int(value[6 : value.index(b",", 6)])  # {"id":123,...
            if self._index is None:
                self._index = {m.id: i for i, m in enumerate(self.messages)}
            self.results[self._index[outbox_id]] = error
        except Exception:
            self.unplaced = error

    def seal(self, end: int, produced: int) -> None:
        """Loop: every message of the batch was handed to librdkafka (or refused at once)."""
        self.end = end
        self.produced = produced
        if self.reported == produced:  # all reported already, or nothing produced
            self.complete()

    def complete(self) -> None:
        if not self.future.done():  # a batch past the publish timeout was cancelled
            self.future.set_result(None)

    def in_doubt(self, error: KafkaError) -> None:
        """Loop, once the batch is complete or its producer gone: if a report was lost or
        could not be placed, every message not known to have failed gets `error` (sent
        again: a duplicate at worst, never a message marked done that was not)."""
        if self.unplaced is None and self.reported >= self.produced:
            return
        results, error = self.results, self.unplaced or error
        doubtful = [i for i in range(self.first, self.end) if results[i] is None]
        log.warning(
            "kafka: a batch's delivery reports are missing or could not be placed; its %d "
            "messages not known to have failed are sent again (%s)", len(doubtful), error.str(),
        )  # fmt: skip
        for index in doubtful:
            results[index] = error
        self.failed += len(doubtful)
        self.unplaced, self.reported = None, self.produced  # told once


class _Session:
    """One librdkafka producer, polled by the event loop.

    A timer on the loop calls poll(0): every POLL_BUSY seconds while batches await their
    reports, every POLL_IDLE otherwise. The delivery callbacks only fill their batch's
    results; a batch's last report completes it.
    """

    def __init__(
        self,
        config: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[_Session], object],
    ) -> None:
        self.producer = Producer(config)
        self.fatal: KafkaError | None = None
        self.loop = loop
        # Batches with reports still to come (the loop's alone: added when produced,
        # dropped once complete), so that a retired producer can end them.
        self.pending: set[_Batch] = set()
        self._on_fatal = on_fatal
        self._timer: asyncio.TimerHandle | None = loop.call_later(POLL_IDLE, self._poll)

    def track(self, batch: _Batch) -> None:
        if not batch.future.done():
            self.pending.add(batch)
            batch.future.add_done_callback(lambda _: self.pending.discard(batch))
            timer = self._timer
            if timer is not None and timer.when() > self.loop.time() + POLL_BUSY:
                timer.cancel()  # idle cadence: reports are now awaited
                self._timer = self.loop.call_later(POLL_BUSY, self._poll)

    def _poll(self) -> None:
        try:
            self.producer.poll(0)
        except Exception as exc:
            fatal = _fatal_in(exc)
            if fatal is None:
                log.error("kafka poll failed: %r", exc)
            elif self.fatal is None:
                self.fatal = fatal
                log.error("kafka producer fatal error: %s", fatal.str())
                self.loop.call_soon(self._on_fatal, self)
        if self._timer is not None:  # not stopped meanwhile
            self._timer = self.loop.call_later(POLL_BUSY if self.pending else POLL_IDLE, self._poll)

    def stop(self) -> None:
        """Loop: no more polling from the loop (close() then serves the reports)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self, timeout: float) -> None:
        """Blocking, off the loop, after stop(): deliver what is queued within `timeout`,
        purge the rest."""
        try:
            left = self.producer.flush(timeout)
            if left:
                log.warning("kafka: %d messages not delivered within %.1fs, purged", left, timeout)
                self.producer.purge()
                self.producer.flush(1.0)  # serves the purged messages' delivery reports
        except KafkaException as exc:
            log.warning("kafka: flush on close failed: %s", _error_of(exc).str())
        # Producer.close() (confluent-kafka 2.13+) flushes without a bound, so only once empty;
        # otherwise, or on older versions, dropping the last reference destroys the client.
        close = getattr(self.producer, "close", None)
        if close is not None and len(self.producer) == 0:
            close()
