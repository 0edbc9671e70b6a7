"""Reproduction of a Tansu 0.6 behaviour with a bare confluent-kafka client (no pydblog
code but the broker launcher): on S3 storage (a moto server), a consumer whose
``fetch.wait.max.ms`` is short (5 ms) never receives a partition's records written in
transactions, nor an end-of-partition event: every fetch answer is empty (librdkafka's
debug log: ``MessageSet size 0, error "Success", MaxOffset 10, LSO 10``). With 100 ms or
the default 500 ms the same consumer reads everything; so does 5 ms on memory storage,
or on S3 for records written without a transaction. A broker restart changes nothing. This is what stalled the capture after a broker restart in
tests/kafka/test_capture.py::test_broker_restart_under_load (its first read of the
checkpoint topic: before a restart there was nothing to read yet).

    .venv/bin/python bench/tansu_s3_fetch_wait.py

Output on the test machine:
    s3, fetch.wait.max.ms=5: 0 records and no end of partition in 10 s
    s3, fetch.wait.max.ms=500: 5 records, then end of partition at 10
    memory, fetch.wait.max.ms=5: 5 records, then end of partition at 10
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pydblog.devtools.tansu import TansuBroker


def read(bootstrap: str, topic: str, wait_ms: int) -> str:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.wait.max.ms": wait_ms})
    c.assign([TopicPartition(topic, 0, 0)])
    n, t0 = 0, time.time()
    try:
        while time.time() - t0 < 10:
            for m in c.consume(100, 0.5):
                err = m.error()
                if err is None:
                    n += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    return f"{n} records, then end of partition at {m.offset()}"
                else:
                    return f"error {err}"
        return f"{n} records and no end of partition in 10 s"
    finally:
        c.close()


def main() -> None:
    for s3 in (True, False):
        with TansuBroker(s3=s3) as broker:
            topic = f"t{uuid.uuid4().hex[:6]}"
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
            time.sleep(0.5)
            p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic})
            p.init_transactions(30)
            for i in range(5):  # five committed transactions of one record each
                p.begin_transaction()
                p.produce(topic, b"v%d" % i)
                p.commit_transaction(30)
            for wait in ((5, 500) if s3 else (5,)):
                print(f"{'s3' if s3 else 'memory'}, fetch.wait.max.ms={wait}: "
                      f"{read(broker.bootstrap, topic, wait)}")


if __name__ == "__main__":
    main()
