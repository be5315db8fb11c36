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


def test_the_producer_survives_its_connection_cut_inside_a_transaction_a_rollback_too(
    dsn, table, caplog
):
    """Every other transaction is rolled back on purpose. A connection cut inside one makes
    the ROLLBACK itself fail, and psycopg then lets the Rollback escape its transaction: the
    producer must take that as the connection lost, as it takes any other cut. Each cut
    lands in either kind of transaction: twelve all missing the rolled-back kind is rare."""
    caplog.set_level(logging.ERROR, "psycopg")  # each cut ROLLBACK logs "error ignored"
    producer = Producer(dsn, table, 300, aggregates=5, per_tx=5, pause=0.0, rollback_every=2)
    producer.start()
    cuts = 0
    with psycopg.connect(dsn, autocommit=True) as killer:
        while producer.is_alive():
            if cuts < CUTS:  # watching for the moment as closely as one connection can
                cuts += killer.execute(CUT_INSIDE_A_TRANSACTION).fetchone()[0]
            else:
                producer.join()
        [(committed,)] = killer.execute("SELECT count(*) FROM outbox").fetchall()
    assert producer.error is None
    assert cuts == CUTS and producer.failures > 0  # it was cut, and carried on
    # A batch whose COMMIT was cut may have committed and is sent again: never fewer.
    assert committed >= 300
