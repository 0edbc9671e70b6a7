"""Which tables a DDL statement from a binlog QueryEvent touches.

Only the statement's head is parsed: the verb and the table names (``db.t``, backquoted or
not). Anything not recognised is "not a table DDL" and ignored; a missed DDL costs only a
late ``SchemaChanged`` (the binlog's own TABLE_MAP metadata keeps row decoding right).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_NAME = rf"({_IDENT}(?:\s*\.\s*{_IDENT})?)"
_COMMENTS = re.compile(r"/\*.*?\*/|--[^\n]*\n|#[^\n]*\n", re.S)

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "alter",
        re.compile(
            rf"^ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?{_NAME}", re.I
        ),
    ),
    (
        "create",
        re.compile(
            rf"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}",
            re.I,
        ),
    ),
    ("drop", re.compile(r"^DROP\s+(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?(.*)$", re.I | re.S)),
    ("rename", re.compile(r"^RENAME\s+TABLES?\s+(.*)$", re.I | re.S)),
    ("truncate", re.compile(rf"^TRUNCATE\s+(?:TABLE\s+)?{_NAME}", re.I)),
]
_RENAME_TO = re.compile(rf"\bRENAME\s+(?!(?:COLUMN|INDEX|KEY)\b)(?:TO\s+|AS\s+)?{_NAME}", re.I)
"""ALTER TABLE's table rename (not RENAME COLUMN / INDEX / KEY: their names are no table's)."""
_NAME_RE = re.compile(_NAME)


class DdlKind(StrEnum):
    ALTER = "alter"
    CREATE = "create"
    DROP = "drop"
    RENAME = "rename"
    TRUNCATE = "truncate"


@dataclass(frozen=True, slots=True)
class Ddl:
    kind: DdlKind
    tables: tuple[tuple[str, str], ...]  # (database, table)


def _unquote(ident: str) -> str:
    ident = ident.strip()
    if ident.startswith("`"):
        return ident[1:-1].replace("``", "`")
    return ident


def _split(name: str, default_db: str) -> tuple[str, str]:
    parts = re.findall(_IDENT, name)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return default_db, _unquote(parts[0])


def parse_ddl(query: str, default_db: str) -> Ddl | None:
    """The tables a CREATE/ALTER/DROP/RENAME/TRUNCATE TABLE statement names, or None."""
    text = _COMMENTS.sub(" ", query + "\n").strip()
    for kind, pattern in _PATTERNS:
        m = pattern.match(text)
        if not m:
            continue
        if kind in ("drop", "rename"):
            names = [
                _split(n, default_db)
                for n in _NAME_RE.findall(m.group(1))
                if n.upper() not in ("TO", "IF", "EXISTS", "RESTRICT", "CASCADE", "WAIT", "NOWAIT")
            ]
            return Ddl(DdlKind(kind), tuple(names))
        tables = [_split(m.group(1), default_db)]
        if kind == "alter":
            renamed = _RENAME_TO.search(text, m.end())
            if renamed:
                tables.append(_split(renamed.group(1), default_db))
        return Ddl(DdlKind(kind), tuple(tables))
    return None
