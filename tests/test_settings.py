"""Settings parsing: durations, DSN redaction, worker flags and OUTBOX_* variables, table names."""

from __future__ import annotations

from datetime import timedelta

import pytest

from outbox.settings import SettingError, check_dsn, parse_duration, redact_dsn
from outbox.table import Table
from outbox.worker.settings import WorkerSettings, load_settings

# -- durations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250ms", timedelta(milliseconds=250)),
        ("60s", timedelta(seconds=60)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1.5s", timedelta(seconds=1.5)),
        ("10", timedelta(seconds=10)),
        (" 30s ", timedelta(seconds=30)),
    ],
)
def test_parse_duration_accepts_units_and_bare_seconds(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["5x", "-1s", "", "s", "1.s", "5 minutes", "1e3"])
def test_parse_duration_rejects_garbage(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


# -- DSNs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:s3cret@db.example:5432/orders",
        "postgres://app@db.example/orders?password=s3cret",
        "host=db.example user=app password=s3cret dbname=orders",
        "host=db.example password='s3cret with spaces' dbname=orders",
    ],
)
def test_redact_dsn_hides_the_password_and_keeps_the_rest(dsn):
    redacted = redact_dsn(dsn)
    assert "s3cret" not in redacted
    assert "password=***" in redacted
    assert "db.example" in redacted
    assert "orders" in redacted


def test_redact_dsn_leaves_a_dsn_without_password_alone():
    assert "password" not in redact_dsn("host=db.example dbname=orders")
    assert redact_dsn("") == ""


@pytest.mark.parametrize(
    "dsn",
    [
        "host=x password=s3cret port",  # unparseable key=value
        "PASSWORD=s3cret port",  # libpq keys are lower case: unparseable, still a secret
        "postgresql://u:s3cret%zz@h/db",  # bad percent-encoding
        "postgresql://u:p@s3cret@h/db?x",  # an unescaped @ in the password
    ],
)
def test_redact_dsn_hides_the_password_of_an_unparseable_dsn(dsn):
    assert "s3cret" not in redact_dsn(dsn)


@pytest.mark.parametrize(
    "dsn",
    [
        "host=x password=my s3cret",  # libpq quotes the word after the space
        "postgresql://u:my s3cret@h/db",  # libpq quotes the whole password
        "host=x password=s3cret bogus=1",
    ],
)
def test_check_dsn_error_never_quotes_the_password(dsn):
    with pytest.raises(SettingError, match="invalid DSN") as info:
        check_dsn(dsn)
    assert "s3cret" not in str(info.value)


def test_check_dsn_error_keeps_harmless_detail():
    with pytest.raises(SettingError, match='after "port"'):
        check_dsn("host=x port")
    assert check_dsn("host=x port=5432") == "host=x port=5432"


# -- worker settings -------------------------------------------------------------------------


FULL_ENV = {
    "OUTBOX_DSN": "host=db.example dbname=orders",
    "OUTBOX_TABLE": "app.events",
    "OUTBOX_PUBLISHER": "http",
    "OUTBOX_HTTP_URL": "https://api.example/events",
    "OUTBOX_HTTP_HEADER": "Authorization: Bearer t0k\nX-Tenant: acme",
    "OUTBOX_LEASE": "2m",
    "OUTBOX_BATCH": "25",
    "OUTBOX_CONCURRENCY": "8",
    "OUTBOX_PUBLISH_TIMEOUT": "15s",
    "OUTBOX_MAX_ATTEMPTS": "3",
    "OUTBOX_ORDERING": "aggregate",
    "OUTBOX_OWNER": "w-1",
    "OUTBOX_METRICS_PORT": "9100",
    "OUTBOX_POLL_INTERVAL": "250ms",
    "OUTBOX_SHUTDOWN_GRACE": "5s",
    "OUTBOX_BACKOFF_BASE": "100ms",
    "OUTBOX_BACKOFF_CAP": "1m",
    "OUTBOX_MAX_DEFER_AGE": "2h",
    "OUTBOX_LOG_FORMAT": "json",
    "OUTBOX_LOG_LEVEL": "debug",
}


def test_load_settings_reads_every_outbox_variable():
    s = load_settings([], FULL_ENV)
    assert s.dsn == "host=db.example dbname=orders"
    assert s.table == Table("app", "events")
    assert s.publisher == "http"
    assert s.publisher_options["http_url"] == "https://api.example/events"
    assert s.publisher_options["http_header"] == (
        ("Authorization", "Bearer t0k"),
        ("X-Tenant", "acme"),
    )
    assert s.lease == timedelta(minutes=2)
    assert s.batch == 25
    assert s.concurrency == 8
    assert s.publish_timeout == timedelta(seconds=15)
    assert s.max_attempts == 3
    assert s.ordering == "aggregate" and s.ordered
    assert s.owner == "w-1"
    assert s.metrics_port == 9100
    assert s.poll_interval == timedelta(milliseconds=250)
    assert s.shutdown_grace == timedelta(seconds=5)
    assert s.backoff_base == timedelta(milliseconds=100)
    assert s.backoff_cap == timedelta(minutes=1)
    assert s.max_defer_age == timedelta(hours=2)
    assert s.log_format == "json"
    assert s.log_level == "DEBUG"


def test_load_settings_defaults_without_flags_or_env():
    s = load_settings([], {})
    default = WorkerSettings(dsn="")
    assert s.dsn == ""
    assert s.table == Table(None, "outbox")
    assert (s.publisher, s.lease, s.batch, s.concurrency) == ("log", default.lease, 100, 32)
    assert s.metrics_port is None
    assert s.owner  # hostname-pid


def test_flags_override_env():
    s = load_settings(
        ["--lease", "45s", "--batch", "9", "--table", "other", "--http-header", "X-A: 1"],
        FULL_ENV,
    )
    assert s.lease == timedelta(seconds=45)
    assert s.batch == 9
    assert s.table == Table(None, "other")
    assert s.publisher_options["http_header"] == (("X-A", "1"),)
    # Everything not given as a flag still comes from the environment.
    assert s.concurrency == 8
    assert s.publisher == "http"


def test_empty_env_variable_counts_as_unset():
    s = load_settings([], {"OUTBOX_BATCH": "", "OUTBOX_LEASE": ""})
    assert s.batch == 100
    assert s.lease == timedelta(seconds=60)


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--lease", "5x"], {}, "--lease"),
        (["--batch", "0"], {}, "--batch"),
        ([], {"OUTBOX_BATCH": "abc"}, "OUTBOX_BATCH"),
        ([], {"OUTBOX_LEASE": "soon"}, "OUTBOX_LEASE"),
        (["--publisher", "http"], {}, "--http-url"),
        (["--http-url", "ftp://x"], {}, "--http-url"),
        (["--ordering", "sideways"], {}, "--ordering"),
        (["--lease", "0s"], {}, "--lease"),
        (["--metrics-port", "70000"], {}, "--metrics-port"),
        (["--http-header", "no-colon"], {}, "--http-header"),
        (["--log-level", "loud"], {}, "--log-level"),
        (["--event-loop", "trio"], {}, "--event-loop"),
        (["--prepared-statements", "maybe"], {}, "--prepared-statements"),
        ([], {"OUTBOX_PREPARED_STATEMENTS": "no"}, "OUTBOX_PREPARED_STATEMENTS"),
        (["--table", 'a"b'], {}, "--table"),
    ],
)
def test_bad_settings_name_their_source(argv, env, named):
    with pytest.raises(SettingError) as info:
        load_settings(argv, env)
    assert str(info.value).startswith(named)
    assert "\n" not in str(info.value)


def test_warnings_flag_a_publish_timeout_over_half_the_lease():
    risky = WorkerSettings(
        dsn="", publish_timeout=timedelta(seconds=31), lease=timedelta(seconds=60)
    )
    warnings = risky.warnings()
    assert len(warnings) == 1
    assert "publish timeout 31s" in warnings[0]
    assert "lease 1m" in warnings[0]


def test_no_warning_at_exactly_half_the_lease_or_with_defaults():
    half = WorkerSettings(
        dsn="", publish_timeout=timedelta(seconds=30), lease=timedelta(seconds=60)
    )
    assert half.warnings() == []
    assert WorkerSettings(dsn="").warnings() == []


def test_a_lease_shorter_than_two_seconds_is_warned_about():
    short = WorkerSettings(
        dsn="", lease=timedelta(seconds=1), publish_timeout=timedelta(milliseconds=200)
    )
    assert [w for w in short.warnings() if w.startswith("lease 1s")]


# -- table names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "schema", "name"),
    [
        ("outbox", None, "outbox"),
        ("app.outbox", "app", "outbox"),
        ('"my.schema"."t"', "my.schema", "t"),
        ('"Mixed Case"', None, "Mixed Case"),
        ('"a""b".c', 'a"b', "c"),
    ],
)
def test_table_parse(text, schema, name):
    table = Table.parse(text)
    assert (table.schema, table.name) == (schema, name)


@pytest.mark.parametrize(
    "text", ["a.b.c", "", ".t", "s.", "a..b", '""', '"unbalanced', 'a"b', "x" * 64]
)
def test_table_parse_rejects(text):
    with pytest.raises(SettingError, match="invalid table name"):
        Table.parse(text)


def test_table_renders_quoted_identifiers_and_a_bounded_channel():
    table = Table.parse('"my.schema"."t"')
    assert table.ident.as_string(None) == '"my.schema"."t"'
    assert Table.parse("outbox").channel == "outbox:outbox"
    long = Table.parse("s" * 40 + "." + "t" * 40)
    assert len(long.channel.encode()) <= 63
    assert long.channel != Table.parse("s" * 40 + "." + "u" * 40).channel
