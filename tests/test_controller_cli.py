"""`outbox-controller` at start: the leader-election timings it refuses, and the Lease's
namespace outside a cluster (the kubeconfig's current context, as kubectl and `kopf run` read
it)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from helpers import dropping_one_cancellation, wait_until
from kubernetes.aio.client import ApiClient, Configuration

from outbox.controller.leader import LeaderElector, LeaseThread
from outbox.controller.settings import ControllerSettings, load_settings
from outbox.plumbing.errors import SettingError


def _kubeconfig(path: Path, namespace: str | None, *, current: str = "dev") -> Path:
    context = {"cluster": "local", "user": "me"} | ({"namespace": namespace} if namespace else {})
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": current, "context": context}],
                "current-context": current,
            }
        )
    )
    return path


def test_outside_a_cluster_the_lease_goes_to_the_kubeconfigs_current_namespace(
    tmp_path: Path,
) -> None:
    config = _kubeconfig(tmp_path / "config", "shop-dev")
    settings = load_settings([], {"KUBECONFIG": str(config)})
    assert settings.leader_election_namespace == "shop-dev"
    # ~/.kube/config when KUBECONFIG is unset, as the client reads it.
    (tmp_path / ".kube").mkdir()
    _kubeconfig(tmp_path / ".kube" / "config", "from-home")
    assert load_settings([], {"HOME": str(tmp_path)}).leader_election_namespace == "from-home"


def test_a_context_without_a_namespace_means_default_as_for_kubectl(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config", None)
    assert load_settings([], {"KUBECONFIG": str(config)}).leader_election_namespace == "default"


def test_several_kubeconfig_files_merge_and_the_last_current_context_wins(tmp_path: Path) -> None:
    first = _kubeconfig(tmp_path / "a", "first", current="a")
    second = _kubeconfig(tmp_path / "b", "second", current="b")
    env = {"KUBECONFIG": f"{first}:{second}"}
    assert load_settings([], env).leader_election_namespace == "second"


def test_the_flag_and_pod_namespace_come_before_the_kubeconfig(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(_kubeconfig(tmp_path / "config", "shop-dev"))}
    flag = ["--leader-election-namespace", "ops"]
    assert load_settings(flag, env).leader_election_namespace == "ops"
    pod = load_settings([], {**env, "POD_NAMESPACE": "outbox-system"})
    assert pod.leader_election_namespace == "outbox-system"


def test_in_a_pod_the_kubeconfig_is_not_read_and_the_namespace_is_still_required(
    tmp_path: Path,
) -> None:
    env = {
        "KUBECONFIG": str(_kubeconfig(tmp_path / "config", "shop-dev")),
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    with pytest.raises(SettingError, match="--leader-election-namespace"):
        load_settings([], env)


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("", "file is empty"),
        ("users:\n- user: {token: s3cret: x}\n", "not YAML at line 2"),
        ("- a\n", "not a kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", "current-context"),
    ],
    ids=["empty", "bad", "list", "bare"],
)
def test_an_unusable_kubeconfig_says_what_to_set_and_what_is_wrong(
    tmp_path: Path, text: str, fault: str
) -> None:
    config = tmp_path / "config"
    config.write_text(text)
    with pytest.raises(SettingError) as refused:
        load_settings([], {"KUBECONFIG": str(config)})
    said = str(refused.value)
    assert said.startswith("--leader-election-namespace ") and "kubeconfig" in said
    assert f"the kubeconfig {config} is unusable" in said and fault in said
    assert "s3cret" not in said  # PyYAML's own message quotes the text around the fault


def test_a_missing_kubeconfig_is_named_not_reported_as_a_bad_one(tmp_path: Path) -> None:
    with pytest.raises(SettingError) as refused:
        load_settings([], {"KUBECONFIG": str(tmp_path / "missing")})
    assert str(refused.value).endswith(f"; no kubeconfig at {tmp_path / 'missing'}")
    with pytest.raises(SettingError) as refused:
        load_settings([], {})
    assert str(refused.value).endswith("; neither KUBECONFIG nor HOME is set")
    # A missing file in a list is skipped, as kubectl skips it.
    present = _kubeconfig(tmp_path / "config", "shop-dev")
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{present}"}
    assert load_settings([], env).leader_election_namespace == "shop-dev"


def test_a_server_url_with_user_info_beside_a_token_exits_2_without_showing_either(
    tmp_path: Path,
) -> None:
    config = _kubeconfig(tmp_path / "config", "shop-dev")
    config.write_text(
        config.read_text()
        .replace("https://127.0.0.1:1", "https://alice:pa55word@127.0.0.1:1")
        .replace("token: t", "token: tok-s3cret")
    )
    result = subprocess.run(
        [sys.executable, "-m", "outbox.controller", "--health-port=0"],
        capture_output=True,
        text=True,
        env={"KUBECONFIG": str(config), "PATH": ""},
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    said = result.stderr.splitlines()[-1]  # after the start's log records, one line
    assert "Traceback" not in result.stderr, result.stderr
    assert said.startswith("outbox-controller: error: ") and said.endswith(
        "remove the user-info from the server URL"
    )
    assert "pa55word" not in result.stderr + result.stdout
    assert "s3cret" not in result.stderr + result.stdout


def test_a_lease_shorter_than_the_renew_deadline_exits_2_naming_both_flags(
    tmp_path: Path,
) -> None:
    # The chart's leaseDuration: 5s with renewDeadline: 10s, as the operator would get it.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "outbox.controller",
            "--lease-duration=5s",
            "--renew-deadline=10s",
            "--retry-period=2s",
        ],
        capture_output=True,
        text=True,
        env={"POD_NAMESPACE": "ns", "PATH": ""},
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--renew-deadline 10s" in result.stderr and "--lease-duration 5s" in result.stderr


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (
            ["--lease-duration=10s", "--renew-deadline=10s"],
            ("--renew-deadline", "--lease-duration"),
        ),
        (["--renew-deadline=2s", "--retry-period=2s"], ("--retry-period", "--renew-deadline")),
    ],
)
def test_equal_timings_are_refused_too(argv: list[str], names: tuple[str, ...]) -> None:
    with pytest.raises(SettingError) as refused:
        load_settings(argv, {"POD_NAMESPACE": "ns"})
    assert all(name in str(refused.value) for name in names), refused.value


async def test_the_leases_whole_seconds_never_undercut_the_renew_deadline() -> None:
    # 1.4s held as 1s would let a follower take over while the leader may still act (1.2s).
    settings = load_settings(
        ["--lease-duration=1400ms", "--renew-deadline=1200ms", "--retry-period=200ms"],
        {"POD_NAMESPACE": "ns"},
    )
    api = ApiClient()
    try:
        lease = LeaderElector(api, settings)._new_lease("2026-01-01T00:00:00.000000Z")
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    assert lease["spec"]["leaseDurationSeconds"] >= settings.renew_deadline / timedelta(seconds=1)
    assert lease["spec"]["leaseDurationSeconds"] == 2


async def test_an_api_server_that_hangs_up_mid_request_is_unreachable_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A connection closed before any answer (a proxy, an API server restarting) is aiohttp's
    # ServerDisconnectedError, no OSError: the replica keeps trying to lead.
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = Configuration(host=f"http://127.0.0.1:{port}")
    api = ApiClient(configuration)
    settings = load_settings(
        ["--lease-duration=3s", "--renew-deadline=2s", "--retry-period=100ms"],
        {"POD_NAMESPACE": "ns"},
    )
    stop = asyncio.Event()
    try:
        acquiring = asyncio.create_task(LeaderElector(api, settings).acquire(stop))
        await wait_until(lambda: acquiring.done() or "Server disconnected" in caplog.text)
        stop.set()
        assert await acquiring is False
    finally:
        await api.close()  # type: ignore[no-untyped-call]
        server.close()
    assert "lease ns/outbox-controller: Server disconnected" in caplog.text


class AnsweredOnCue(LeaderElector):
    """A leader whose renewals the test answers: each waits until `answer` is given."""

    def __init__(self, api: ApiClient, settings: ControllerSettings) -> None:
        super().__init__(api, settings)
        self._renewed_at = time.monotonic()  # leading
        self.asked = asyncio.Event()
        self.answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def _try(self) -> bool:
        self.asked.set()
        renewed = await self.answer
        self.answer = asyncio.get_running_loop().create_future()
        self._renewed_at = time.monotonic()
        return renewed


FAST_RENEWALS = ["--lease-duration=3s", "--renew-deadline=2s", "--retry-period=10ms"]


async def test_renewing_ends_when_cancelled_as_a_renewal_is_answered() -> None:
    # A hand-over cancels the renewing; a renewal answered at that moment must not keep it
    # renewing (asyncio.wait_for on Python 3.11 drops such a cancellation, gh-86296).
    settings = load_settings(FAST_RENEWALS, {"POD_NAMESPACE": "ns"})
    api = ApiClient()
    try:
        elector = AnsweredOnCue(api, settings)
        holding = asyncio.create_task(elector.hold())
        await elector.asked.wait()
        elector.answer.set_result(True)
        holding.cancel()
        done, _ = await asyncio.wait({holding}, timeout=2)
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    assert done and holding.cancelled()


async def test_the_hand_over_ends_renewals_that_dropped_their_cancellation() -> None:
    settings = load_settings(FAST_RENEWALS, {"POD_NAMESPACE": "ns"})
    elector = LeaseThread(Configuration(host="http://127.0.0.1:1"), settings)

    async def renew() -> asyncio.Task[None]:
        elector._holding = asyncio.create_task(dropping_one_cancellation())
        return elector._holding

    holding = await elector._run(renew())
    async with asyncio.timeout(5):
        await elector.close()
    assert holding.cancelled()
