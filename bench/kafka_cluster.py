"""librdkafka's mock Kafka cluster in a process of its own, for the broker benchmark.

python -m bench.kafka_cluster BROKERS TOPIC PARTITIONS   # prints the bootstrap servers

The cluster serves from this process's threads, so its CPU time counts for neither the
worker nor the plain client. It runs until its standard input closes. The ctypes driver is
the tests' (tests/kafka_mock.py): one definition of the mock for tests and benchmarks.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kafka_mock import mock_cluster


def main(brokers: int, topic: str, partitions: int) -> None:
    with mock_cluster(brokers) as cluster:
        cluster.create_topic(topic, partitions=partitions, replication_factor=brokers)
        print(cluster.bootstraps, flush=True)
        sys.stdin.read()  # until the benchmark closes our standard input


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
