"""The fault proxy itself: it must really cut, stall and restore a PostgreSQL connection,
or the link scenarios would test nothing."""

from __future__ import annotations

import threading

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chaos.proxy import Proxy

pytestmark = pytest.mark.chaos


def _through(proxy: Proxy, dsn: str) -> str:
    return make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port), connect_timeout="3")


def test_the_proxy_forwards_stalls_resumes_drops_and_refuses(dsn):
    port = int(conninfo_to_dict(dsn)["port"])
    with Proxy(port) as proxy, psycopg.connect(_through(proxy, dsn), autocommit=True) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        proxy.stall()
        answered = threading.Event()

        def ask() -> None:
            conn.execute("SELECT 1")
            answered.set()

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        assert not answered.wait(0.5), "a stalled link answered"
        proxy.resume()
        assert answered.wait(5), "the link did not come back"
        thread.join()
        assert proxy.drop() == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        proxy.refusing = True
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(_through(proxy, dsn))
        assert proxy.refused == 1
        proxy.refusing = False
        with psycopg.connect(_through(proxy, dsn)) as again:
            assert again.execute("SELECT 1").fetchone() == (1,)
