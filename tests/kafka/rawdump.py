"""What a Kafka log holds, raw, for a failed test to leave behind: every record of the
prefix's topics (offset, global offset, writer and source headers) and, on Tansu with S3
storage, every stored record batch's header (producer id, epoch, base sequence, count,
transactional/control bits), read from the S3 objects themselves."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import orjson

BATCH_HEAD = struct.Struct(">qiibIhiqqqhii")
"""Kafka's RecordBatch v2 header: base offset, length, leader epoch, magic, crc,
attributes, last offset delta, first/max timestamp, producer id, producer epoch, base
sequence, record count."""


def dump_records(bootstrap: str, prefix: str, out: Path, timeout_s: float = 120.0) -> None:
    """Every record of the topics ``prefix.*`` as JSON lines into ``out``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    tps = [(name, p) for name, t in md.topics.items() if name.startswith(prefix + ".")
           for p in t.partitions]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rawdump",
                  "enable.auto.commit": False, "isolation.level": "read_uncommitted",
                  "enable.partition.eof": True, "fetch.wait.max.ms": 500})
    c.assign([TopicPartition(t, p, 0) for t, p in tps])
    todo = set(tps)
    deadline = time.monotonic() + timeout_s
    with out.open("wb") as f:
        while todo and time.monotonic() < deadline:
            msg: Any
            for msg in c.consume(10_000, 1.0):
                topic = str(msg.topic())
                tp = (topic, msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(tp)
                    continue
                headers = {k: (bytes(v).decode() if v is not None else None)
                           for k, v in msg.headers() or ()}
                value = msg.value()
                seq = None
                if value is not None and value.startswith(b'{"offset":'):
                    seq = int(value[10:value.index(b",")])
                row: dict[str, Any] = {"t": topic, "p": msg.partition(), "o": msg.offset(),
                                       "seq": seq, **headers}
                if ".__dblog.checkpoint" in topic and value is not None:
                    row["cp"] = orjson.loads(value)
                    row["cp"].pop("cp", None)
                f.write(orjson.dumps(row) + b"\n")
        if todo:
            f.write(orjson.dumps({"unfinished": sorted(todo)}) + b"\n")
    c.close()


def dump_batches(moto_port: int, prefix: str, out: Path, bucket: str = "tansu") -> None:
    """The header of every record batch Tansu stored in S3 for ``prefix``'s topics."""
    import boto3  # type: ignore[import-untyped]

    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}",
                      aws_access_key_id="test", aws_secret_access_key="test",
                      region_name="us-east-1")
    with out.open("wb") as f:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if f"/topics/{prefix}." not in key or not key.endswith(".batch"):
                    f.write(orjson.dumps({"key": key}) + b"\n") if key.endswith(".json") else None
                    continue
                head = s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-60")["Body"].read()
                (base, _, _, magic, _, attrs, delta, _, _, pid, pepoch, bseq,
                 count) = BATCH_HEAD.unpack(head[:BATCH_HEAD.size])
                parts = key.split("/")
                f.write(orjson.dumps({
                    "t": parts[3], "p": int(parts[5]), "obj": parts[-1], "base": base,
                    "delta": delta, "count": count, "pid": pid, "pepoch": pepoch,
                    "bseq": bseq, "txn": bool(attrs & 0x10), "control": bool(attrs & 0x20),
                    "magic": magic, "mtime": obj["LastModified"].isoformat(),
                }) + b"\n")
