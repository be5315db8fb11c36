"""Live refresh that never blocks the UI and never overlaps itself.

A `Poller` is an invisible widget mounted in the screen it refreshes. Each poll runs as a
Textual worker (`@work`, an asyncio task on the app's loop: the database calls are async,
so the UI stays responsive while they wait). The next poll is scheduled only when the last
one has finished, so a slow query stretches the interval instead of piling up queries; a
"refresh now" during a poll runs one more poll right after it instead of a second one at
the same time.

Database errors (and a table in a shape it cannot be read in) do not stop the poller: they
are reported (`Poller.Polled` with the error, shown in the status line) and the next poll,
on a fresh connection, is the reconnect.
Anything else is a bug and is left to crash the app loudly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual import work
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget
from textual.worker import Worker

from outbox.schema import SchemaError
from outbox.tui.errors import DATABASE_ERRORS

# What a poll reports and survives: the database's errors, and a table in a shape it cannot
# be read in (a partition whose bound is not a range of ids, met where a read looks the
# partitions up), which someone may fix while the app runs.
POLL_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, SchemaError)


class Poller(Widget):
    DEFAULT_CSS = "Poller { display: none; }"

    class Polled(Message):
        """A poll finished; `error` is None when it succeeded."""

        def __init__(self, poller: Poller, error: BaseException | None) -> None:
            super().__init__()
            self.poller = poller
            self.error = error

    def __init__(
        self,
        fetch: Callable[[], Awaitable[None]],
        *,
        interval: Callable[[], float | None],
        name: str | None = None,
    ) -> None:
        """`fetch` loads and shows data; `interval` says how long to wait before the next
        poll, None meaning paused."""
        super().__init__(name=name)
        self._poll_fetch = fetch
        self._poll_interval = interval
        self._next_poll: Timer | None = None
        self._in_flight = False
        self._poll_again = False
        self._poll_worker: Worker[None] | None = None
        # (Names are prefixed: Textual's own MessagePump uses `_running`, `_timers`, ...)
        self._poll_ready = False

    def on_mount(self) -> None:
        # After the screen's first refresh: by then every widget the fetch fills is mounted
        # (nested containers mount their children after their siblings' Mount events).
        self.call_after_refresh(self._start)

    def _start(self) -> None:
        self._poll_ready = True
        self.poll_now()

    def poll_now(self) -> None:
        """Poll at once (or right after the poll in flight), then resume the schedule."""
        if not self._poll_ready:
            return  # on_mount polls; a worker started before that would never run
        if self._in_flight and self._poll_worker is not None and self._poll_worker.is_finished:
            self._in_flight = False  # cancelled before it started: its `finally` never ran
        if self._in_flight:
            self._poll_again = True
            return
        self._cancel_timer()
        self._in_flight = True
        self._poll_worker = self._poll()

    def resume(self) -> None:
        """The screen is shown again: poll unless a poll is already due or in flight."""
        if not self._in_flight:
            self.poll_now()

    def reschedule(self) -> None:
        """Apply a new interval or a pause/resume to the wait in progress."""
        if not self._in_flight:
            self._cancel_timer()
            self._schedule()

    def _cancel_timer(self) -> None:
        if self._next_poll is not None:
            self._next_poll.stop()
            self._next_poll = None

    def _schedule(self) -> None:
        delay = self._poll_interval()
        # A screen kept installed but not shown (popped) stops polling; `resume` restarts it.
        shown = self.is_attached and self.screen in self.app.screen_stack
        if delay is not None and shown:
            self._next_poll = self.set_timer(delay, self.poll_now, name=f"poll {self.name}")

    @work(group="poll", exit_on_error=True)
    async def _poll(self) -> None:
        error: BaseException | None = None
        try:
            await self._poll_fetch()
        except POLL_ERRORS as exc:
            error = exc
        finally:
            self._in_flight = False
        self.post_message(self.Polled(self, error))
        if self._poll_again:
            self._poll_again = False
            self.poll_now()
        else:
            self._schedule()
