"""``[log.kafka]`` on a real broker: the settings reach every client ``changelog/kafka/``
and the signal listener build (the writer's transactional producer, its admin client and
consumer, the reader's consumer, the signal consumer), read back from librdkafka's own
dump of each client's configuration (``debug = "conf"``); the user's settings win over
pydblog's defaults; ``sasl.password`` shows up nowhere (repr, logs, ``dblog status``,
error messages); a setting librdkafka refuses stops ``dblog run`` / ``dblog tail`` with
exit code 2 and a message naming the key, not a traceback."""

from __future__ import annotations

import logging
import re
import subprocess
import uuid
from pathlib import Path

import orjson
import pytest

from pydblog.capture.service import collect_status
from pydblog.config import LogConfig, load_config
from pydblog.events import ChangeEvent, Op, encode_event
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from tests.helpers import DBLOG, write_config
from tests.kafka.conftest import kafka_log_toml

SECRET = "hunter2-Zq8-never-shown"
SETTINGS = {"compression.type": "zstd", "client.id": "dblog-conftest", "linger.ms": 7,
            "fetch.wait.max.ms": 55, "debug": "conf", "sasl.password": SECRET}
CONF_LINE = re.compile(r"\[(?P<client>[^\]#]+#(?:producer|consumer)-\d+)\] \[thrd:[^\]]*\]:   "
                       r"(?P<key>[a-z._]+) = (?P<value>.*)$")


def _dumps(records: list[logging.LogRecord]) -> dict[str, dict[str, str]]:
    """Each client's configuration as librdkafka dumped it (``debug = "conf"``)."""
    out: dict[str, dict[str, str]] = {}
    for r in records:
        m = CONF_LINE.search(r.getMessage())
        if m:
            out.setdefault(m["client"], {})[m["key"]] = m["value"]
    return out


def _toml(settings: dict[str, object]) -> str:
    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v) if isinstance(v, int) else orjson.dumps(str(v)).decode()

    return "[log.kafka]\n" + "".join(f'"{k}" = {value(v)}\n' for k, v in settings.items())


def test_settings_reach_every_client_and_win(
    kafka_log: LogConfig, tmp_path: Path, pg_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    from pydblog.capture.kafka_signals import KafkaSignalListener
    from pydblog.changelog.kafka.reader import KafkaChangeLogReader
    from pydblog.changelog.kafka.writer import KafkaChangeLog

    cfg = kafka_log.model_copy(update={"kafka": dict(SETTINGS)})
    assert SECRET not in repr(cfg) and "sasl.password" in repr(cfg)
    event = ChangeEvent(Op.CREATE, "public", "t", PgPosition(Lsn(10), 0, Lsn(10), 7), 1,
                        {"id": 1}, None, {"id": 1})
    caplog.set_level(logging.DEBUG)
    writer = KafkaChangeLog(cfg)
    writer.append([encode_event(event, "postgresql", "app", 5)],
                  Checkpoint(PgPosition(Lsn(10), 0, Lsn(10), 7), {}, {}))
    writer.client.admin.poll(1.0)  # (an admin client hands over its log lines on poll)
    writer.close()
    reader = KafkaChangeLogReader(cfg)
    assert [r.offset for r in reader.read(0, 10)] == [0]
    reader.close()
    full = load_config(write_config(tmp_path, pg_db, extra=kafka_log_toml(
        str(cfg.bootstrap_servers), str(cfg.topic_prefix),
        f'[snapshot]\nsignal_topic = "s{uuid.uuid4().hex[:6]}"\n' + _toml(SETTINGS))))
    assert full.log.kafka == SETTINGS
    assert SECRET not in repr(full) and SECRET not in repr(full.log)
    listener = KafkaSignalListener(full)
    listener.consumer.poll(1.0)
    listener.close()

    dumps = _dumps(caplog.records)
    producers = {c: d for c, d in dumps.items() if "transactional.id" in d}
    consumers = {c: d for c, d in dumps.items() if "#consumer-" in c}
    admins = {c: d for c, d in dumps.items() if "#producer-" in c and c not in producers}
    assert producers and admins and len(consumers) >= 3, sorted(dumps)  # writer, reader, signals
    for client, d in dumps.items():
        assert client.startswith("dblog-conftest#"), client  # client.id, in every client
        assert d["sasl.password"] == "[redacted]"
    for d in producers.values():
        assert d["compression.codec"] == "zstd"  # the user's, over the writer's lz4
        assert d["queue.buffering.max.ms"] == "7"  # linger.ms: the user's, over the writer's 2
        assert d["transactional.id"] == f"dblog-{cfg.topic_prefix}"  # a default kept
        assert d["enable.idempotence"] == "true"
    for d in consumers.values():
        assert d["fetch.wait.max.ms"] == "55"  # over the reader's 5
        assert "compression.codec" not in d  # producer-only settings are not given to consumers
    groups = {d.get("group.id", "") for d in consumers.values()}
    assert f"dblog-signals.{cfg.topic_prefix}" in groups
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def _dblog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DBLOG, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("setting", "named", "readers"), [
    ({"no.such.setting": "x"}, '"no.such.setting"', True),
    # librdkafka names compression.codec; readers are not given producer-only settings
    ({"compression.type": "snappyy"}, '"compression.type"', False),
    ({"acks": 1}, '"acks"', False),  # conflicts with the writer's idempotence
])
def test_a_refused_setting_is_a_clear_config_error(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, setting: dict[str, object], named: str,
    readers: bool,
) -> None:
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap) + _toml(
        {**setting, "sasl.password": SECRET}))
    run = _dblog("run", "--config", str(config))
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"[log.kafka] {named}" in run.stderr and "hint:" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and SECRET not in run.stderr + run.stdout
    if not readers:
        return
    tail = _dblog("tail", "--no-follow", "--config", str(config))
    assert tail.returncode == 2 and f"[log.kafka] {named}" in tail.stderr, tail.stderr
    assert "Traceback" not in tail.stderr and SECRET not in tail.stderr + tail.stdout
    status = orjson.dumps(collect_status(load_config(config))).decode()  # what `dblog status` shows
    assert named.replace('"', '\\"') in status and SECRET not in status, status


def test_status_never_shows_the_password(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap) + _toml(
        {"sasl.password": SECRET, "sasl.username": "u"}))
    from pydblog.changelog.kafka.writer import KafkaChangeLog

    KafkaChangeLog(load_config(config).log).close()  # a log to describe
    out = _dblog("status", "--config", str(config))
    assert out.returncode == 0, out.stderr[-2000:]
    assert SECRET not in out.stdout + out.stderr
    status = orjson.dumps(collect_status(load_config(config))).decode()  # `dblog status --json`
    assert "changelog" in status and SECRET not in status, status


@pytest.mark.parametrize("key", ["group.id", "enable.idempotence", "auto.offset.reset",
                                 "isolation.level", "enable.auto.commit", "transactional.id",
                                 "bootstrap.servers", "enable.partition.eof"])
def test_settings_pydblog_relies_on_are_refused_at_load(key: str) -> None:
    """A user's ``group.id`` made every consumer share one group (the signal listener's
    committed offsets then belonged to whichever capture committed last), an
    ``auto.offset.reset`` skipped records retention removed, ...: refused, naming why."""
    from pydblog.config import parse_config
    from pydblog.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        parse_config({"source": {"type": "postgres", "dsn": "postgresql://u@h/db"},
                      "log": {"type": "kafka", "bootstrap_servers": "h:9092", "topic_prefix": "p",
                              "kafka": {key: "x", "sasl.password": SECRET}}})
    assert f'"{key}" is set by pydblog' in str(caught.value) and "remove it" in str(caught.value)
    assert caught.value.exit_code == 2 and SECRET not in str(caught.value)
