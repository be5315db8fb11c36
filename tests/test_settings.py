"""Settings parsing: durations, DSN redaction, worker flags and OUTBOX_* variables, table names."""

from __future__ import annotations

from datetime import timedelta

import pytest

from outbox.plumbing.dsn import check_dsn, connect_options, connect_timeout, with_pg_environment
from outbox.plumbing.durations import MAX_DURATION, format_duration, parse_duration
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import describe_dsn, redact_dsn, redact_text, redact_url
from outbox.table import Table
from outbox.worker.plugin import Option, PublisherContext
from outbox.worker.publishers.registry import shown_values
from outbox.worker.settings import WorkerSettings, build_parser, load_settings

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


@pytest.mark.parametrize("text", ["0s", "250ms", "1.5s", "90s", "5m", "2h", "7d"])
def test_a_duration_is_shown_as_it_is_written(text):
    """What a command echoes of a duration reads as the one given: `0s` was shown `0ms`."""
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize("text", ["5x", "", "s", "1.s", "5 minutes", "1e3", "-1x"])
def test_parse_duration_rejects_garbage(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-1s", " -250ms", "-7d", "-3"])
def test_parse_duration_refuses_a_negative_one_for_what_it_is(text):
    with pytest.raises(ValueError, match=r"is negative \(a duration is 0s or more\)"):
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


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db.example sslpassword=s3cret dbname=orders",
        "host=db.example oauth_client_secret=s3cret dbname=orders",
        "host=db.example password=s3cret sslpassword='s3cret too' dbname=orders",
        "postgresql://app@db.example/orders?sslpassword=s3cret",
        "postgresql://app:s3cret@db.example/orders?sslpassword=s3cret&application_name=x",
        "postgresql://app:pa%40s3cret@db.example/orders",
    ],
)
def test_redact_dsn_hides_every_secret_parameter_in_both_forms(dsn):
    redacted = redact_dsn(dsn)
    assert "s3cret" not in redacted
    assert "db.example" in redacted and "orders" in redacted
    assert describe_dsn(dsn).startswith("db.example port 5432 (database orders")


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:p@s3cret@h/db",  # libpq reads host "s3cret@h"
        "postgresql://u:p@s3cret@@h:5433/db?sslpassword=x",
        "postgres://u:@s3cret@h/db",
    ],
)
def test_a_url_password_with_an_unencoded_at_is_hidden_whole_and_refused(dsn):
    assert "s3cret" not in redact_dsn(dsn)
    assert "s3cret" not in describe_dsn(dsn)
    with pytest.raises(SettingError, match="must be written %40") as info:
        check_dsn(dsn)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "reason", "hidden"),
    [
        # What is wrong and where, in libpq's words where it has some; never a piece of the
        # DSN (libpq quotes the word before a missing "=", which may be a token or a key).
        ("not a dsn at all", 'missing "=" after the keyword of parameter 1', '"not"'),
        ("eyJhbGciOiJIUzI1NiJ9.e30.c2ln", 'missing "=" after the keyword of parameter 1', "eyJ"),
        ("host=x port", 'missing "=" after the keyword of parameter 2', "port"),
        ("host=x bogus=1", "parameter 2 has a keyword libpq does not know", "bogus"),
        ("host=x pwd=s3cret", "parameter 2 has a keyword libpq does not know", "pwd"),
        ("c2VjcmV0IGtleQ==", "parameter 1 has a keyword libpq does not know", "c2Vj"),
        ("host=x password='s3cret", "unterminated quoted value in parameter 2", "'"),
        ("postgresql://h/db?x", 'missing key/value separator "=" in query parameter 1', "x"),
        ("postgresql://h/db?sslmode=require&pwd=s3cret", "query parameter 2 has a keyword", "pwd"),
        ("postgresql://h/db?a=b=c", 'extra key/value separator "=" in query parameter 1', "b="),
        ("postgresql://u:s3cret%zz@h/db", "a % not followed by two hexadecimal digits", "%zz"),
        ("postgresql://u:my s3cret@h/db", "spaces in the URL (write them %20)", "my"),
        ("postgresql://[::1/db", 'an IPv6 host address without its "]"', "::1"),
        # libpq would read `s3cret` as the port and `pw@127.0.0.1:1/db` as the database.
        ("postgresql://u:s3cret/pw@127.0.0.1:1/db", "must be percent-encoded: %2F, %40", "pw@"),
        ("postgres://u:s3/cret@h/db?sslmode=disable", "must be percent-encoded: %2F, %40", "/cret"),
        # libpq would read `password=s3cret` as the port, and its error would quote it.
        ("host=x port= password=s3cret", "parameter 2 has no value", "password="),
        ("host=x connect_timeout=s3cret", "connect_timeout is not a number of seconds", "'"),
        ("postgresql://h/db?connect_timeout=s3cret", "connect_timeout is not a number", "'"),
    ],
)
def test_check_dsn_error_says_what_is_wrong_and_where(dsn, reason, hidden):
    with pytest.raises(SettingError) as info:
        check_dsn(dsn)
    message = str(info.value)
    assert message.startswith("invalid DSN (") and reason in message
    assert "s3cret" not in message and hidden not in message


@pytest.mark.parametrize(
    "dsn", ["postgresql://u:s3cret/pw@127.0.0.1:1/db", "postgresql://u:s3/cr@et@127.0.0.1:1/db"]
)
def test_a_url_password_with_an_unencoded_slash_is_hidden_whole(dsn):
    """Every message naming the server showed `u port s3cret (database pw@127.0.0.1:1/db)`."""
    assert describe_dsn(dsn) == "127.0.0.1 port 1 (database db, user u)"
    assert "s3" not in redact_dsn(dsn) and "cr" not in redact_dsn(dsn)


def test_the_server_is_described_as_libpq_resolves_it_from_pg_variables(monkeypatch):
    """What the DSN leaves out libpq takes from PGHOST, PGPORT...: messages named `the local
    socket port 5432` for PGHOST=127.0.0.1 PGPORT=1."""
    for name in ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    assert describe_dsn(with_pg_environment("")) == "127.0.0.1 port 1"
    assert describe_dsn(with_pg_environment("port=5 dbname=d")) == "127.0.0.1 port 5 (database d)"
    assert describe_dsn(with_pg_environment("postgresql://u:s3cret@h/d")) == (
        "h port 1 (database d, user u)"
    )


def test_check_dsn_accepts_what_libpq_reads():
    assert check_dsn("host=x port=5432") == "host=x port=5432"
    assert check_dsn("host = x  password='a b\\' c'") == "host = x  password='a b\\' c'"


@pytest.mark.parametrize(
    ("dsn", "env", "timeout", "options"),
    [
        ("host=x", {}, 10, {"connect_timeout": 10}),
        ("host=x connect_timeout=3", {}, 3, {}),  # the DSN's own value is honoured
        ("postgresql://h/db?connect_timeout=45", {}, 45, {}),
        ("host=x", {"PGCONNECT_TIMEOUT": "4"}, 4, {}),
        ("", {}, 10, {"connect_timeout": 10}),
    ],
)
def test_connect_timeout_comes_from_the_dsn_when_it_sets_one(
    monkeypatch, dsn, env, timeout, options
):
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert connect_timeout(dsn) == timeout
    assert connect_options(dsn) == options


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:s3cret@host:8080/p?token=s3cret&x", "http://***@host:8080/p?token=***&x"),
        ("https://s3cret@api.example/events", "https://***@api.example/events"),
        ("https://api.example/e?a=1&b=s3cret#s3cret", "https://api.example/e?a=***&b=***#***"),
        ("nats://u:p@s3cret@h:4222", "nats://***@h:4222"),
        ("https://api.example/events", "https://api.example/events"),
    ],
)
def test_redact_url_hides_user_info_and_query_values(url, shown):
    assert redact_url(url) == shown
    text = f"POST {url} failed: 'at {url}'"
    assert "s3cret" not in redact_text(text)
    assert redact_text(text).startswith(f"POST {shown} failed")


@pytest.mark.parametrize("text", ["99999999999999d", "9999999999999", "36501d", "1e9d"])
def test_parse_duration_refuses_what_no_setting_can_hold(text):
    with pytest.raises(ValueError, match=r"longer than|not a duration"):
        parse_duration(text)
    assert parse_duration("36500d") == MAX_DURATION


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
        # Accepted once: immediate retries in a loop, every defer dead, a blank lease owner.
        (["--backoff-base", "0s"], {}, "--backoff-base"),
        (["--backoff-cap", "0s"], {}, "--backoff-cap"),
        (["--backoff-base", "10m", "--backoff-cap", "1s"], {}, "--backoff-base"),
        (["--max-defer-age", "0s"], {}, "--max-defer-age"),
        (["--owner", ""], {}, "--owner"),
        (["--owner", "  "], {}, "--owner"),
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
        (["--batch", "3000000000"], {}, "--batch"),
        (["--batch", "10001"], {}, "--batch"),
        (["--max-attempts", "3000000000"], {}, "--max-attempts"),
        ([], {"OUTBOX_CONCURRENCY": "1000000"}, "OUTBOX_CONCURRENCY"),
        (["--lease", "9999999999999"], {}, "--lease"),
        (["--lease", "99999999999999d"], {}, "--lease"),
        (["--lease", "2d"], {}, "--lease"),
        (["--lease", "1ms"], {}, "--lease"),
        (["--lease", "999ms"], {}, "--lease"),
        (["--publish-timeout", "2d"], {}, "--publish-timeout"),
        (["--shutdown-grace", "99999999999999d"], {}, "--shutdown-grace"),
        (["--max-defer-age", "1e400"], {}, "--max-defer-age"),
        (["--publisher", ""], {}, "--publisher"),
        (["--publisher", ":x"], {}, "--publisher"),
        (["--publisher", ".rel:x"], {}, "--publisher"),
        (["--publisher", "pkg.:x"], {}, "--publisher"),
        (["--publisher", "os:"], {}, "--publisher"),
        (["--publisher", "os:path"], {}, "--publisher"),  # not a publisher
        (["--http-header", "X: a\r\nB: c"], {}, "--http-header"),
        (["--http-header", "X: a\rb"], {}, "--http-header"),
        (["--http-header", "X: a\x00"], {}, "--http-header"),
        (["--http-header", "X: a\x1b[2J"], {}, "--http-header"),
        (["--http-header", "X Y: a"], {}, "--http-header"),
        (["--http-header", "X\r\nY: a"], {}, "--http-header"),
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


def test_the_lease_range_ends_are_accepted():
    assert load_settings(["--lease", "1s"], {}).lease == timedelta(seconds=1)
    assert load_settings(["--lease", "1d"], {}).lease == timedelta(days=1)
    assert load_settings(["--max-attempts", str(2**31 - 1)], {}).max_attempts == 2**31 - 1


# -- secret options --------------------------------------------------------------------------


def _echo(text: str) -> str:
    """A converter that quotes the value it refuses, as many do."""
    if not text.startswith("ok"):
        raise ValueError(f"{text!r} is not a valid token (got {text})")
    return text


class SecretPublisher:
    """A plugin with a secret option whose converter echoes what it refuses."""

    name = "secret-test"
    options = (
        Option(
            "--st-token",
            "API token; default s3cret-default",
            convert=_echo,
            secret=True,
            default="s3cret-default",
        ),
        Option("--st-keys", "keys", convert=_echo, secret=True, repeatable=True),
        Option("--st-url", "where to", default="https://u:s3cret@h/x?k=s3cret"),
    )

    @classmethod
    def create(cls, values, context: PublisherContext):  # pragma: no cover - never started
        raise AssertionError


PLUGIN = f"{__name__}:SecretPublisher"


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--st-token", "s3cret-bad"], {}),
        ([], {"OUTBOX_ST_TOKEN": "s3cret-bad"}),
        (["--st-keys", "ok1", "--st-keys", "s3cret-bad"], {}),
        ([], {"OUTBOX_ST_KEYS": "ok1\ns3cret-bad"}),
        (["--st-token", " s3cret\tbad "], {}),  # the converter sees it as given, repr and all
        (["--st-token", "s3c"], {}),  # short: masked where quoted, the words around kept
    ],
)
def test_a_secret_option_is_masked_in_its_usage_error(argv, env):
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", PLUGIN, *argv], env)
    message = str(info.value)
    assert message.startswith(("--st-", "OUTBOX_ST_")) and "***" in message
    assert "s3c" not in message and "is not a valid token" in message


def test_a_secret_default_is_not_shown_in_help():
    help_text = build_parser([SecretPublisher]).format_help()
    assert "s3cret" not in help_text.replace("\n", " ").replace("  ", " ").split("--st-url")[0]
    assert "API token; default ***" in " ".join(help_text.split())


def test_the_start_up_line_masks_secrets_and_redacts_urls():
    settings = load_settings(["--publisher", PLUGIN, "--st-token", "ok-s3cret"], {})
    line = shown_values(SecretPublisher.options, settings.publisher_options)
    assert line == "st-token=*** st-url=https://***@h/x?k=***"
    http = load_settings(
        ["--publisher", "http", "--http-url", "https://u:s3cret@h/?token=s3cret",
         "--http-header", "Authorization: Bearer s3cret"], {},
    )  # fmt: skip
    from outbox.worker.publishers.http import HttpPublisher

    line = shown_values(HttpPublisher.options, http.publisher_options)
    assert line == "http-url=https://***@h/?token=*** http-header=***"


# -- placeholder characters in table names ---------------------------------------------------

ODD_NAMES = ["a%b", "a%%b", "pct%", "%", "x{}y", "{t}", "b\\%x", 'q"%"r', "ü%ß"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_placeholder_characters_never_reach_the_rendered_sql(name):
    for table in (Table(None, name), Table(name, name), Table("s", name)):
        for composed in (
            table.ident, table.sibling("notify"), table.index_name("ready"),
            table.regclass_literal, table.channel_ident,
        ):  # fmt: skip
            assert not set("%{}") & set(composed.as_string(None)), composed


def test_ordinary_names_render_as_plain_quoted_identifiers():
    table = Table.parse('"my.schema"."t"')
    assert table.ident.as_string(None) == '"my.schema"."t"'
    assert table.regclass_literal.as_string(None) == '\'"my.schema"."t"\''


@pytest.mark.parametrize("name", ODD_NAMES)
def test_an_escaped_name_is_the_same_table_with_or_without_parameters(conn, name):
    from psycopg import sql

    table = Table(None, name)
    conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(table.ident))
    row = conn.execute(
        sql.SQL("SELECT c.relname, (SELECT count(*) FROM {t} WHERE x = %(x)s) FROM pg_class c "
                "WHERE c.oid = {rc}::regclass").format(t=table.ident, rc=table.regclass_literal),
        {"x": 1},
    ).fetchone()  # fmt: skip
    assert row == (name, 0)
