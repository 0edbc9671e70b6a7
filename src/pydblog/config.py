"""Typed, validated configuration loaded from a TOML file.

Every field is documented in the README ("Configuration reference"). Unknown keys and
wrong types are rejected at load with a message naming the key. Secrets (passwords in
DSNs) never appear in ``repr``, logs or error messages: use ``redact_dsn``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pydblog.api.settings import ApiConfig, HealthConfig
from pydblog.errors import ConfigError


def redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced by ``***`` (URL or key=value form)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port:
                host = f"{host}:{parts.port}"
            netloc = f"{parts.username}:***@{host}"
            return urlunsplit(parts._replace(netloc=netloc))
        return re.sub(r"(password=)[^&]*", r"\1***", dsn)
    return re.sub(r"(password\s*=\s*)(\S+)", r"\1***", dsn)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Dsn(str):
    """A connection string whose ``repr`` hides the password."""

    def __repr__(self) -> str:
        return repr(redact_dsn(str(self)))


class SourceConfig(_Model):
    type: Literal["postgres", "mysql"] = "postgres"
    dsn: str
    primary_dsn: str | None = None
    """PostgreSQL, when ``dsn`` is a hot standby (capture from a standby, PostgreSQL
    16+): the primary, used only to log heartbeats and table resets (never for rows)."""
    tables: list[str] | None = None
    exclude_tables: list[str] = Field(default_factory=list)
    slot: str = "dblog"
    publication: str = "dblog"
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    server_id: int = Field(default=5401, ge=1, le=2**32 - 1)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    slot_wait_s: float = Field(default=30.0, ge=0)
    """PostgreSQL: how long a starting capture waits for a replication slot that another
    connection holds (a killed run's walsender ends only once PostgreSQL notices its
    client is gone) before it stops with an error naming the holder."""

    @field_validator("tables", "exclude_tables")
    @classmethod
    def _regexes(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from exc
        return value

    @field_validator("slot", "publication")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", value):
            raise ValueError(
                f"{value!r} is not a valid slot/publication name "
                "(lower-case letters, digits and _, at most 63 characters)"
            )
        return value

    @model_validator(mode="after")
    def _primary_dsn_postgres(self) -> SourceConfig:
        if self.primary_dsn is not None and self.type != "postgres":
            raise ValueError(
                "primary_dsn (capture from a PostgreSQL hot standby) is for type = "
                '"postgres" only; remove it')
        return self

    def __repr__(self) -> str:
        return f"SourceConfig(type={self.type!r}, dsn={redact_dsn(self.dsn)!r}, ...)"

    def table_matcher(self) -> TableMatcher:
        return TableMatcher(self.tables, self.exclude_tables)


KafkaSetting = str | int | float | bool
_SECRET_SETTING = re.compile(r"password|secret|token|key\.pem|credentials", re.I)
_OWNED_SETTINGS = {
    "bootstrap.servers": "set [log] bootstrap_servers instead",
    "metadata.broker.list": "set [log] bootstrap_servers instead",
    "transactional.id": "set [log] transactional_id instead",
    "enable.idempotence": "the capture's exactly-once commits need the idempotent producer",
    "group.id": "each consumer has its own group: dblog-signals.<prefix> holds the signal "
                "listener's position, dblog-sync.<prefix> the sync's progress; one group for "
                "all mixes them, across captures too",
    "enable.auto.commit": "offsets are committed only once the work behind them is done",
    "isolation.level": "readers read committed records",
    "auto.offset.reset": "a reader must fail, not skip, when records it needs are gone",
    "enable.partition.eof": "readers need the end-of-partition events",
}
"""``[log.kafka]`` keys pydblog sets itself because its guarantees rest on them."""


class LogConfig(_Model):
    """``[log]``. ``type = "embedded"`` (default): the SQLite log in ``path``;
    ``type = "kafka"``: topics ``<topic_prefix>.<schema>.<table>`` on
    ``bootstrap_servers`` (docs/kafka.md), with ``path`` still holding the local state
    and status files. ``truncates``: ``"skip"`` (Debezium's default,
    ``skipped.operations = t``) keeps truncates out of the tables' topics (pydblog's own
    readers still see them, in ``<topic_prefix>.__dblog.truncates``); ``"include"`` writes
    each as one ``op: "t"`` message into its table's topic, as Debezium does with
    ``skipped.operations = none``. ``source_header``: each record also carries its
    envelope's ``source`` block in a ``dblog.source`` header (off by default: the
    bytes are the value's already, and a header per record costs the producer and the
    broker work per event, docs/performance.md; Debezium's records carry none).
    ``kafka`` (the ``[log.kafka]`` table) passes librdkafka settings
    through to every Kafka client (compression, SASL/TLS, ...). ``producer``: the
    capture's Kafka producer: ``"wire"`` (pydblog's own, ``changelog.kafka.producer``:
    record batches built in C; plaintext Kafka, lz4 or no compression: with
    ``[log.kafka]`` settings it does not speak, librdkafka's serves, logged) or
    ``"librdkafka"``."""

    type: Literal["embedded", "kafka"] = "embedded"
    path: str = "./dblog-data"
    retention_hours: float | None = Field(default=168.0, gt=0)
    retention_bytes: int | None = Field(default=None, gt=0)
    batch_max_events: int = Field(default=20_000, ge=1)
    batch_max_ms: int = Field(default=10, ge=0)
    bootstrap_servers: str | None = None
    topic_prefix: str | None = None
    partitions: int = Field(default=1, ge=1, le=10_000)
    replication_factor: int = Field(default=1, ge=1, le=32)
    tombstones: bool = False
    source_header: bool = False
    truncates: Literal["skip", "include"] = "skip"
    transactional_id: str | None = None
    value_format: Literal["json", "json-schema", "avro"] = "json"
    producer: Literal["wire", "librdkafka"] = "wire"
    schema_registry_url: str | None = None
    kafka: dict[str, KafkaSetting] = Field(default_factory=dict)

    @field_validator("kafka")
    @classmethod
    def _not_owned(cls, value: dict[str, KafkaSetting]) -> dict[str, KafkaSetting]:
        for key in value:
            why = _OWNED_SETTINGS.get(key.strip().lower())
            if why is not None:
                raise ValueError(f'"{key}" is set by pydblog ({why}): remove it from [log.kafka]')
        return value

    @model_validator(mode="after")
    def _kafka_needs(self) -> LogConfig:
        if self.type == "kafka":
            if not self.bootstrap_servers:
                raise ValueError('type = "kafka" needs bootstrap_servers ("host:port,...")')
            if not self.topic_prefix:
                raise ValueError('type = "kafka" needs topic_prefix (topics are <prefix>.<schema>.<table>)')
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", self.topic_prefix):
                raise ValueError(
                    f"{self.topic_prefix!r} is not a valid topic prefix "
                    "(letters, digits, '.', '_' and '-')"
                )
        if self.value_format != "json" and self.type != "kafka":
            raise ValueError(
                f'value_format = "{self.value_format}" is a format of Kafka topics: it needs '
                'type = "kafka" (the embedded log stores pydblog\'s JSON envelope)')
        if self.value_format == "avro" and not self.schema_registry_url:
            raise ValueError(
                'value_format = "avro" needs schema_registry_url (a Confluent-API schema '
                'registry, e.g. "http://127.0.0.1:8081")')
        if self.schema_registry_url is not None and not re.match(r"https?://", self.schema_registry_url):
            raise ValueError(
                f"schema_registry_url {self.schema_registry_url!r} is not an http(s) URL")
        return self

    def __repr__(self) -> str:
        shown = {k: ("***" if _SECRET_SETTING.search(k) else v) for k, v in self.kafka.items()}
        return (
            f"LogConfig(type={self.type!r}, path={self.path!r}, "
            f"bootstrap_servers={self.bootstrap_servers!r}, topic_prefix={self.topic_prefix!r}, "
            f"kafka={shown!r}, ...)"
        )


class SnapshotConfig(_Model):
    """``[snapshot]``. Chunks are adaptive by default (fast and safe: each chunk's SELECT
    aims at ``chunk_time_budget_ms``, the stream's lag stays well under 250 ms); a
    ``chunk_size`` given without ``adaptive`` fixes the size instead (``adaptive``
    unset = true unless ``chunk_size`` is set; ``effective_adaptive`` is the answer)."""

    mode: Literal["initial", "never"] = "never"
    chunk_size: int = Field(default=1024, ge=1)
    watermark: Literal["table", "message", "read-only"] = "table"
    read_dsn: str | None = None
    signal_table: str = "public.dblog_signal"
    signal_topic: str | None = None
    watermark_table: str = "public.dblog_watermark"
    adaptive: bool | None = None
    chunk_time_budget_ms: int = Field(default=200, gt=0)
    min_chunk_size: int = Field(default=256, ge=1)
    max_chunk_size: int = Field(default=65536, ge=1)
    statement_timeout_ms: int = Field(default=60_000, gt=0)
    parallelism: int | None = Field(default=None, ge=1, le=16)

    @model_validator(mode="after")
    def _read_dsn_needs_read_only(self) -> SnapshotConfig:
        if self.read_dsn is not None and self.watermark != "read-only":
            raise ValueError(
                'read_dsn (chunk reads on another server, e.g. a standby) needs watermark = '
                '"read-only": watermarks written on the primary cannot fence a read elsewhere'
            )
        return self

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}={redact_dsn(v) if k == 'read_dsn' and v else v!r}" for k, v in self)
        return f"SnapshotConfig({fields})"

    @property
    def effective_adaptive(self) -> bool:
        """Adaptive chunk sizes: as set, else true unless a fixed ``chunk_size`` was given."""
        if self.adaptive is not None:
            return self.adaptive
        return "chunk_size" not in self.model_fields_set


DELTA_PARALLELISM = 3
"""A Delta sink's tables applied at once by default: a table's MERGE is a chain of
small Spark jobs that each wait on the driver and the log; three overlap those waits
(on 2 cores 1.1-1.15 x the drain rate of two, docs/performance.md)."""


class SinkConfig(_Model):
    """One ``[[sync.sinks]]`` entry (see docs/sync.md).

    - ``type = "delta"``: ``path`` is the root of the mirror tables (``<path>/<schema>/<table>``),
      ``parallelism`` = tables applied in parallel (default ``DELTA_PARALLELISM``);
    - ``type = "postgres"``: ``dsn`` of the downstream database, ``schema`` to create the
      tables in (default ``public``), ``parallelism`` = key partitions applied in parallel;
    - ``type = "mysql"``: ``dsn`` (``mysql://user:password@host:3306/database``) of a
      MySQL/MariaDB target, ``schema`` = the target database (default: the DSN's),
      ``parallelism`` = key partitions applied in parallel;
    - ``type = "history"``: ``path`` of the append-only change-history Delta table.

    ``deletion_vectors`` (Delta only, default false): the mirror tables use Delta's
    deletion vectors (a MERGE marks replaced rows deleted instead of rewriting their
    files; readers need the ``deletionVectors`` table feature).
    """

    type: Literal["delta", "postgres", "mysql", "history"]
    path: str | None = None
    dsn: str | None = None
    schema_: str | None = Field(default=None, alias="schema")
    parallelism: int | None = Field(default=None, ge=1, le=64)
    deletion_vectors: bool = False

    def workers(self) -> int:
        """``parallelism`` as set, else the sink type's default."""
        if self.parallelism is not None:
            return self.parallelism
        return DELTA_PARALLELISM if self.type == "delta" else 2

    @model_validator(mode="after")
    def _needs(self) -> SinkConfig:
        if self.deletion_vectors and self.type != "delta":
            raise ValueError(
                f'deletion_vectors is a setting of "delta" sinks, not of a "{self.type}" sink')
        if self.type in ("delta", "history"):
            if not self.path:
                raise ValueError(f'a "{self.type}" sink needs path (a directory)')
            if self.dsn is not None:
                raise ValueError(f'a "{self.type}" sink takes path, not dsn')
        else:
            if not self.dsn:
                raise ValueError(f'a "{self.type}" sink needs dsn (the downstream database)')
            if self.path is not None:
                raise ValueError(f'a "{self.type}" sink takes dsn, not path')
            if self.type == "mysql":
                _mysql_sink_dsn(self.dsn, self.schema_)
            if self.schema_ is not None and not re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_$]{0,62}", self.schema_
            ):
                raise ValueError(f"{self.schema_!r} is not a valid schema name")
        return self

    def __repr__(self) -> str:
        dsn = redact_dsn(self.dsn) if self.dsn is not None else None
        return f"SinkConfig(type={self.type!r}, path={self.path!r}, dsn={dsn!r}, schema={self.schema_!r})"


def _mysql_sink_dsn(dsn: str, schema: str | None) -> None:
    parts = urlsplit(dsn)
    if parts.scheme not in ("mysql", "mariadb"):
        raise ValueError(
            f"a \"mysql\" sink needs a MySQL dsn (mysql://user:password@host:3306/database), "
            f"not {redact_dsn(dsn)!r}")
    if not schema and not parts.path.strip("/"):
        raise ValueError(
            f"a \"mysql\" sink's dsn {redact_dsn(dsn)!r} names no database: name it in the "
            "dsn's path or set schema (the target database)")


_TRIGGER = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?)\s*$"
)


class SyncSourceConfig(_Model):
    """One ``[[sync.sources]]`` entry: a change log written by its own ``dblog run``
    (``log``: that capture's ``[log]`` table, any ``type``), read by this sync under
    ``name`` (the ``_dblog_source`` value of its rows in merged tables, and the key of
    its progress in every sink)."""

    name: str
    log: LogConfig

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}", value):
            raise ValueError(
                f"source name {value!r} must be 1-63 letters, digits, '_', '.' or '-' "
                "(it names the source's checkpoint directory and progress)")
        return value


class SyncRouteConfig(_Model):
    """One ``[[sync.routes]]`` entry: the source tables whose ``schema.table`` (or
    ``db/schema.table`` when the regex holds a ``/``) full-matches ``tables`` (of the
    sources listed in ``sources``; all when empty) are merged into ``target``
    (``schema.table``). ``key = "source"`` (default): the target's key is the source's
    identity columns plus the table's key; ``"row"``: the table's key alone."""

    tables: str
    target: str
    key: Literal["source", "row"] = "source"
    sources: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> SyncRouteConfig:
        from pydblog.core.drainer import Route
        from pydblog.errors import ConfigError

        try:
            Route.parse(self.tables, self.target, self.key, self.sources)
        except ConfigError as exc:
            raise ValueError(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None
        return self


DEFAULT_SOURCE = "default"
"""The name of the one source of a sync configured with ``[log]`` alone (no
``[[sync.sources]]``); its progress in the sinks is the single-source form, so an
explicit ``[[sync.sources]]`` entry with this name takes over a single-source sync's
progress."""


class SyncConfig(_Model):
    """``[sync]``: the Spark job of ``dblog sync``.

    ``checkpoint`` is Spark's checkpoint directory (default ``<log path>/sync-checkpoint``);
    ``trigger`` is a processing-time interval (``"1 second"``, ``"500 ms"``) or
    ``"available-now"`` (drain what is in the change log, then exit); ``master`` the Spark
    master URL; ``max_events_per_trigger`` bounds a micro-batch; a failing sink is retried
    ``sink_retries`` times with exponential backoff from ``sink_retry_backoff_s``.
    """

    checkpoint: str | None = None
    trigger: str = "1 second"
    master: str = "local[*]"
    max_events_per_trigger: int = Field(default=2_000_000, ge=1)
    sink_retries: int = Field(default=5, ge=0)
    sink_retry_backoff_s: float = Field(default=1.0, ge=0)
    sinks: list[SinkConfig] = Field(default_factory=list)
    sources: list[SyncSourceConfig] = Field(default_factory=list)
    routes: list[SyncRouteConfig] = Field(default_factory=list)
    consistent: bool = False

    @model_validator(mode="after")
    def _sources(self) -> SyncConfig:
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"[[sync.sources]] names must be unique: {', '.join(dup)} "
                             "appears more than once")
        for r in self.routes:
            unknown = [n for n in r.sources if n not in names and n != DEFAULT_SOURCE]
            if unknown:
                raise ValueError(
                    f"route {r.tables!r} names unknown source(s) {', '.join(unknown)}; "
                    f"[[sync.sources]] has: {', '.join(names) or DEFAULT_SOURCE}")
        return self

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, value: str) -> str:
        if value != "available-now" and not _TRIGGER.match(value):
            raise ValueError(
                f'{value!r} is not a trigger: use an interval like "1 second" or "500 ms", '
                'or "available-now"'
            )
        return value

    def effective_sources(self, log: LogConfig) -> list[SyncSourceConfig]:
        """The sources this sync reads: ``[[sync.sources]]``, or, without any, the
        ``[log]`` of the config as the one source named ``DEFAULT_SOURCE``."""
        return list(self.sources) or [SyncSourceConfig(name=DEFAULT_SOURCE, log=log)]

    def trigger_interval(self) -> str | None:
        """The processing-time interval for Spark (``None`` for available-now)."""
        m = _TRIGGER.match(self.trigger)
        if m is None:
            return None
        amount, unit = m.group(1), m.group(2)
        if unit.startswith("m") and unit not in ("m", "min", "mins", "minute", "minutes"):
            return f"{amount} milliseconds"
        if unit.startswith("m"):
            return f"{amount} minutes"
        return f"{amount} seconds"


class HaConfig(_Model):
    """``[ha]``: active/passive capture. Every ``dblog run`` with this section campaigns
    for leadership; the leader captures, the others wait as standbys (docs/ha.md).

    - ``backend = "zookeeper"``: ``hosts`` (``host:port,...``), ``path`` (the election's
      znode; default ``/pydblog/<slot>``);
    - ``backend = "postgres"``: an advisory lock on a dedicated connection to ``dsn``
      (default: the source's DSN), keyed by ``path``; its epoch counter is a row of
      ``table``.
    ``session_timeout_s``: a leader that cannot prove it is alive for this long loses
    leadership (ZooKeeper session timeout; PostgreSQL ``idle_session_timeout``).
    ``name``: this member's name in logs and ``dblog status`` (default ``host:pid``).
    """

    backend: Literal["zookeeper", "postgres"]
    hosts: str | None = None
    path: str | None = None
    session_timeout_s: float = Field(default=5.0, ge=1.0, le=600.0)
    dsn: str | None = None
    table: str = "public.dblog_ha"
    name: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> HaConfig:
        if self.backend == "zookeeper":
            if not self.hosts:
                raise ValueError('the "zookeeper" backend needs hosts ("host:port,host:port")')
            if self.dsn is not None:
                raise ValueError('the "zookeeper" backend takes hosts, not dsn')
            if self.path is not None and not self.path.startswith("/"):
                raise ValueError(f"path {self.path!r} must be an absolute znode path (start with /)")
        elif self.hosts is not None:
            raise ValueError('the "postgres" backend takes dsn (default: the source\'s), not hosts')
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*", self.table):
            raise ValueError(f"table {self.table!r} must be schema.table")
        return self

    def __repr__(self) -> str:
        dsn = redact_dsn(self.dsn) if self.dsn is not None else None
        return f"HaConfig(backend={self.backend!r}, hosts={self.hosts!r}, path={self.path!r}, dsn={dsn!r})"


class VerifyConfig(_Model):
    """``[verify]``: scheduled verification by `dblog run` (docs/verify.md).

    ``interval_minutes`` between the end of one pass and the start of the next (unset:
    off); ``tables`` regexes on ``schema.table`` (empty: every captured table);
    ``sink`` one sink's name (as ``dblog verify --sink``); ``max_rows_per_s`` caps the
    source rows read per second (unset: no cap)."""

    interval_minutes: float | None = Field(default=None, gt=0)
    tables: list[str] = Field(default_factory=list)
    sink: str | None = None
    chunk_size: int = Field(default=10_000, ge=1)
    max_rows_per_s: float | None = Field(default=None, gt=0)
    lag_timeout_s: float = Field(default=60.0, ge=0)

    @field_validator("tables")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        for v in value:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"{v!r} is not a regular expression: {exc}") from None
        return value


class Config(_Model):
    source: SourceConfig
    log: LogConfig = Field(default_factory=LogConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    ha: HaConfig | None = None
    api: ApiConfig = Field(default_factory=ApiConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)

    @model_validator(mode="after")
    def _ha_dsn(self) -> Config:
        if self.ha is not None and self.ha.backend == "postgres" and self.ha.dsn is None \
                and self.source.type != "postgres":
            raise ValueError('[ha] backend "postgres" needs dsn (a PostgreSQL) with a MySQL source')
        if self.ha is not None and self.ha.backend == "postgres" and self.ha.dsn is None:
            # The election's table lives in the source database: never capture it.
            own = re.escape(self.ha.table)
            if own not in self.source.exclude_tables:
                source = self.source.model_copy(
                    update={"exclude_tables": [*self.source.exclude_tables, own]})
                return self.model_copy(update={"source": source})
        return self

    @model_validator(mode="after")
    def _qualified_own_tables(self) -> Config:
        """PostgreSQL: an unqualified ``signal_table`` / ``watermark_table`` is in
        ``public`` (as it is created there): normalised here, since the capture compares
        them with the ``schema.table`` names of stream events (unqualified, signals were
        logged as data and never acted on). MySQL resolves them in the DSN's database."""
        snap = self.snapshot
        if self.source.type == "postgres" and ("." not in snap.signal_table
                                               or "." not in snap.watermark_table):
            update = {
                name: value if "." in value else f"public.{value}"
                for name, value in (("signal_table", snap.signal_table),
                                    ("watermark_table", snap.watermark_table))
            }
            object.__setattr__(self, "snapshot", snap.model_copy(update=update))
        return self

    @property
    def log_dir(self) -> Path:
        return Path(self.log.path)


class TableMatcher:
    """Decides which ``schema.table`` names are captured (full-match regexes)."""

    def __init__(self, include: list[str] | None, exclude: list[str]) -> None:
        self._include = [re.compile(p) for p in include] if include is not None else None
        self._exclude = [re.compile(p) for p in exclude]

    def __call__(self, qualified: str) -> bool:
        if any(p.fullmatch(qualified) for p in self._exclude):
            return False
        if self._include is None:
            return True
        return any(p.fullmatch(qualified) for p in self._include)


def _format_errors(exc: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration in {origin}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        kind = err["type"]
        if kind == "extra_forbidden":
            lines.append(f"  - {loc}: unknown key")
        elif kind == "missing":
            lines.append(f"  - {loc}: required key is missing")
        else:
            msg = err["msg"]
            if "token" in loc:  # a secret: never echoed
                lines.append(f"  - {loc}: {msg}")
            elif "password" not in msg and "://" not in msg:
                got = err.get("input")
                shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
                lines.append(f"  - {loc}: {msg}{shown}")
            else:
                lines.append(f"  - {loc}: {redact_dsn(msg)}")
    return "\n".join(lines)


SYNC_ONLY_DSN = "sync-only:"
"""The ``[source] dsn`` of a config without ``[source]`` whose ``[[sync.sources]]``
name the change logs: a config for ``dblog sync`` alone (``dblog run`` refuses it)."""


def parse_config(data: dict[str, Any], origin: str = "<config>") -> Config:
    sync = data.get("sync")
    if "source" not in data and isinstance(sync, dict) and sync.get("sources"):
        data = {**data, "source": {"dsn": SYNC_ONLY_DSN}}
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            _format_errors(exc, origin), hint="see 'Configuration reference' in the README"
        ) from None


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"config file {p} not found", hint="pass --config with the path of a TOML file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from None
    cfg = parse_config(data, str(p))
    return _resolve_paths(cfg, p.resolve().parent)


def _resolve_paths(cfg: Config, base: Path) -> Config:
    """Relative paths (log, sync checkpoint, sink paths) are relative to ``base``, the
    config file's directory, wherever the command runs from; URIs (``s3a://bucket/x``)
    are kept as they are."""

    def rel(path: str | None) -> str | None:
        if path is None or Path(path).is_absolute() or "://" in path:
            return path
        return str(base / path)

    log = cfg.log.model_copy(update={"path": rel(cfg.log.path)})
    sinks = [s.model_copy(update={"path": rel(s.path)}) for s in cfg.sync.sinks]
    sources = [s.model_copy(update={"log": s.log.model_copy(update={"path": rel(s.log.path)})})
               for s in cfg.sync.sources]
    sync = cfg.sync.model_copy(update={"checkpoint": rel(cfg.sync.checkpoint), "sinks": sinks,
                                       "sources": sources})
    return cfg.model_copy(update={"log": log, "sync": sync})
