"""The chaos suite's producer must outlive the faults it produces through: a producer that
died mid-run stops the run's progress, and a scenario then times out for the wrong reason."""

from __future__ import annotations

import logging

import psycopg
import pytest

from chaos.cluster import Producer

pytestmark = pytest.mark.chaos

# The producer's connection, cut while it is inside a transaction between two statements
# (after its INSERT, before the COMMIT or ROLLBACK: where a ROLLBACK then fails).
CUT_INSIDE_A_TRANSACTION = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND state = 'idle in transaction'"
)
CUTS = 12
AFTER_THE_CUTS = 100  # rows it must still commit once the cuts are over


def test_the_producer_survives_its_connection_cut_inside_a_transaction_a_rollback_too(
    dsn, table, caplog
):
    """Every other transaction is rolled back on purpose. A connection cut inside one makes
    the ROLLBACK itself fail, and psycopg then lets the Rollback escape its transaction: the
    producer must take that as the connection lost, as it takes any other cut. A cut lands
    in either kind of transaction, as it happens: without the fix this fails often, not
    always (the restart scenario is where it was found)."""
    caplog.set_level(logging.ERROR, "psycopg")  # each cut ROLLBACK logs "error ignored"
    producer = Producer(
        dsn, table, 10**9, aggregates=5, per_tx=5, pause=0.0, rollback_every=2
    )  # fmt: skip
    producer.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as killer:
            cuts = 0
            while cuts < CUTS:  # watching for the moment as closely as one connection can
                assert producer.is_alive(), producer.error
                cuts += killer.execute(CUT_INSIDE_A_TRANSACTION).fetchone()[0]
            [(at_the_last_cut,)] = killer.execute("SELECT count(*) FROM outbox").fetchall()
            while killer.execute("SELECT count(*) FROM outbox").fetchone()[0] < (
                at_the_last_cut + AFTER_THE_CUTS
            ):
                assert producer.is_alive(), producer.error
                producer.join(0.01)
    finally:
        producer.stop()
        producer.join(30)
    assert producer.error is None and producer.failures > 0  # it was cut, and carried on
