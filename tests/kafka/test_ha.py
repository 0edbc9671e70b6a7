"""High availability with the Kafka change log: members with their own local
directories (as on different hosts: nothing shared but ZooKeeper, Kafka and the
source). kill -9 of the leader, then SIGSTOP of the next one, which must not commit to
Kafka once it wakes up; the topics materialize to the source, no position twice."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import orjson
import psycopg
import pytest

from pydblog.devtools.hamembers import Members
from pydblog.devtools.zookeeper import ZkServer
from tests.chaos import pg_writer, writing
from tests.helpers import dblog, wait_for, write_config
from tests.kafka.conftest import kafka_log_toml
from tests.kafka.test_capture import _check


def leader_of(groups: list[Members], not_pid: int | None = None, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for g in groups:
            for pid, role in g.roles().items():
                if role == "leader" and pid != not_pid and any(
                        p.pid == pid and p.poll() is None for p in g.procs):
                    return pid
        time.sleep(0.05)
    raise AssertionError("no leader in time")


@pytest.mark.slow
def test_failover_between_hosts(pg_db: str, tmp_path: Path, kafka_bootstrap: str,
                                zk_server: ZkServer) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
    log = kafka_log_toml(kafka_bootstrap, f"t{uuid.uuid4().hex[:10]}",
                         "partitions = 3\nbatch_max_events = 200")
    ha = (f'[ha]\nbackend = "zookeeper"\nhosts = "{zk_server.hosts}"\n'
          f'path = "/dblog-test/{uuid.uuid4().hex}"\nsession_timeout_s = 2.0\n')
    hosts = []
    for name in ("host-a", "host-b"):
        config = write_config(tmp_path / name, pg_db, extra=f"{log}\n{ha}")
        hosts.append(Members(config, tmp_path / name / "data"))
    procs = {h.start().pid: h for h in hosts}
    try:
        first = leader_of(hosts)
        wait_for(lambda: sorted(r for h in hosts for r in h.roles().values())
                 == ["leader", "standby"], 30, "a standby")
        # dblog status on the other host names the leader (from the election backend)
        other = next(h for h in hosts if h is not procs[first])
        status = orjson.loads(dblog("status", "--config", str(other.config), "--json").stdout)
        assert status["ha"]["leader"].endswith(f":{first}")
        with writing(pg_writer(pg_db, 21)):
            time.sleep(2.0)
            first_proc = next(p for p in procs[first].procs if p.pid == first)
            first_proc.send_signal(signal.SIGKILL)
            first_proc.wait()
            second = leader_of(hosts, not_pid=first)
            restarted = procs[first].start()  # the first host comes back as a standby
            procs[restarted.pid] = procs[first]
            time.sleep(2.0)
            second_proc = next(p for p in procs[second].procs if p.pid == second)
            second_proc.send_signal(signal.SIGSTOP)
            third = leader_of(hosts, not_pid=second)
            assert third == restarted.pid
            time.sleep(2.0)
            second_proc.send_signal(signal.SIGCONT)  # wakes up: must not commit, steps down
            # it may wake inside a Kafka call (opening the log, a commit), which can take up
            # to the client's 30 s timeout once a newer producer fenced it
            wait_for(lambda: "stepping down" in procs[second].log_of(second_proc), 90,
                     "the old leader to step down")
    except BaseException:  # failed: leave no member running
        for h in hosts:
            h.stop_all()
        raise
    try:
        _check(hosts[0].config, pg_db)
    finally:
        codes = [h.stop_all() for h in hosts]
    logs = [h.log_of(p) for h in hosts for p in h.procs]
    assert not [text for text in logs if "Traceback" in text]
    assert codes
