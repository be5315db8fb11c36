"""The history checker still holds with `--format cloudevents-binary`: workers SIGKILLed after
a claim and after a publish, every delivery a CloudEvent whose `ce-id` is the outbox id (the
`cloudevents` SDK parses each request the sink recorded)."""

from __future__ import annotations

import json

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat

from chaos.cluster import Run, assert_clean
from chaos.downstream import Call
from chaos.test_scenarios import Trap, _milestones
from outbox.demo.sink import Reply

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_sigkill_workers_with_cloudevents_binary(new_run, dsn, scale, rng):
    total, kills = 150 * scale, 2 * scale
    trap = Trap()
    run: Run

    def script(call: Call) -> Reply:
        if trap.take(call, run.live()):
            run.kill(call.worker)  # published, never finalized
            trap.sprung.set()
        return Reply()

    run = new_run(
        "cloudevents-sigkill", dsn, script=script, worker_args=("--format", "cloudevents-binary")
    )
    for _ in range(3):
        run.spawn()
    run.produce(total, aggregates=20, seconds=2 + kills)
    for k, done in enumerate(_milestones(total, kills)):
        run.wait_progress(done)
        if k % 2 == 0:
            trap.arm()
            run.wait_for(trap.sprung.is_set, "the trap to kill a worker mid-request")
        else:
            run.kill(rng.choice(run.live()))
        run.spawn()
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    assert any(r.startswith("worker SIGKILLed") for r in verdict.reasons), verdict.reasons
    requests = run.sink.requests
    assert len(requests) >= total
    for request in requests:
        headers = request.headers
        event = from_http(HTTPMessage(headers, json.dumps(request.body).encode()), JSONFormat())
        assert event.get_id() == request.key == headers["Idempotency-Key"]
        assert event.get_type() == "OrderChanged" and event.get_source() == "/outbox/outbox"
        assert set(request.body) == {"n", "pad"}  # the payload itself, not an envelope
