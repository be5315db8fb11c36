"""Nothing secret is ever echoed: one table of hostile values (tests/hostile.py) through the
masking functions, the publishers' options, `outbox stats`, `outbox-tui`'s settings and real
`outbox-worker` processes (their usage errors, start-up line and database error logs). The
operator's status, Events and log: tests/k8s/test_operator_secrets.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile import (
    DSNS,
    HEADER_SECRETS,
    HEADERS,
    JWT,
    KAFKA_CONFIG,
    KAFKA_SECRETS,
    NATS_CREDS,
    NATS_OPTIONS,
    NATS_SECRETS,
    NKEY_SEED,
    PEM_KEY,
    TEXTS,
    URLS,
    Hostile,
    assert_no_leak,
    leaks,
)

from outbox import cli as outbox_cli
from outbox.demo.embedded import free_port
from outbox.plumbing.dsn import check_dsn
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import (
    MASK,
    UNPARSEABLE_DSN,
    describe_dsn,
    dsn_label,
    is_secret_name,
    mask_values,
    redact_dsn,
    redact_mapping,
    redact_text,
    redact_url,
)
from outbox.tui import config as tui_config
from outbox.worker import cli as worker_cli
from outbox.worker.cli import make_publisher
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.registry import load_publisher, shown_values
from outbox.worker.settings import load_settings

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
UNPARSEABLE = [case for case in DSNS if not case.parses]
PARSEABLE = [case for case in DSNS if case.parses]


def ids(cases: list[Hostile] | tuple[Hostile, ...]) -> list[str]:
    return [case.name for case in cases]


def test_the_leak_check_finds_a_piece_of_a_secret():
    assert leaks("...ter2PwdT...", ["Hunter2PwdTypo"]) == ["ter2PwdT"]
    assert leaks("Hunter2", ["Hunter2PwdTypo"]) == []  # under 8 characters: too short to tell


# -- the masking functions -------------------------------------------------------------------


@pytest.mark.parametrize("case", DSNS, ids=ids(DSNS))
def test_a_hostile_dsn_is_never_shown_by_the_masking_functions(case: Hostile):
    shown = [
        redact_dsn(case.value),
        describe_dsn(case.value),
        dsn_label(case.value),
        redact_text(f"connect failed for {case.value}: {case.value!r}", dsn=case.value),
    ]
    if case.parses:
        assert check_dsn(case.value) == case.value
        assert "127.0.0.1" in redact_dsn(case.value) and MASK in redact_dsn(case.value)
        assert describe_dsn(case.value).startswith("127.0.0.1 port 1")
    else:
        with pytest.raises(SettingError) as refused:
            check_dsn(case.value)
        shown.append(str(refused.value))
        assert str(refused.value).startswith("invalid DSN (")
        # Not shown at all, or (a URL whose password alone is what libpq refuses) with the
        # whole password masked before it is read.
        assert redact_dsn(case.value) == UNPARSEABLE_DSN or "password=***" in redact_dsn(case.value)
    assert_no_leak("\n".join(shown), case.secrets)


def test_a_dsn_label_is_short_and_says_where_it_points():
    """The TUI's top bar: user@host:port/db before connecting, in the same form as after."""
    assert dsn_label("postgresql://u:s3cret@db.example:5433/orders") == "u@db.example:5433/orders"
    assert dsn_label("host=db dbname=d") == "db/d"
    assert dsn_label("") == "local"
    # A dbname holding a connection string of its own is masked, as redact_dsn masks it.
    assert dsn_label("host=db dbname='host=x password=s3cret'") == f"db/{MASK}"
    assert dsn_label("host=db port=") == "db"


@pytest.mark.parametrize("case", URLS, ids=ids(URLS))
def test_a_hostile_url_is_never_shown(case: Hostile):
    redacted = redact_url(case.value)
    assert redacted.split("://")[0] == case.value.split("://")[0]
    assert redacted.startswith(case.value.split("://")[0] + "://***@")
    text = redact_text(f"POST {case.value} failed; retrying '{case.value}'")
    assert_no_leak(redacted + "\n" + text, case.secrets)


# A password in URLs that are not well formed, as a person mistypes them.
TYPO_PASSWORD = "Pa55wordTypoUrl"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # No proper `scheme://`: where the user-info would end cannot be told, so all before
        # the last `@` goes (then query values and the fragment, as in any URL).
        (f"https//alice:{TYPO_PASSWORD}@host/x", "***@host/x"),
        (f"//alice:{TYPO_PASSWORD}@host/x", "***@host/x"),
        (f"http:/alice:{TYPO_PASSWORD}@host/x", "***@host/x"),
        (f"alice:{TYPO_PASSWORD}@host/x", "***@host/x"),
        (f"alice:{TYPO_PASSWORD}@h:4222", "***@h:4222"),
        (f"{TYPO_PASSWORD}@h:4222", "***@h:4222"),
        (f"alice:{TYPO_PASSWORD}?q@host/x?token={TYPO_PASSWORD}#{TYPO_PASSWORD}",
         "***@host/x?token=***#***"),
        # A `/`, `?` or `#` in the password ends the authority early: what is left of it is
        # no host and port, so all before the last `@` goes.
        (f"https://alice:{TYPO_PASSWORD}/x@host/p", "https://***@host/p"),
        (f"https://alice:{TYPO_PASSWORD}?x@host/p", "https://***@host/p"),
        (f"https://alice:{TYPO_PASSWORD}#x@host/p", "https://***@host/p"),
        (f"SASL_SSL://alice:{TYPO_PASSWORD}@h:9093", "SASL_SSL://***@h:9093"),
        # Well formed: as before, an `@` in the path included.
        ("https://host/users/@me", "https://host/users/@me"),
        ("https://host:8080/users/@me?a=b", "https://host:8080/users/@me?a=***"),
        ("https://[::1]:8080/u/@me", "https://[::1]:8080/u/@me"),
        (f"https://alice:{TYPO_PASSWORD}@host/u/@me", "https://***@host/u/@me"),
        ("host:9092", "host:9092"),
        ("no at sign here", "no at sign here"),
    ],
)  # fmt: skip
def test_a_url_not_well_formed_loses_all_before_its_last_at(url: str, shown: str):
    assert redact_url(url) == shown
    assert_no_leak(redact_url(url), [TYPO_PASSWORD])


@pytest.mark.parametrize("case", TEXTS, ids=ids(TEXTS))
def test_hostile_free_text_is_redacted(case: Hostile):
    shown = redact_text(case.value)
    assert MASK in shown
    assert_no_leak(shown, case.secrets)


def test_free_text_keeps_what_is_not_secret():
    for text in (
        "Kafka TOPIC_AUTHORIZATION_FAILED: Broker: Topic authorization failed",
        "HTTP 503: Service Unavailable",
        "nats: 'authorization violation'",
        "permission denied: publish to subject 'outbox.denied.x'",
        'duplicate key value violates unique constraint "outbox_pkey"',
        "Token expired",
    ):
        assert redact_text(text) == text


def test_values_the_caller_knows_are_masked_in_every_form():
    text = "got 'Hunter2 \\tSpaced', Hunter2%20%09Spaced and Hunter2 \tSpaced"
    assert_no_leak(mask_values(text, ["Hunter2 \tSpaced"]), ["Hunter2 \tSpaced", "Spaced'"])
    assert mask_values("a b abc", ["a"]) == "*** b abc"  # short: only as a word of its own


def test_settings_by_name_mask_every_secret_kafka_nats_and_http_uses():
    kafka = redact_mapping(KAFKA_CONFIG)
    assert kafka["sasl.username"] == "orders-producer" and kafka["sasl.mechanism"] == "PLAIN"
    assert_no_leak(repr(kafka), KAFKA_SECRETS)
    nats = redact_mapping(NATS_OPTIONS)
    assert nats["user"] == "orders"
    assert_no_leak(repr(nats), NATS_SECRETS)
    headers = redact_mapping(HEADERS)
    assert headers["X-Tenant"] == "acme"
    assert_no_leak(repr(headers), HEADER_SECRETS)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("sasl.password", True), ("ssl.key.password", True), ("ssl.key.pem", True),
        ("sasl.oauthbearer.client.secret", True), ("sasl.oauthbearer.config", True),
        ("Authorization", True), ("X-Api-Key", True), ("Cookie", True), ("nkeys_seed", True),
        ("user_credentials", True), ("pwd", True), ("passwd", True), ("auth_token", True),
        ("sasl.username", False), ("security.protocol", False), ("bootstrap.servers", False),
        ("linger.ms", False), ("X-Tenant", False), ("user", False),
    ],
)  # fmt: skip
def test_one_vocabulary_of_secret_names(name, secret):
    assert is_secret_name(name) is secret


# -- publisher options -----------------------------------------------------------------------


def _start_up_line(argv: list[str]) -> str:
    settings = load_settings(["--dsn", "host=x", *argv], {})
    factory = load_publisher(settings.publisher)
    return shown_values(factory.options, settings.publisher_options)


def test_the_start_up_line_shows_no_secret_of_any_publisher():
    http = _start_up_line(
        ["--publisher", "http", "--http-url", URLS[0].value,
         *(arg for name, value in HEADERS.items() for arg in ("--http-header", f"{name}: {value}"))]
    )  # fmt: skip
    assert http.startswith("http-url=https://***@api.example/hook?token=***&v=***#***")
    assert_no_leak(http, [*URLS[0].secrets, *HEADER_SECRETS])
    nats = _start_up_line(
        ["--publisher", "nats", "--nats-url", f"{URLS[2].value},{URLS[3].value}",
         "--nats-user", "orders", "--nats-password", "NatsPassword99"]
    )  # fmt: skip
    assert "nats://***@nats.example:4222" in nats and "nats-password=***" in nats
    assert_no_leak(nats, [*URLS[2].secrets, *URLS[3].secrets, "NatsPassword99"])
    kafka = _start_up_line(
        ["--publisher", "kafka", "--kafka-bootstrap-servers", "127.0.0.1:1",
         "--kafka-config", "sasl.password=KafkaSaslPass99",
         "--kafka-config", "ssl.key.password=KafkaKeyPass99"]
    )  # fmt: skip
    assert "kafka-config=***" in kafka
    assert_no_leak(kafka, KAFKA_SECRETS)


@pytest.mark.parametrize(
    ("argv", "secrets"),
    [
        (["--publisher", "http", "--http-url", URLS[0].value.replace("https", "ftp")],
         URLS[0].secrets),
        (["--publisher", "http", "--http-url", "http://h/", "--http-header",
          f"Authorization: Bearer {JWT}\r\nX-Injected: 1"], (JWT,)),
        (["--publisher", "nats", "--nats-url", URLS[2].value.replace("nats://", "redis://")],
         URLS[2].secrets),
        # Contents where a file name was expected: still a key, still credentials.
        (["--publisher", "nats", "--nats-tls-key", PEM_KEY], (PEM_KEY.strip(),)),
        (["--publisher", "nats", "--nats-creds", NATS_CREDS], (JWT, NKEY_SEED)),
        (["--publisher", "kafka", "--kafka-bootstrap-servers", "127.0.0.1:1",
          "--kafka-config", "sasl.password"], ()),
        # Refused by librdkafka only when the publisher is made, with the rest of its config.
        (["--publisher", "kafka", "--kafka-bootstrap-servers", "127.0.0.1:1",
          "--kafka-config", "security.protocol=ssl",
          "--kafka-config", "ssl.key.pem=KafkaKeyPem99 not a pem",
          "--kafka-config", "ssl.key.password=KafkaKeyPass99"],
         ("KafkaKeyPem99", "KafkaKeyPass99")),
        # Credentials where none belong, in URLs that are not well formed.
        *((["--publisher", "http", "--http-url", url], (TYPO_PASSWORD,)) for url in (
            f"https//alice:{TYPO_PASSWORD}@host/x", f"//alice:{TYPO_PASSWORD}@host/x",
            f"http:/alice:{TYPO_PASSWORD}@host/x", f"alice:{TYPO_PASSWORD}@host/x",
            f"https://alice:{TYPO_PASSWORD}/x@host/",
        )),
        (["--publisher", "nats", "--nats-url", f"alice:{TYPO_PASSWORD}@h:4222"], (TYPO_PASSWORD,)),
        (["--publisher", "kafka", "--kafka-bootstrap-servers",
          f"alice:{TYPO_PASSWORD}@127.0.0.1:1"], (TYPO_PASSWORD,)),
        (["--publisher", "kafka", "--kafka-bootstrap-servers",
          f"SASL_SSL://alice:{TYPO_PASSWORD}@127.0.0.1:1"], (TYPO_PASSWORD,)),
        # Credentials in the URL and an Authorization header: aiohttp refuses every request.
        (["--publisher", "http", "--http-url", URLS[0].value, "--http-header",
          f"Authorization: Bearer {JWT}"], (*URLS[0].secrets, JWT)),
    ],
)  # fmt: skip
def test_a_refused_publisher_option_is_named_without_its_secret(argv, secrets):
    with pytest.raises(SettingError) as refused:
        make_publisher(load_settings(["--dsn", "host=x", *argv], {}), Metrics())
    assert str(refused.value).startswith(("--http-", "--nats-", "--kafka-"))
    assert_no_leak(str(refused.value), secrets)


# -- the commands, in this process -----------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OUTBOX_", "PG")):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("case", DSNS, ids=ids(DSNS))
def test_outbox_stats_never_echoes_a_hostile_dsn(case: Hostile, clean_env, capsys):
    with pytest.raises(SystemExit) as ended:
        outbox_cli.main(["stats", "--dsn", case.value])
    out, err = capsys.readouterr()
    # Refused as written (2), or it could not connect to 127.0.0.1 port 1 (1).
    assert ended.value.code == (1 if case.parses else 2)
    assert err.startswith(
        "outbox: error: cannot connect to 127.0.0.1 port 1"
        if case.parses
        else "outbox: error: --dsn: invalid DSN ("
    )
    assert_no_leak(out + err, case.secrets)


@pytest.mark.parametrize("case", UNPARSEABLE, ids=ids(UNPARSEABLE))
def test_the_worker_and_the_tui_refuse_a_hostile_dsn_without_echoing_it(
    case: Hostile, clean_env, monkeypatch, capsys
):
    with pytest.raises(SystemExit) as ended:
        worker_cli.main(["--dsn", case.value])
    assert ended.value.code == 2
    monkeypatch.setenv("OUTBOX_DSN", case.value)
    for main in (worker_cli.main, tui_config.parse_args):
        with pytest.raises(SystemExit) as ended:
            main([])
        assert ended.value.code == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("outbox-worker: error: --dsn: invalid DSN (")
    assert lines[1].startswith("outbox-worker: error: OUTBOX_DSN: invalid DSN (")
    assert lines[2].startswith("outbox-tui: error: OUTBOX_DSN: invalid DSN (")
    assert_no_leak(out + err, case.secrets)


# -- real worker processes -------------------------------------------------------------------


def _worker(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox.worker", *args],
            env={**BASE_ENV, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for(what: str, proc: subprocess.Popen[bytes], log: Path, seen: str) -> None:
    deadline = time.monotonic() + 60
    while seen not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"worker exited: {log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {what}: {log.read_text(errors='replace')}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


def test_worker_processes_refuse_hostile_dsns_without_echoing_them(tmp_path):
    cases = [DSNS[0], DSNS[1], DSNS[3], DSNS[-1]]  # JWT, PEM key, pwd typo, spaces in a URL
    started = []
    for i, case in enumerate(cases):
        # Half by flag, half by variable: both paths name their source.
        source = "--dsn" if i % 2 == 0 else "OUTBOX_DSN"
        args, env = (["--dsn", case.value], {}) if i % 2 == 0 else ([], {source: case.value})
        log = tmp_path / f"{i}.log"
        started.append((case, source, log, _worker(*args, env=env, log=log)))
    for case, source, log, proc in started:
        assert proc.wait(60) == 2
        text = log.read_text(errors="replace")
        assert text.startswith(f"outbox-worker: error: {source}: invalid DSN (")
        assert len(text.splitlines()) == 1
        assert_no_leak(text, case.secrets, case.name)


def test_worker_processes_refuse_credentials_where_they_do_not_belong(tmp_path):
    """Each of these used to start (and log the password, over and over), or to echo it in
    the usage error: now one line naming the setting, exit 2, nothing of the password."""
    dsn = "host=127.0.0.1 port=1 connect_timeout=1"
    kafka, http = ["--publisher", "kafka"], ["--publisher", "http"]
    runs = [
        ([*kafka, "--kafka-bootstrap-servers", f"alice:{TYPO_PASSWORD}@127.0.0.1:1"],
         "--kafka-bootstrap-servers: "),
        ([*kafka, "--kafka-bootstrap-servers", f"SASL_SSL://alice:{TYPO_PASSWORD}@127.0.0.1:1"],
         "--kafka-bootstrap-servers: "),
        ([*http, "--http-url", f"http://alice:{TYPO_PASSWORD}@127.0.0.1:1/hook",
          "--http-header", "Authorization: Bearer tok3nTypoHeader"],
         "--http-url and --http-header"),
        ([*http, "--http-url", f"https//alice:{TYPO_PASSWORD}@host/x"], "--http-url: "),
        (["--publisher", "nats", "--nats-url", f"alice:{TYPO_PASSWORD}@h:4222"], "--nats-url: "),
    ]  # fmt: skip
    started = []
    for i, (args, named) in enumerate(runs):
        log = tmp_path / f"{i}.log"
        started.append((named, log, _worker("--dsn", dsn, *args, env={}, log=log)))
    try:
        codes = [proc.wait(60) for _, _, proc in started]
    finally:  # one that kept running (as they did) must not outlive the test
        for _, _, proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert codes == [2] * len(runs)
    for named, log, _ in started:
        text = log.read_text(errors="replace")
        assert text.startswith(f"outbox-worker: error: {named}"), text
        assert len(text.splitlines()) == 1, text
        assert_no_leak(text, [TYPO_PASSWORD, "tok3nTypoHeader"], named)


def test_a_running_worker_logs_no_secret_of_its_dsn_or_its_publisher(dsn, tmp_path):
    """The start-up line shows the DSN and the publisher's options: secrets masked."""
    hostile = f"{dsn} password=Hunter2Password sslpassword=Hunter2SslPass"  # trust auth
    port, log = free_port(), tmp_path / "worker.log"
    # Not Authorization: with the URL's user-info it is refused at start (aiohttp would send
    # both); the URL's credentials stand for it here.
    headers = [
        arg
        for name, value in HEADERS.items()
        if name != "Authorization"
        for arg in ("--http-header", f"{name}: {value}")
    ]
    proc = _worker(
        "--publisher", "http", "--http-url", URLS[0].value, *headers,
        "--log-format", "text", "--metrics-port", str(port),
        env={"OUTBOX_DSN": hostile}, log=log,
    )  # fmt: skip
    try:
        _wait_for("start-up line", proc, log, "dispatching")
    finally:
        _stop(proc)
    text = log.read_text(errors="replace")
    assert " password=*** " in text and " sslpassword=*** " in text
    assert "http-url=https://***@api.example/hook?token=***&v=***#*** http-header=***" in text
    assert_no_leak(text, ["Hunter2Password", "Hunter2SslPass", *URLS[0].secrets, *HEADER_SECRETS])


def test_a_worker_that_cannot_connect_logs_no_secret(tmp_path):
    """libpq's errors, the worker's retries: where it tried and why, nothing secret."""
    running = [
        (
            case,
            tmp_path / f"{i}.log",
            _worker(env={"OUTBOX_DSN": case.value}, log=tmp_path / f"{i}.log"),
        )
        for i, case in enumerate(PARSEABLE)
    ]
    try:
        for case, log, proc in running:
            _wait_for(f"a connection failure ({case.name})", proc, log, "127.0.0.1 port 1")
    finally:
        for _, _, proc in running:
            _stop(proc)
    for case, log, _ in running:
        assert_no_leak(log.read_text(errors="replace"), case.secrets, case.name)
