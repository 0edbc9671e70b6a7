"""Schema history: each captured table's columns as they were at a binlog position, for
servers that write no column names into the binlog (MySQL before 8.0.14: no
``binlog_row_metadata``). What Debezium calls the database schema history.

A TABLE_MAP event of such a server carries each column's binlog type and binary metadata
but no name, signedness, charset, ENUM/SET members or primary key. ``information_schema``
has those only for the table as it is *now*; a capture that is behind a column-changing
ALTER would name old rows with the new column list. The history instead keeps the
definitions valid at the stream's position and moves them forward with the DDL the stream
reads (the binlog's QUERY events), parsed with ``sqlglot``.

Invariants:
- ``tables[(db, t)]`` is the definition of ``db.t`` at the position this history belongs
  to, exactly; a table whose definition is not known exactly is absent (and, where a DDL
  made it so, named in ``lost`` with that DDL). Absent tables are read from
  information_schema when met, under the safety checks of ``tablemap.py``.
- ``apply`` never guesses: a DDL on a tracked table that it cannot interpret exactly (a
  statement sqlglot cannot parse, a clause or a type alias this module does not know, a
  text column whose charset it cannot tell) removes the table from ``tables`` (into
  ``lost``) instead of changing it.
- The history travels with the capture's checkpoint (``to_json``/``from_json``), so a
  restart at any position resumes with the definitions of that position. Applying a DDL
  twice is prevented by the caller (a DDL at or below the checkpoint is not applied again).
- Column names compare case-insensitively (as MySQL's do); table names exactly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from pydblog.errors import SourceError
from pydblog.ports import SourceState
from pydblog.sources.mysql.ddl import DdlKind, parse_ddl
from pydblog.sources.mysql.position import file_sequence
from pydblog.sources.mysql.tablemap import (
    _CODES,
    DdlLookahead,
    SchemaColumn,
    SchemaTable,
    _members,
    describe,
    may_rename,
    name_columns,
    read_table,
    type_mismatch,
)

log = logging.getLogger(__name__)

Key = tuple[str, str]
FORMAT = 1

HISTORY_KEY = "mysql_schema_history"
"""``Checkpoint.extra`` key of the schema history."""


class NotUnderstood(Exception):
    """A DDL this module cannot apply exactly (the message says which part)."""


@dataclass(slots=True)
class Applied:
    """What ``SchemaHistory.apply`` did: the tracked tables the statement touched,
    whether the history changed, and the tables it lost track of (with why)."""

    touched: set[Key] = field(default_factory=set)
    changed: bool = False
    lost: list[tuple[Key, str]] = field(default_factory=list)


def charset_of_collation(collation: str) -> str:
    """MySQL collation names start with their charset's name (which has no underscore):
    ``utf8mb4_0900_ai_ci`` -> ``utf8mb4``; ``binary`` -> ``binary``."""
    return collation.lower().split("_", 1)[0]


def _norm_charset(name: str | None) -> str | None:
    if name is None:
        return None
    name = name.lower()
    return "utf8" if name == "utf8mb3" else name


_TEXT = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
_INTS = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})


def signature(table: SchemaTable) -> tuple[Any, ...]:
    """What decoding a TABLE_MAP takes from a definition: per column its name (case
    folded), binlog type class, signedness (integers), charset (text), ENUM/SET members,
    JSON-ness; and the primary key. Two definitions with equal signatures decode every
    row identically."""
    cols = []
    for c in table.columns:
        dt = c.data_type
        cols.append((
            c.name.lower(),
            _CODES.get(dt),
            c.unsigned if dt in _INTS else None,
            _norm_charset(c.charset) if dt in _TEXT else None,
            tuple(_members_of(c)) if dt in ("enum", "set") else None,
            c.is_json,
        ))
    return (tuple(cols), tuple(k.lower() for k in table.primary_key))


def _members_of(c: SchemaColumn) -> list[str]:
    return _members(c.column_type)


# -- persistence --------------------------------------------------------------------------
def _col_json(c: SchemaColumn) -> list[Any]:
    return [c.name, c.data_type, c.column_type, c.charset, c.is_json]


def _col_from(raw: list[Any]) -> SchemaColumn:
    name, dt, ct, cs, js = raw
    return SchemaColumn(str(name), str(dt), str(ct), None if cs is None else str(cs), bool(js))


@dataclass(slots=True)
class SchemaHistory:
    """The tracked tables' definitions at one binlog position (see the module docstring).
    ``charsets`` holds the default charset of each database seen (for CREATE TABLE
    without one)."""

    tables: dict[Key, SchemaTable] = field(default_factory=dict)
    lost: dict[Key, str] = field(default_factory=dict)
    charsets: dict[str, str] = field(default_factory=dict)
    server_version: int = 50700  # for /*!NNNNN ... */ comments

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT,
            "tables": [
                [db, t, s.charset, list(s.primary_key), [_col_json(c) for c in s.columns]]
                for (db, t), s in sorted(self.tables.items())
            ],
            "lost": [[db, t, why] for (db, t), why in sorted(self.lost.items())],
            "charsets": dict(sorted(self.charsets.items())),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], server_version: int = 50700) -> SchemaHistory:
        if int(data.get("v", 0)) != FORMAT:
            raise ValueError(f"unknown schema history format {data.get('v')!r}")
        tables = {
            (str(db), str(t)): SchemaTable(
                tuple(_col_from(c) for c in cols), tuple(str(k) for k in pk),
                None if cs is None else str(cs),
            )
            for db, t, cs, pk, cols in data.get("tables", [])
        }
        lost = {(str(db), str(t)): str(why) for db, t, why in data.get("lost", [])}
        charsets = {str(k): str(v) for k, v in (data.get("charsets") or {}).items()}
        return cls(tables, lost, charsets, server_version)

    @classmethod
    def load(
        cls, raw: Any, server_version: int, tracked: Callable[[str, str], bool]
    ) -> SchemaHistory:
        """The history a checkpoint carries (``raw``, its ``HISTORY_KEY``), of the
        ``tracked`` tables only; an empty one for a change log written without it
        (tables are then read from information_schema when met, as tablemap.py allows).
        Raises ``SourceError`` naming the fix when it cannot be read."""
        if raw is None:
            return cls(server_version=server_version)
        try:
            history = cls.from_json(raw, server_version)
        except (ValueError, TypeError, KeyError) as exc:
            raise SourceError(
                f"the checkpoint's MySQL schema history cannot be read: {exc}",
                hint="this change log was written by a newer pydblog; use that version, or "
                "start with a fresh [log] path and snapshot the tables again",
            ) from None
        history.keep_only(tracked)
        return history

    def copy(self) -> SchemaHistory:
        return SchemaHistory(dict(self.tables), dict(self.lost), dict(self.charsets),
                             self.server_version)

    # -- changes ---------------------------------------------------------------------
    def put(self, key: Key, table: SchemaTable) -> None:
        self.tables[key] = table
        self.lost.pop(key, None)

    def forget(self, key: Key, why: str | None) -> None:
        """``key``'s definition is no longer known (``why``: the DDL that did it), or
        the table is gone (``why`` None)."""
        self.tables.pop(key, None)
        if why is None:
            self.lost.pop(key, None)
        else:
            self.lost[key] = why

    def keep_only(self, tracked: Callable[[str, str], bool]) -> None:
        for key in [k for k in self.tables if not tracked(*k)]:
            del self.tables[key]
        for key in [k for k in self.lost if not tracked(*k)]:
            del self.lost[key]

    def follow(
        self, query: str, default_db: str, tracked: Callable[[str, str], bool], where: object
    ) -> Applied:
        """``apply`` to the QUERY event at ``where``, warning about each tracked table
        whose definition it lost (read from information_schema when next met)."""
        applied = self.apply(query, default_db, tracked)
        for key, why in applied.lost:
            log.warning(
                "could not follow a DDL on %s.%s at %s (%s): %s; its columns will be read "
                "from information_schema when next met (exact while capture keeps up; if "
                "capture is behind further column changes of it, it stops with an error)",
                *key, where, why, " ".join(query.split())[:300],
            )
        return applied

    def apply(self, query: str, default_db: str, tracked: Callable[[str, str], bool]) -> Applied:
        """Move the history past one QUERY event's statement (see the module docstring).
        Statements on untracked tables only, and statements that are no table DDL, change
        nothing."""
        out = Applied()
        text = strip_comments(query, self.server_version)
        db_change = _ALTER_DB.match(text)
        if db_change:
            self._alter_database(db_change, default_db, out)
            return out
        ddl = parse_ddl(text, default_db)
        if ddl is None or ddl.kind == DdlKind.TRUNCATE:
            return out
        names = list(ddl.tables)
        if not any(tracked(*k) or k in self.tables for k in names):
            return out
        out.touched = {k for k in names if tracked(*k)}
        before = (dict(self.tables), dict(self.lost))
        try:
            if ddl.kind == DdlKind.DROP:
                if not re.match(r"DROP\s+TEMPORARY\b", text, re.I):
                    for k in names:
                        self.forget(k, None)
            elif ddl.kind == DdlKind.RENAME:
                for old, new in zip(names[0::2], names[1::2], strict=False):
                    self._rename(old, new, tracked, text)
            else:
                self._parsed(text, default_db, names[0], tracked, out)
        except NotUnderstood as exc:
            for k in names:
                if tracked(*k):
                    self.forget(k, f"{_short(query)} ({exc})")
                    out.lost.append((k, str(exc)))
        out.changed = (self.tables, self.lost) != before
        moved = {
            k for k in {*before[0], *before[1], *self.tables, *self.lost}
            if before[0].get(k) != self.tables.get(k) or before[1].get(k) != self.lost.get(k)
        }
        out.touched |= {k for k in moved if tracked(*k)}
        return out

    def _alter_database(self, m: re.Match[str], default_db: str, out: Applied) -> None:
        db = _unquote(m.group(1)) if m.group(1) else default_db
        cs = _table_charset_from_options(m.group(2))
        if cs is None:
            return
        if self.charsets.get(db) != cs:
            self.charsets[db] = cs
            out.changed = True

    def _rename(self, old: Key, new: Key, tracked: Callable[[str, str], bool], text: str) -> None:
        entry = self.tables.pop(old, None)
        self.lost.pop(old, None)
        if not tracked(*new):
            return
        if entry is not None:
            self.put(new, entry)
        else:
            self.forget(new, f"{_short(text)} (renamed from a table whose columns are not known)")

    def _parsed(
        self, text: str, default_db: str, key: Key, tracked: Callable[[str, str], bool],
        out: Applied,
    ) -> None:
        if _KEYS_ONLY.match(text):
            return  # ALTER TABLE ... ENABLE/DISABLE KEYS (mysqldump): no column changes
        tree = _parse(text)
        if isinstance(tree, _exp().Create):
            self._create(tree, default_db, key, tracked, text)
        elif isinstance(tree, _exp().Alter):
            self._alter(tree, default_db, key, tracked, text, out)
        else:
            raise NotUnderstood("not parsed as CREATE or ALTER TABLE")

    def _create(
        self, tree: Any, default_db: str, key: Key, tracked: Callable[[str, str], bool], text: str,
    ) -> None:
        exp = _exp()
        props = tree.args.get("properties")
        prop_list = list(props.expressions) if props is not None else []
        if any(isinstance(p, exp.TemporaryProperty) for p in prop_list):
            return  # a temporary table never names the base table's rows
        exists = bool(tree.args.get("exists"))
        if exists and key in self.tables:
            return  # CREATE TABLE IF NOT EXISTS of a table that exists: a no-op
        if not tracked(*key):
            return
        if exists:
            # Whether it existed is not known here: it stays unknown.
            self.forget(key, f"{_short(text)} (the table's columns were not known before)")
            return
        like = [p for p in prop_list if isinstance(p, exp.LikeProperty)]
        if like:
            src = _table_key(like[0].this, default_db)
            entry = self.tables.get(src)
            if entry is None:
                raise NotUnderstood(f"LIKE {src[0]}.{src[1]}, whose columns are not known")
            self.put(key, entry)
            return
        if tree.args.get("expression") is not None and not isinstance(tree.this, exp.Schema):
            raise NotUnderstood("CREATE TABLE ... SELECT without column definitions")
        schema = tree.this
        if not isinstance(schema, exp.Schema):
            raise NotUnderstood("no column definitions")
        charset = _props_charset(prop_list) or self.charsets.get(key[0])
        cols: list[SchemaColumn] = []
        pk: tuple[str, ...] = ()
        for item in schema.expressions:
            if isinstance(item, exp.ColumnDef):
                col, is_pk = _column(item, charset)
                cols.append(col)
                if is_pk:
                    pk = (col.name,)
            else:
                found = _primary_key(item)
                if found is not None:
                    pk = found
        if not cols:
            raise NotUnderstood("no columns")
        self.put(key, SchemaTable(tuple(cols), _resolve_pk(pk, cols), charset))

    def _alter(
        self, tree: Any, default_db: str, key: Key, tracked: Callable[[str, str], bool],
        text: str, out: Applied,
    ) -> None:
        exp = _exp()
        entry = self.tables.get(key)
        actions = list(tree.args.get("actions") or [])
        options = list(tree.args.get("options") or [])
        if entry is None:
            # Not known: only a rename matters (the new name is not known either).
            for a in actions:
                if isinstance(a, exp.AlterRename):
                    new = _table_key(a.this, default_db)
                    if tracked(*new):
                        self.forget(new, f"{_short(text)} (renamed from a table whose columns are not known)")
            return
        cols = list(entry.columns)
        pk = list(entry.primary_key)
        charset = entry.charset
        target = key
        for o in options:
            cs = _props_charset([o])
            if cs is not None:
                charset = cs
            elif not isinstance(o, exp.Property | exp.Order):  # ENGINE=, ORDER BY, ...
                raise NotUnderstood(f"table option {o.sql('mysql')!r}")
        for a in actions:
            if isinstance(a, exp.Property):  # FORCE, or a table option among the clauses
                cs = _props_charset([a])
                charset = cs if cs is not None else charset
            elif isinstance(a, exp.ColumnDef):
                if a.args.get("exists") and _find(cols, a.this.name) is not None:
                    continue
                col, is_pk = _column(a, charset)
                if _find(cols, col.name) is not None:
                    raise NotUnderstood(f"column {col.name} exists already")
                _insert(cols, col, a.args.get("position"), len(cols))
                if is_pk:
                    pk = [col.name]
            elif isinstance(a, exp.Drop):
                kind = str(a.args.get("kind") or "").upper()
                if kind == "COLUMN":
                    for t in a.args.get("tables") or []:
                        i = _find(cols, t.name)
                        if i is None:
                            if a.args.get("exists"):
                                continue
                            raise NotUnderstood(f"no column {t.name} to drop")
                        gone = cols.pop(i).name
                        pk = [k for k in pk if k.lower() != gone.lower()]
                elif kind not in ("INDEX", "KEY", "FOREIGN KEY", "CHECK", "CONSTRAINT"):
                    raise NotUnderstood(f"DROP {kind or a.sql('mysql')}")
            elif isinstance(a, exp.ModifyColumn):
                old_name = a.args.get("rename_from")
                cd = a.this
                name = old_name.name if old_name is not None else cd.this.name
                i = _find(cols, name)
                if i is None:
                    raise NotUnderstood(f"no column {name} to change")
                col, is_pk = _column(cd, charset)
                old = cols.pop(i)
                _insert(cols, col, cd.args.get("position"), i)
                pk = [col.name if k.lower() == old.name.lower() else k for k in pk]
                if is_pk:
                    pk = [col.name]
            elif isinstance(a, exp.RenameColumn):
                i = _find(cols, a.this.name)
                if i is None:
                    raise NotUnderstood(f"no column {a.this.name} to rename")
                new_name = a.args["to"].name
                old = cols[i]
                cols[i] = replace(old, name=new_name)
                pk = [new_name if k.lower() == old.name.lower() else k for k in pk]
            elif isinstance(a, exp.AlterRename):
                target = _table_key(a.this, default_db)
            elif isinstance(a, exp.AddConstraint):
                for c in a.expressions:
                    found = _primary_key(c)
                    if found is not None:
                        pk = list(found)
            elif isinstance(a, exp.DropPrimaryKey):
                pk = []
            elif isinstance(a, exp.AlterColumn | exp.RenameIndex):
                continue  # defaults, visibility, index names: no column changes
            else:
                raise NotUnderstood(f"clause {a.sql('mysql')!r}")
        result = SchemaTable(tuple(cols), _resolve_pk(tuple(pk), cols), charset)
        if target != key:
            self.tables.pop(key, None)
            self.lost.pop(key, None)
            if tracked(*target):
                self.put(target, result)
                out.touched.add(target)
        else:
            self.put(key, result)


def read_baseline(
    cur: Any, history: SchemaHistory, keys: Iterable[Key], dbs: Iterable[str],
    changes_ahead: Callable[[Key], bool],
) -> None:
    """A fresh start: the default charset of each of ``dbs`` and the definition of each
    of ``keys`` (the tracked tables) into ``history``, read from information_schema on
    ``cur``. A table with DDL in the binlog after the start (``changes_ahead``: run while
    this was read) is left out: it is read when met, under tablemap.py's rules."""
    for db in sorted(set(dbs)):
        cur.execute(
            "SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA "
            "WHERE SCHEMA_NAME = %s",
            (db,),
        )
        row = cur.fetchone()
        if row is not None and row[0]:
            history.charsets[db] = str(row[0]).lower()
    for key in keys:
        found = read_table(cur, *key)
        if found is not None and not changes_ahead(key):
            history.put(key, found)


def history_mismatch(key: Key, where: str, server: str, why: str) -> SourceError:
    """The rows at ``where`` do not match the history's definition of ``key``."""
    return SourceError(
        f"cannot decode the rows of {key[0]}.{key[1]} at {where} in the binlog of MySQL "
        f"at {server}: this server writes no column names into the binlog, "
        f"and the schema history (the table's columns as the DDL read from the binlog "
        f"left them) does not match the rows: {why}",
        hint="a DDL on the table was not understood as the server executed it; start "
        "with a fresh [log] path and snapshot the tables again (and report the DDL)",
    )


# -- sqlglot ------------------------------------------------------------------------------
def _exp() -> Any:
    # sqlglot (the mysql extra) is imported when a DDL is first parsed: only servers
    # without column names in the binlog need it, and its import takes a moment.
    from sqlglot import exp

    return exp


# Type aliases that sqlglot maps to another MySQL type than MySQL does (REAL is DOUBLE,
# LONG is MEDIUMTEXT), or not at all: a statement using one is not interpreted.
_ALIASES = re.compile(r"\b(?:REAL|LONG|INT3|MIDDLEINT|FLOAT4|FLOAT8|NATIONAL|UNICODE)\b", re.I)
_STRINGS = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"|`(?:[^`]|``)*`", re.S)


_KEYS_ONLY = re.compile(
    r"^ALTER\s+TABLE\s+(?:`(?:[^`]|``)+`|[\w$]+)(?:\s*\.\s*(?:`(?:[^`]|``)+`|[\w$]+))?"
    r"\s+(?:ENABLE|DISABLE)\s+KEYS\s*;?\s*$",
    re.I,
)


def _parse(text: str) -> Any:
    import sqlglot
    from sqlglot.errors import ParseError, TokenError

    if _ALIASES.search(_STRINGS.sub("''", text)):
        raise NotUnderstood("a type alias (REAL, LONG, NATIONAL, ...) this reader does not map")
    logger = logging.getLogger("sqlglot")
    level = logger.level
    logger.setLevel(logging.ERROR)  # "falling back to parsing as a Command" is ours to say
    try:
        return sqlglot.parse_one(text, read="mysql")
    except (ParseError, TokenError, ValueError) as exc:
        raise NotUnderstood(f"sqlglot cannot parse it: {str(exc).splitlines()[0][:120]}") from None
    finally:
        logger.setLevel(level)


_TYPE_MAP: dict[str, tuple[str, bool]] = {
    # sqlglot DataType.Type name -> (information_schema DATA_TYPE, unsigned)
    "TINYINT": ("tinyint", False), "UTINYINT": ("tinyint", True),
    "SMALLINT": ("smallint", False), "USMALLINT": ("smallint", True),
    "MEDIUMINT": ("mediumint", False), "UMEDIUMINT": ("mediumint", True),
    "INT": ("int", False), "UINT": ("int", True),
    "BIGINT": ("bigint", False), "UBIGINT": ("bigint", True),
    "BOOLEAN": ("tinyint", False), "SERIAL": ("bigint", True),
    "FLOAT": ("float", False), "DOUBLE": ("double", False), "UDOUBLE": ("double", True),
    "DECIMAL": ("decimal", False), "UDECIMAL": ("decimal", True),
    "DATE": ("date", False), "TIME": ("time", False), "DATETIME": ("datetime", False),
    "TIMESTAMPTZ": ("timestamp", False), "TIMESTAMP": ("timestamp", False),
    "YEAR": ("year", False),
    "CHAR": ("char", False), "NCHAR": ("char", False),
    "VARCHAR": ("varchar", False), "NVARCHAR": ("varchar", False),
    "BINARY": ("binary", False), "VARBINARY": ("varbinary", False),
    "TINYTEXT": ("tinytext", False), "TEXT": ("text", False),
    "MEDIUMTEXT": ("mediumtext", False), "LONGTEXT": ("longtext", False),
    "TINYBLOB": ("tinyblob", False), "BLOB": ("blob", False),
    "MEDIUMBLOB": ("mediumblob", False), "LONGBLOB": ("longblob", False),
    "ENUM": ("enum", False), "SET": ("set", False), "BIT": ("bit", False),
    "JSON": ("json", False), "GEOMETRY": ("geometry", False),
}
_BINARY_OF = {"char": "binary", "varchar": "varbinary", "tinytext": "tinyblob",
              "text": "blob", "mediumtext": "mediumblob", "longtext": "longblob"}


def _column(cd: Any, table_charset: str | None) -> tuple[SchemaColumn, bool]:
    """A column definition as information_schema would describe it, and whether it
    declares itself the primary key."""
    exp = _exp()
    name = cd.this.name
    kind = cd.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise NotUnderstood(f"column {name} has no type")
    tname = kind.this.name
    if tname not in _TYPE_MAP:
        raise NotUnderstood(f"column {name}: type {kind.sql('mysql')}")
    data_type, unsigned = _TYPE_MAP[tname]
    params = [p.sql("mysql") for p in kind.expressions]
    if data_type == "float" and len(params) == 1 and params[0].isdigit() and int(params[0]) > 24:
        data_type = "double"  # FLOAT(p) with p > 24 is a DOUBLE
    constraints = [c.args.get("kind") for c in cd.args.get("constraints") or []]
    if any(isinstance(c, exp.ZeroFillColumnConstraint) for c in constraints):
        unsigned = True  # ZEROFILL implies UNSIGNED
    is_pk = any(isinstance(c, exp.PrimaryKeyColumnConstraint) for c in constraints)
    charset: str | None = None
    if data_type in _TEXT or data_type in ("enum", "set"):
        explicit = [c for c in constraints if isinstance(c, exp.CharacterSetColumnConstraint)]
        collate = [c for c in constraints if isinstance(c, exp.CollateColumnConstraint)]
        if explicit:
            charset = explicit[0].this.name.lower()
        elif collate:
            charset = charset_of_collation(collate[0].this.name)
        elif tname in ("NCHAR", "NVARCHAR"):
            charset = "utf8"
        else:
            charset = table_charset
        if charset is None:
            raise NotUnderstood(f"column {name}: its charset (the table's default) is not known")
        if charset == "binary" and data_type in _BINARY_OF:
            data_type, charset = _BINARY_OF[data_type], None
    if data_type in ("enum", "set"):
        members = [str(m.this) for m in kind.expressions]
        body = ",".join("'" + m.replace("'", "''") + "'" for m in members)
        column_type = f"{data_type}({body})"
    else:
        column_type = data_type + (" unsigned" if unsigned else "")
    return SchemaColumn(name, data_type, column_type, charset, data_type == "json"), is_pk


def _primary_key(item: Any) -> tuple[str, ...] | None:
    exp = _exp()
    if isinstance(item, exp.Constraint):
        for e in item.expressions:
            found = _primary_key(e)
            if found is not None:
                return found
        return None
    if not isinstance(item, exp.PrimaryKey):
        return None
    names = []
    for e in item.expressions:
        if isinstance(e, exp.ColumnPrefix | exp.Ordered):
            e = e.this
        if not isinstance(e, exp.Identifier | exp.Column):
            raise NotUnderstood(f"primary key part {e.sql('mysql')!r}")
        names.append(e.name)
    return tuple(names)


def _resolve_pk(pk: tuple[str, ...], cols: list[SchemaColumn]) -> tuple[str, ...]:
    """Key names spelled as the columns are (names compare case-insensitively)."""
    out = []
    for k in pk:
        i = _find(cols, k)
        if i is None:
            raise NotUnderstood(f"primary key column {k} is not a column")
        out.append(cols[i].name)
    return tuple(out)


def _find(cols: list[SchemaColumn], name: str) -> int | None:
    low = name.lower()
    for i, c in enumerate(cols):
        if c.name.lower() == low:
            return i
    return None


def _insert(cols: list[SchemaColumn], col: SchemaColumn, position: Any, default: int) -> None:
    if position is None:
        cols.insert(default, col)
        return
    where = str(position.args.get("position") or "").upper()
    if where == "FIRST":
        cols.insert(0, col)
    elif where == "AFTER":
        i = _find(cols, position.this.name)
        if i is None:
            raise NotUnderstood(f"no column {position.this.name} to put {col.name} after")
        cols.insert(i + 1, col)
    else:
        raise NotUnderstood(f"column position {position.sql('mysql')!r}")


def _props_charset(props: Iterable[Any]) -> str | None:
    exp = _exp()
    found = None
    for p in props:
        if isinstance(p, exp.CharacterSetProperty):
            return str(p.this.name).lower()
        if isinstance(p, exp.CollateProperty):
            found = charset_of_collation(str(p.this.name))
    return found


def _table_key(table: Any, default_db: str) -> Key:
    db = table.args.get("db")
    return (db.name if db is not None else default_db, table.name)


# -- text ---------------------------------------------------------------------------------
_LEXEME = re.compile(
    r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"|`(?:[^`]|``)*`"  # quoted
    r"|/\*!(\d{5,6})?"  # an executable comment opens
    r"|\*/"  # an (executable) comment closes
    r"|/\*.*?\*/|--[ \t][^\n]*|--\n|#[^\n]*",  # other comments
    re.S,
)
_ALTER_DB = re.compile(
    r"^\s*ALTER\s+(?:DATABASE|SCHEMA)\s*(`(?:[^`]|``)+`|[A-Za-z0-9_$]+)?\s+(.*)$", re.I | re.S
)
_DB_OPTION = re.compile(
    r"(?:DEFAULT\s+)?(CHARACTER\s+SET|CHARSET|COLLATE)\s*=?\s*'?([A-Za-z0-9_]+)'?", re.I
)


def strip_comments(query: str, server_version: int) -> str:
    """The statement as the server executed it: the body of ``/*!NNNNN ... */`` kept
    where the server is at least version NNNNN (dropped otherwise), other comments
    removed; quoted strings and identifiers untouched."""
    out: list[str] = []
    pos = 0
    skipping = 0  # inside an executable comment for a newer server
    opened = 0  # executable comments whose body is kept
    for m in _LEXEME.finditer(query):
        if not skipping:
            out.append(query[pos : m.start()])
        lexeme = m.group(0)
        if lexeme.startswith("/*!"):
            version = m.group(1)
            if skipping or (version is not None and int(version) > server_version):
                skipping += 1
            else:
                opened += 1
            out.append(" ")
        elif lexeme == "*/" and (skipping or opened):
            if skipping:
                skipping -= 1
            else:
                opened -= 1
            out.append(" ")
        elif lexeme[0] in "'\"`" and not skipping:
            out.append(lexeme)
        elif lexeme[0] not in "'\"`":
            out.append(" ")
        pos = m.end()
    if not skipping:
        out.append(query[pos:])
    return "".join(out).strip()


def _table_charset_from_options(options: str) -> str | None:
    found = None
    for kind, value in _DB_OPTION.findall(options):
        is_collation = kind.upper() == "COLLATE"
        found = (found or charset_of_collation(value)) if is_collation else value.lower()
    return found


def _unquote(ident: str) -> str:
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def _short(query: str) -> str:
    return " ".join(query.split())[:200]


# -- the history in a binlog stream -------------------------------------------------------
VERIFY_WITHIN_BYTES = 4 << 20
"""A history definition is checked against information_schema when met this close to
the binlog's end (the DDL scan up to the end is cheap there)."""


def version_number(version: str) -> int:
    """``"5.7.29-log"`` -> ``50729`` (as in ``/*!50729 ... */`` comments)."""
    parts = [*version.split("-", 1)[0].split("."), "0", "0"][:3]
    try:
        major, minor, patch = (int(p) for p in parts)
    except ValueError:
        return 50700
    return major * 10000 + minor * 100 + patch


def load_history(
    cur: Any, mariadb: bool, raw: Any, tracked: Callable[[str, str], bool]
) -> SchemaHistory | None:
    """The schema history a checkpoint carries (``raw``, its ``HISTORY_KEY``); None where
    the binlog has column names (MariaDB; MySQL with ``binlog_row_metadata``); an empty
    one for a change log written without it (tables are then read from
    information_schema when met, as tablemap.py allows)."""
    cur.execute("SHOW GLOBAL VARIABLES LIKE 'binlog_row_metadata'")
    if mariadb or cur.fetchone() is not None:
        return None
    cur.execute("SELECT @@version")
    version = version_number(str(cur.fetchone()[0]))
    return SchemaHistory.load(raw, version, tracked)


def stale_table(key: Key, where: str, server: str, why: str) -> SourceError:
    """The rows at ``where`` cannot be named: information_schema no longer describes them."""
    return SourceError(
        f"cannot decode the rows of {key[0]}.{key[1]} at {where} in the binlog of MySQL "
        f"at {server}: this server does not write column names into the "
        f"binlog (no binlog_row_metadata before MySQL 8.0.14), and information_schema no "
        f"longer describes these rows: {why}",
        hint="the table's columns were renamed, moved, dropped or changed while capture "
        "was behind; on MySQL 5.7 change columns only while capture is caught up "
        "(docs/mysql.md, 'MySQL 5.7'), or use MySQL 8.0.14+ with "
        "binlog_row_metadata=FULL. To go on: start with a fresh [log] path and snapshot "
        "the tables again",
    )


class TableNames:
    """Names the columns of TABLE_MAPs that carry none (no binlog_row_metadata) for one
    binlog stream: from the schema history (``history``; None where the source keeps
    none), else from information_schema where that is the rows' own definition (see
    tablemap.py); and moves the history along the stream's DDL.

    Invariants:
    - ``defs`` holds the definitions in use, ``(definition, appended, from the
      history)``; one is dropped at each DDL on its table (``forget``) and all at each
      new dump (``reset``);
    - every change to ``history`` is reported by the caller as a ``SourceState``
      (``state``) at or before the first item that relies on it;
    - a DDL at or below what a resume already logged is not applied again (``ddl``'s
      ``logged``: the checkpoint's history has it)."""

    def __init__(
        self,
        history: SchemaHistory | None,
        cursor: Callable[[], AbstractContextManager[Any]],
        tracked: Callable[[str, str], bool],
        server: str,
    ) -> None:
        self.history = history
        self.cursor = cursor  # a cursor on the control connection, held alone
        self.tracked = tracked
        self.server = server
        self.defs: dict[Key, tuple[SchemaTable, bool, bool]] = {}
        self.lookahead = DdlLookahead()

    def reset(self) -> None:
        """A new dump: nothing read ahead, no definition in use."""
        self.defs.clear()
        self.lookahead.reset()

    def forget(self, key: Key) -> None:
        self.defs.pop(key, None)

    def state(self, position: Any) -> SourceState:
        assert self.history is not None
        return SourceState(HISTORY_KEY, self.history.to_json(), position)

    def baseline(self, names: Iterable[Key], dbs: Iterable[str], file: str, offset: int) -> SourceState:
        """A fresh start at ``(file, offset)``: every tracked table of ``names`` read
        from information_schema into the history (``read_baseline``); its state."""
        assert self.history is not None
        with self.cursor() as cur:
            read_baseline(
                cur, self.history, [k for k in dict.fromkeys(names) if self.tracked(*k)], dbs,
                lambda key: bool(self.lookahead.ahead(cur, (file, offset), *key)),
            )
        self.lookahead.reset()
        return self.state(None)

    def ddl(self, pos: Any, query: str, default_db: str, logged: bool) -> Iterator[SourceState]:
        """Move the history past the QUERY event at ``pos`` (``logged``: at or below what
        a resume already logged); a DDL on a tracked table gives a ``SourceState`` at its
        own position (also when nothing changed: the checkpoint must pass it, or a
        definition read later from information_schema, which already has it, would get
        it applied again after a restart)."""
        history = self.history
        if history is None or logged:
            return
        applied = history.follow(query, default_db, self.tracked, pos)
        for key in applied.touched:
            self.defs.pop(key, None)
        if applied.touched:
            yield self.state(pos)

    def name(self, table: Any, file: str, start: int) -> bool:
        """Name the columns of ``table`` (a TABLE_MAP's, at ``file:start``) and set its
        primary key; SourceError when neither the history nor information_schema
        describes its rows. True if the history changed."""
        key = (str(table.schema), str(table.table))
        if not self.tracked(*key):
            return False  # never decoded
        where = f"{file}:{start}"
        changed = False
        cached = self.defs.get(key)
        if cached is None:
            cached, changed = self._definition(key, file, start, where)
            self.defs[key] = cached
        defn, appended, from_history = cached
        why = type_mismatch(table.columns, defn, appended)
        if why is not None:
            self.defs.pop(key, None)
            if from_history:
                raise history_mismatch(key, where, self.server, why)
            raise stale_table(key, where, self.server, why)
        name_columns(table.columns, defn)
        pk = defn.primary_key
        table.primary_key = pk[0] if len(pk) == 1 else (tuple(pk) if pk else "")
        return changed

    def _definition(
        self, key: Key, file: str, start: int, where: str
    ) -> tuple[tuple[SchemaTable, bool, bool], bool]:
        """``((definition, appended, from the history), history changed)``."""
        history = self.history
        entry = history.tables.get(key) if history is not None else None
        if entry is not None:
            if history is None or not self._near_end(file, start):
                return (entry, False, True), False
            # Nearly caught up: information_schema is checked against the history where
            # no DDL on the table lies ahead (then it describes these rows exactly).
            with self.cursor() as cur:
                if self.lookahead.ahead(cur, (file, start), *key):
                    return (entry, False, True), False
                found = read_table(cur, *key)
            if found is None or signature(found) == signature(entry):
                return (entry, False, True), False
            log.warning(
                "the schema history's columns of %s.%s differ from information_schema's, "
                "with no DDL on it ahead in the binlog (a DDL was read wrongly); using "
                "information_schema's from %s on: history %s, information_schema %s",
                *key, where, signature(entry), signature(found),
            )
            history.put(key, found)
            return (found, False, False), True
        with self.cursor() as cur:
            found = read_table(cur, *key)
            ahead = self.lookahead.ahead(cur, (file, start), *key)
        risky = [d for d in ahead if may_rename(*d)]
        if found is None or risky:
            now = "no longer exists" if found is None else "now has another definition"
            later = f" (later in the binlog: {describe(risky)})" if risky else ""
            lost = history.lost.get(key) if history is not None else None
            since = f"; the schema history lost its columns at: {lost}" if lost else ""
            raise stale_table(key, where, self.server, f"the table {now}{later}{since}")
        # Harmless ALTERs ahead (ADD COLUMN, ADD INDEX, ...): columns may have been
        # appended since these rows.
        appended = any(kind == DdlKind.ALTER for kind, _ in ahead)
        if history is not None and not ahead:
            history.put(key, found)  # exact: these rows' own definition
            return (found, appended, False), True
        return (found, appended, False), False

    def _near_end(self, file: str, start: int) -> bool:
        """Whether less than ``VERIFY_WITHIN_BYTES`` of binlog follow ``start`` in
        ``file`` (then scanning them for DDL is cheap)."""
        if not file:
            return False
        with self.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
        here = file_sequence(file)
        rest = sum(
            size - start if file_sequence(name) == here else size
            for name, size in logs
            if file_sequence(name) >= here
        )
        return rest < VERIFY_WITHIN_BYTES
