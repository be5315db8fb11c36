"""Leader election with a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does.

Only the leader acts. A follower takes the Lease once it has seen no renewal for a whole
`lease_duration` (measured on its own monotonic clock from when it last saw the record change,
so clocks need not agree). The leader renews every `retry_period`; if it could not renew for
`renew_deadline` (shorter than the lease duration) it has lost: it stops acting and the process
exits, so the pod restarts as a follower. Every write of the operator first asks `check()`,
so a leader that was frozen (SIGSTOP, a long GC pause, a partition) and wakes up past its
deadline refuses to write before it even notices the loss: two replicas never both act.

`LeaseThread` runs the elector on a thread and event loop of its own, with its own
connections: the operator's loop may be as busy as its fleet makes it, a renewal never
waits behind that work (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes.aio.client import ApiClient, Configuration, CoordinationV1Api, V1Lease
from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.kube import TIMEOUT, UNREACHABLE, api_reason
from outbox.controller.settings import ControllerSettings
from outbox.plumbing.waiting import cancel_and_wait

log = logging.getLogger("outbox.controller")
T = TypeVar("T")


class LeadershipLost(Exception):
    """This replica may no longer act: its Lease may have been taken over."""


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease(data: dict[str, Any]) -> V1Lease:
    lease = V1Lease.from_dict(data)
    assert lease is not None
    return lease


@dataclass
class _Observed:
    holder: str
    record: tuple[Any, ...]  # what changes on every renewal
    seen_at: float  # monotonic time this record was first seen


class LeaderElector:
    def __init__(self, api: ApiClient, settings: ControllerSettings) -> None:
        self.api = api
        self._leases = CoordinationV1Api(api)
        self._namespace = settings.leader_election_namespace
        self._name = settings.leader_election_id
        self.identity = settings.leader_identity
        self._duration = settings.lease_duration.total_seconds()
        self._deadline = settings.renew_deadline.total_seconds()
        self._period = settings.retry_period.total_seconds()
        # The Lease holds whole seconds: rounded up, so a follower never waits less than the
        # leader's renew deadline (15.4s rounded to 15 would let a 15.2s deadline overlap).
        self._duration_seconds = max(1, math.ceil(self._duration))
        self._observed: _Observed | None = None
        self._renewed_at: float | None = None  # monotonic, of the last successful write

    # -- the fence ------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and time.monotonic() - renewed < self._deadline

    def check(self) -> None:
        """Raise LeadershipLost unless this replica renewed within the renew deadline."""
        if not self.leading:
            raise LeadershipLost(f"{self.identity} does not hold lease {self._name} any more")

    # -- acquiring and renewing -----------------------------------------------------------------

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True), or until `stop` is set (False)."""
        log.info("waiting to lead: lease %s/%s as %s", self._namespace, self._name, self.identity)
        while not stop.is_set():
            if await self._try():
                log.info("leading: acquired lease %s/%s", self._namespace, self._name)
                return True
            # asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for drops a
            # cancellation that comes with its result (gh-86296), and the loop would go on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._period):
                    await stop.wait()
        return False

    async def hold(self) -> None:
        """Renew until the renew deadline passes without a renewal; then return (lost)."""
        while True:
            await asyncio.sleep(self._period)
            if not self.leading:
                break
            started = time.monotonic()
            # Not asyncio.wait_for (see acquire): a renewal answered as the hand-over cancels
            # the renewing would have kept it renewing, and the hand-over waiting for it.
            try:
                async with asyncio.timeout(self._deadline):
                    renewed = await self._try()
            except TimeoutError:
                renewed = False
            if not renewed and time.monotonic() - started > self._deadline:
                break
            if not self.leading:
                break
        log.error(
            "lost lease %s/%s (no renewal for %.1fs): stopping",
            self._namespace,
            self._name,
            self._deadline,
        )

    async def release(self) -> None:
        """On a clean shutdown, hand the Lease over at once instead of after its duration."""
        if not self.leading:
            return
        try:
            lease = await self._leases.read_namespaced_lease(self._name, self._namespace, **TIMEOUT)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            body = self._api_client_dict(lease)
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            body["spec"]["renewTime"] = _micro_time(datetime.now(UTC))
            await self._leases.replace_namespaced_lease(
                self._name, self._namespace, _lease(body), **TIMEOUT
            )
            log.info("released lease %s/%s", self._namespace, self._name)
        except (ApiException, *UNREACHABLE) as exc:
            log.warning("could not release lease %s/%s: %s", self._namespace, self._name, exc)
        finally:
            self._renewed_at = None

    def _api_client_dict(self, lease: Any) -> dict[str, Any]:
        data: dict[str, Any] = self._leases.api_client.sanitize_for_serialization(lease)
        data.setdefault("spec", {})
        return data

    async def _try(self) -> bool:
        """One attempt to take or renew the Lease; True if this replica now holds it."""
        attempt_started = time.monotonic()
        now = _micro_time(datetime.now(UTC))
        try:
            try:
                lease = await self._leases.read_namespaced_lease(
                    self._name, self._namespace, **TIMEOUT
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                await self._leases.create_namespaced_lease(
                    self._namespace, _lease(self._new_lease(now)), **TIMEOUT
                )
                self._renewed_at = attempt_started
                return True
            body = self._api_client_dict(lease)
            spec = body["spec"]
            holder = spec.get("holderIdentity") or ""
            record = (
                holder,
                spec.get("renewTime"),
                spec.get("leaseTransitions"),
                body["metadata"].get("resourceVersion"),
            )
            if self._observed is None or self._observed.record != record:
                self._observed = _Observed(holder, record, attempt_started)
            duration = float(spec.get("leaseDurationSeconds") or self._duration)
            if holder and holder != self.identity:
                if self._renewed_at is not None:
                    log.error("lease %s/%s is held by %s now", self._namespace, self._name, holder)
                    self._renewed_at = None  # taken over: stop acting at once
                if attempt_started - self._observed.seen_at < duration:
                    return False  # someone else renews: follow
                log.info(
                    "lease %s/%s held by %s expired: taking it", self._namespace, self._name, holder
                )
            if holder != self.identity:
                spec["acquireTime"] = now
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec["holderIdentity"] = self.identity
            spec["leaseDurationSeconds"] = self._duration_seconds
            spec["renewTime"] = now
            # resourceVersion in the body: a concurrent writer makes this a 409, not a tie.
            await self._leases.replace_namespaced_lease(
                self._name, self._namespace, _lease(body), **TIMEOUT
            )
        except ApiException as exc:
            if exc.status != 409:
                # The server's own reason (a 403 names the permission it lacks).
                log.warning("lease %s/%s: %s", self._namespace, self._name, api_reason(exc))
            return False
        except UNREACHABLE as exc:
            log.warning("lease %s/%s: %s", self._namespace, self._name, exc or type(exc).__name__)
            return False
        # The lease counts from before the request: the deadline errs on the safe side.
        self._renewed_at = attempt_started
        return True

    def _new_lease(self, now: str) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }


class LeaseThread:
    """A LeaderElector on a thread and an event loop of its own, with its own API connections.

    The operator's event loop serves every resource it watches; a renewal queued behind that
    work could miss the renew deadline, and a leader that loses its Lease because it is busy
    exits and restarts into the same load: a crash loop that stops the whole fleet's scaling.
    A real API server gives Lease traffic a priority level of its own; this is the operator's
    side of it. Here the renewal never waits for the operator's loop, only for the interpreter
    (which a busy thread yields every `sys.getswitchinterval()`, 5 ms). `leading` and `check`
    are read from the operator's loop: one float written by this thread, read whole.
    """

    def __init__(self, configuration: Configuration, settings: ControllerSettings) -> None:
        self.identity = settings.leader_identity
        self._configuration = configuration
        self._settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lease", daemon=True)
        self._thread.start()
        self._elector: LeaderElector = self._run_sync(self._open())
        self._stop = asyncio.Event()  # of the lease loop; set through call_soon_threadsafe
        self._holding: asyncio.Task[None] | None = None  # of the lease loop, once leading

    async def _open(self) -> LeaderElector:
        return LeaderElector(ApiClient(self._configuration), self._settings)

    def _run_sync(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    async def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the lease loop; cancelling the caller cancels it there too."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    @property
    def leading(self) -> bool:
        return self._elector.leading

    def check(self) -> None:
        self._elector.check()

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True), or until `stop` is set (False). From the
        moment it leads, the lease thread renews by itself, whatever this loop does next."""
        acquiring = asyncio.ensure_future(self._run(self._acquire_and_hold()))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not acquiring.done():
                self._loop.call_soon_threadsafe(self._stop.set)
            return await acquiring
        finally:
            stopping.cancel()

    async def _acquire_and_hold(self) -> bool:
        if not await self._elector.acquire(self._stop):
            return False
        self._holding = asyncio.create_task(self._elector.hold(), name="lease renewal")
        return True

    async def hold(self) -> None:
        """Return once the Lease is lost (the renewals began when it was acquired)."""
        await self._run(self._until_lost())

    async def _until_lost(self) -> None:
        assert self._holding is not None, "hold() before acquire()"
        await asyncio.shield(self._holding)  # a caller that stops waiting leaves it renewing

    async def close(self) -> None:
        """Hand the Lease over (if held), close the connections and end the thread."""
        try:
            await self._run(self._release())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
            self._loop.close()

    async def _release(self) -> None:
        if self._holding is not None:
            # Renewing stops before the hand-over; cancelled again should a library under it
            # drop the cancellation (as asyncio.wait_for does on Python 3.11).
            await cancel_and_wait([self._holding])
        try:
            await self._elector.release()
        finally:
            await self._elector.api.close()  # type: ignore[no-untyped-call]
