"""librdkafka's own mock Kafka cluster, driven through ctypes.

The Python client exposes no mock API, but the librdkafka it bundles exports one. The cluster
runs in this process on real TCP listeners on localhost, so a worker process and a test
consumer reach it like any broker. Loading the very .so confluent_kafka itself uses keeps the
client and the mock at the same librdkafka version.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import confluent_kafka

PRODUCE = 0  # Kafka ApiKey of Produce requests
_PRODUCER = 0  # rd_kafka_type_t RD_KAFKA_PRODUCER


def _load() -> ctypes.CDLL:
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    [path] = libs.glob("librdkafka-*.so.1")
    lib = ctypes.CDLL(str(path))
    vp, cp, i16, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int16, ctypes.c_size_t
    signatures: dict[str, tuple[object, list[object]]] = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, sz]),
        "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, sz]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_new": (vp, [vp, ctypes.c_int]),
        "rd_kafka_mock_cluster_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
        "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
        "rd_kafka_mock_push_request_errors_array": (
            None,
            [vp, i16, sz, ctypes.POINTER(ctypes.c_int)],
        ),
        "rd_kafka_mock_clear_request_errors": (None, [vp, i16]),
        "rd_kafka_mock_start_request_tracking": (None, [vp]),
        "rd_kafka_mock_get_requests": (ctypes.POINTER(vp), [vp, ctypes.POINTER(sz)]),
        "rd_kafka_mock_request_api_key": (i16, [vp]),
        "rd_kafka_mock_request_destroy_array": (None, [ctypes.POINTER(vp), sz]),
        "rd_kafka_mock_broker_set_down": (ctypes.c_int, [vp, ctypes.c_int32]),
        "rd_kafka_mock_broker_set_up": (ctypes.c_int, [vp, ctypes.c_int32]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


class MockCluster:
    """A running mock cluster: `bootstraps` to connect to, plus topic and error controls."""

    def __init__(self, lib: ctypes.CDLL, mcluster: int) -> None:
        self._lib = lib
        self._mcluster = mcluster
        self.bootstraps: str = lib.rd_kafka_mock_cluster_bootstraps(mcluster).decode()

    def create_topic(self, topic: str, partitions: int = 4, replication_factor: int = 3) -> None:
        err = self._lib.rd_kafka_mock_topic_create(
            self._mcluster, topic.encode(), partitions, replication_factor
        )
        assert err == 0, confluent_kafka.KafkaError(err).str()

    def push_request_errors(self, api_key: int, *codes: int) -> None:
        """The next len(codes) requests of this ApiKey, on any broker, fail with these codes."""
        array = (ctypes.c_int * len(codes))(*codes)
        self._lib.rd_kafka_mock_push_request_errors_array(
            self._mcluster, api_key, len(codes), array
        )

    def clear_request_errors(self, api_key: int) -> None:
        self._lib.rd_kafka_mock_clear_request_errors(self._mcluster, api_key)

    def set_brokers(self, up: bool, brokers: int = 3) -> None:
        """Every broker down (connections closed and refused) or up again."""
        change = (
            self._lib.rd_kafka_mock_broker_set_up if up else self._lib.rd_kafka_mock_broker_set_down
        )
        for broker_id in range(1, brokers + 1):
            assert change(self._mcluster, broker_id) == 0

    def start_request_tracking(self) -> None:
        self._lib.rd_kafka_mock_start_request_tracking(self._mcluster)

    def request_count(self, api_key: int) -> int:
        """Requests of this ApiKey received since tracking started."""
        count = ctypes.c_size_t(0)
        requests = self._lib.rd_kafka_mock_get_requests(self._mcluster, ctypes.byref(count))
        try:
            return sum(
                1
                for i in range(count.value)
                if self._lib.rd_kafka_mock_request_api_key(requests[i]) == api_key
            )
        finally:
            self._lib.rd_kafka_mock_request_destroy_array(requests, count.value)


@contextmanager
def mock_cluster(brokers: int = 3) -> Iterator[MockCluster]:
    lib = _load()
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    # The handle only hosts the cluster; keep its own logging quiet.
    lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
    rk = lib.rd_kafka_new(_PRODUCER, conf, errstr, len(errstr))  # takes ownership of conf
    assert rk, errstr.value.decode()
    mcluster = lib.rd_kafka_mock_cluster_new(rk, brokers)
    try:
        assert mcluster, "rd_kafka_mock_cluster_new failed"
        yield MockCluster(lib, mcluster)
    finally:
        if mcluster:
            lib.rd_kafka_mock_cluster_destroy(mcluster)
        lib.rd_kafka_destroy(rk)
