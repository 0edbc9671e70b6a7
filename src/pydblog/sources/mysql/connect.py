"""Connections to the source MySQL/MariaDB, with errors turned into clear messages.

Invariants: errors are classified by MySQL errno (never by message text); no message
produced here contains the password (server and client messages never contain it, DSNs
are shown redacted).
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
import pymysql.connections

from pydblog.config import redact_dsn
from pydblog.errors import ConfigError, SourceError, SourceUnavailable
from pydblog.sources.mysql.sockread import SocketReader

# Server errnos (mysqld_error.h) and client errnos (errmsg.h) used for classification.
ER_DBACCESS_DENIED = 1044
ER_ACCESS_DENIED = 1045
ER_BAD_DB = 1049
ER_TABLEACCESS_DENIED = 1142
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_NO_SUCH_TABLE = 1146
ER_PARSE_ERROR = 1064
ER_BAD_FIELD = 1054
ER_READ_ONLY_TRANSACTION = 1792
ER_STATEMENT_TIMEOUT_MARIADB = 1969
ER_QUERY_TIMEOUT_MYSQL = 3024
ER_MASTER_FATAL_READING_BINLOG = 1236
CR_CONNECTION_ERROR = 2002
CR_CONN_HOST_ERROR = 2003
CR_UNKNOWN_HOST = 2005
CR_SERVER_GONE = 2006
CR_SERVER_LOST = 2013
UNAVAILABLE = {
    CR_CONNECTION_ERROR,
    CR_CONN_HOST_ERROR,
    CR_UNKNOWN_HOST,
    CR_SERVER_GONE,
    CR_SERVER_LOST,
}
DENIED = {ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED, ER_SPECIFIC_ACCESS_DENIED}


@dataclass(frozen=True, slots=True)
class MySqlDsn:
    """``mysql://user:password@host:port/database``; ``repr`` hides the password."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    raw: str = field(repr=False)

    @classmethod
    def parse(cls, dsn: str) -> MySqlDsn:
        parts = urlsplit(dsn)
        if parts.scheme not in ("mysql", "mariadb"):
            raise ConfigError(
                f"source.dsn: {redact_dsn(dsn)!r} is not a MySQL DSN",
                hint="write it as mysql://user:password@host:3306/database",
            )
        database = unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise ConfigError(
                f"source.dsn: {redact_dsn(dsn)!r} names no database",
                hint="the database in the DSN's path is the one captured: mysql://u:p@host:3306/app",
            )
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigError(f"source.dsn: {redact_dsn(dsn)!r} has an invalid port") from None
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            database=database,
            raw=dsn,
        )

    @property
    def redacted(self) -> str:
        return redact_dsn(self.raw)

    def settings(self, *, timeout_s: float, database: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``pymysql.connect`` (and mysql-replication)."""
        out: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "connect_timeout": max(1, int(timeout_s)),
            "charset": "utf8mb4",
        }
        if database:
            out["database"] = self.database
        return out


def errno(exc: BaseException) -> int | None:
    args: tuple[Any, ...] = tuple(exc.args)
    return args[0] if args and isinstance(args[0], int) else None


def detail(exc: BaseException) -> str:
    args: tuple[Any, ...] = tuple(exc.args)
    if len(args) >= 2:
        return str(args[1])
    return str(exc) or type(exc).__name__


def classify(exc: BaseException, dsn: MySqlDsn, doing: str) -> SourceError:
    """A pymysql error as a pydblog error (by errno)."""
    code = errno(exc)
    where = dsn.redacted
    msg = detail(exc)
    if code == ER_ACCESS_DENIED:
        return SourceError(
            f"MySQL at {where} refused the login: {msg}",
            hint="check the user and password in [source] dsn",
        )
    if code == ER_BAD_DB:
        return SourceError(
            f"MySQL at {where}: {msg}",
            hint="check the database name in [source] dsn (it must exist)",
        )
    if code in DENIED:
        return SourceError(
            f"MySQL at {where} denied {doing}: {msg}",
            hint=f"the capture user needs GRANT SELECT, INSERT, UPDATE, CREATE ON "
            f"`{dsn.database}`.* and GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*",
        )
    if code in UNAVAILABLE or code is None:
        return SourceUnavailable(
            f"cannot reach MySQL at {where} ({doing}): {msg}",
            hint="is the server running and reachable, and are host/port in [source] dsn right?",
        )
    return SourceError(f"MySQL at {where} failed {doing}: [{code}] {msg}")


_TLS_LOCK = threading.Lock()
_TLS_PREFERRED: ssl.SSLContext | None = None


class Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """pymysql's connection, with one TLS context per process for its default TLS
    (pymysql 1.2 tries TLS whenever the server offers it, unverified, as the C client's
    ``--ssl-mode=PREFERRED`` does). pymysql builds that context in every connection's
    constructor (``ssl.create_default_context()``, which loads the system's CA store:
    more than the rest of a connection; docs/performance.md); the
    context is the same each time, so it is built once (by pymysql's own code, whatever
    its settings are in this pymysql version) and shared: an ``SSLContext`` may wrap
    sockets of several threads. Explicit TLS options (none are exposed today) would
    still get a context of their own."""

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        if not (isinstance(sslp, dict) and not sslp):
            return super()._create_ssl_ctx(sslp)
        global _TLS_PREFERRED
        with _TLS_LOCK:
            if _TLS_PREFERRED is None:
                _TLS_PREFERRED = super()._create_ssl_ctx({})
            return _TLS_PREFERRED


class StreamConnection(Connection):
    """The binlog dump's connection: a packet its reader read and handed back
    (``held``) is the next one ``_read_packet`` returns (``sources.mysql.rawrows``); it
    reads its socket through a ``sockread.SocketReader``, from the end of the handshake
    on."""

    held: Any = None

    def connect(self, sock: Any = None) -> None:
        super().connect(sock)
        old: Any = getattr(self, "_rfile")  # noqa: B009 (pymysql's, untyped)
        raw: Any = getattr(self, "_sock")  # noqa: B009
        timeout = raw.gettimeout()
        try:
            raw.setblocking(False)
            try:
                pending = bool(old.peek(1))
            except (BlockingIOError, ssl.SSLWantReadError):
                pending = False
        except (OSError, ValueError):
            pending = True  # (cannot tell: keep pymysql's reader)
        finally:
            with contextlib.suppress(OSError, ValueError):
                raw.settimeout(timeout)
        if not pending:  # nothing the server sent is left in pymysql's buffer
            self._rfile = SocketReader(raw)
            with contextlib.suppress(OSError, ValueError):
                old.close()

    def _read_packet(self, packet_type: Any = pymysql.connections.MysqlPacket) -> Any:
        held = self.held
        if held is not None:
            self.held = None
            return held
        return super()._read_packet(packet_type)


def _text_conversions() -> dict[Any, Any]:
    from pymysql import converters
    from pymysql.constants import FIELD_TYPE

    conv = dict(converters.conversions)
    for t in (FIELD_TYPE.DATE, FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP, FIELD_TYPE.DECIMAL,
              FIELD_TYPE.NEWDECIMAL):
        conv[t] = converters.through
    return conv


_TEXT_CONVERSIONS = _text_conversions()


def connect(dsn: MySqlDsn, *, timeout_s: float = 10.0, autocommit: bool = True,
            text_values: bool = False) -> Any:
    """A pymysql connection to the captured database (UTC session time zone, so
    ``TIMESTAMP`` values read as UTC, as the binlog carries them). ``text_values``:
    DATE, DATETIME, TIMESTAMP and DECIMAL values come as the server's text (what
    ``types.SelectMapper`` maps fastest; a chunk reader's connection)."""
    try:
        conn = Connection(
            **dsn.settings(timeout_s=timeout_s),
            autocommit=autocommit,
            init_command="SET time_zone = '+00:00'",
            **({"conv": _TEXT_CONVERSIONS} if text_values else {}),
        )
    except pymysql.Error as exc:
        raise classify(exc, dsn, "the connection") from None
    except OSError as exc:  # DNS failures etc. surface as OSError subclasses
        raise SourceUnavailable(f"cannot reach MySQL at {dsn.redacted}: {exc}") from None
    return conn


def is_mariadb(conn: Any) -> bool:
    return "mariadb" in str(conn.get_server_info()).lower()
