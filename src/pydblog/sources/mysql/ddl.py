"""Which tables a DDL statement from a binlog QueryEvent touches.

The statement is tokenized the way the server reads it: string literals ('...', "...",
with backslash escapes and doubled quotes) and comments (``/* */``, ``-- ``, ``#``) are
skipped, executable comments (``/*!40005 TEMPORARY */``, MariaDB's ``/*M!100101 ... */``)
are code (the server runs them), backquoted names are names. Only the statement's head and,
for ALTER TABLE, its top-level clauses are read: the verb, the table names (``db.t``) and a
``RENAME [TO|AS] name`` clause. Anything not recognised is "not a table DDL" and ignored; a
missed DDL costs only a late ``SchemaChanged`` (the binlog's own TABLE_MAP metadata keeps
row decoding right). A word inside a literal or a comment never names a table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<exec>/\*M?!\d*)                       # executable comment: its body is code
  | (?P<comment>/\*.*?(?:\*/|\Z)|--(?:[ \t][^\n]*)?(?:\n|\Z)|\#[^\n]*)
  | (?P<end>\*/)                              # the end of an executable comment
  | (?P<str>'(?:[^'\\]|\\.|'')*(?:'|\Z))
  | (?P<dq>"(?:[^"\\]|\\.|"")*(?:"|\Z))
  | (?P<ident>`(?:[^`]|``)*(?:`|\Z))
  | (?P<word>[\w$]+)
  | (?P<punct>.)
    """,
    re.S | re.X,
)
_NOT_NAMES = frozenset(("TO", "AS", "IF", "EXISTS", "RESTRICT", "CASCADE", "WAIT", "NOWAIT"))


class DdlKind(StrEnum):
    ALTER = "alter"
    CREATE = "create"
    DROP = "drop"
    RENAME = "rename"
    TRUNCATE = "truncate"


@dataclass(frozen=True, slots=True)
class Ddl:
    """``tables``: (database, table) names; for RENAME (and an ALTER TABLE with a RENAME
    clause) (old, new) pairs in order. ``temporary``: a CREATE/DROP TEMPORARY TABLE (its
    names are session tables, never the captured ones they may shadow). ``or_replace``:
    MariaDB's CREATE OR REPLACE TABLE (an implicit DROP of an existing table)."""

    kind: DdlKind
    tables: tuple[tuple[str, str], ...]
    temporary: bool = False
    or_replace: bool = False


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # "word", "ident" (`x` or "x"), "str", "punct"
    text: str  # words upper-cased for keyword tests in ``up``; names unquoted

    @property
    def up(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


def tokenize(query: str) -> list[_Tok]:
    """The statement's tokens, comments dropped, executable comments' bodies kept."""
    out: list[_Tok] = []
    for m in _TOKEN.finditer(query):
        kind = m.lastgroup
        text = m.group()
        if kind in ("space", "comment", "exec", "end"):
            continue
        if kind == "ident":
            body = text[1:-1] if len(text) > 1 and text.endswith("`") else text[1:]
            out.append(_Tok("ident", body.replace("``", "`")))
        elif kind == "dq":  # a name under ANSI_QUOTES, else a literal: never a keyword
            out.append(_Tok("ident", text[1:-1].replace('""', '"')))
        elif kind == "str":
            out.append(_Tok("str", text))
        elif kind == "word":
            out.append(_Tok("word", text))
        else:
            out.append(_Tok("punct", text))
    return out


class _Reader:
    def __init__(self, toks: list[_Tok], default_db: str) -> None:
        self.toks = toks
        self.i = 0
        self.default_db = default_db

    def peek(self, ahead: int = 0) -> _Tok | None:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else None

    def kw(self, *words: str) -> bool:
        """Consume the keywords ``words`` if they come next."""
        for n, w in enumerate(words):
            t = self.peek(n)
            if t is None or t.up != w:
                return False
        self.i += len(words)
        return True

    def name(self) -> tuple[str, str] | None:
        """``[db.]table`` at the current token, consumed; None if no name is there."""
        first = self.peek()
        if first is None or first.kind not in ("word", "ident") or first.up in _NOT_NAMES:
            return None
        self.i += 1
        dot, second = self.peek(), self.peek(1)
        if dot is not None and dot.text == "." and dot.kind == "punct" and second is not None \
                and second.kind in ("word", "ident"):
            self.i += 2
            return first.text, second.text
        return self.default_db, first.text

    def comma(self) -> bool:
        """Consume a comma if one comes next."""
        t = self.peek()
        if t is None or t.kind != "punct" or t.text != ",":
            return False
        self.i += 1
        return True

    def skip_clause(self) -> bool:
        """Skip to the next top-level comma (consumed); False at the end."""
        depth = 0
        while (t := self.peek()) is not None:
            self.i += 1
            if t.kind == "punct":
                if t.text == "(":
                    depth += 1
                elif t.text == ")":
                    depth -= 1
                elif t.text == "," and depth <= 0:
                    return True
        return False


def parse_ddl(query: str, default_db: str) -> Ddl | None:
    """The tables a CREATE/ALTER/DROP/RENAME/TRUNCATE TABLE statement names, or None."""
    r = _Reader(tokenize(query), default_db)
    if r.kw("ALTER"):
        r.kw("ONLINE")
        r.kw("IGNORE")
        if not r.kw("TABLE"):
            return None
        r.kw("IF", "EXISTS")
        table = r.name()
        if table is None:
            return None
        tables = [table]
        while True:  # each top-level clause: is it RENAME [TO|AS] name?
            t, nxt = r.peek(), r.peek(1)
            if t is not None and t.up == "RENAME" and not (
                nxt is not None and nxt.up in ("COLUMN", "INDEX", "KEY")
            ):
                r.i += 1
                if not r.kw("TO"):
                    r.kw("AS")
                new = r.name()
                if new is not None:
                    tables[1:] = [new]
            if not r.skip_clause():
                break
        return Ddl(DdlKind.ALTER, tuple(tables))
    if r.kw("CREATE"):
        or_replace = r.kw("OR", "REPLACE")
        temporary = r.kw("TEMPORARY")
        if not r.kw("TABLE"):
            return None
        r.kw("IF", "NOT", "EXISTS")
        table = r.name()
        if table is None:
            return None
        return Ddl(DdlKind.CREATE, (table,), temporary, or_replace)
    if r.kw("DROP"):
        temporary = r.kw("TEMPORARY")
        if not r.kw("TABLE") and not r.kw("TABLES"):
            return None
        r.kw("IF", "EXISTS")
        names = []
        while (n := r.name()) is not None:
            names.append(n)
            if not r.comma():
                break
        return Ddl(DdlKind.DROP, tuple(names), temporary)
    if r.kw("RENAME"):
        if not r.kw("TABLE") and not r.kw("TABLES"):
            return None
        r.kw("IF", "EXISTS")
        pairs: list[tuple[str, str]] = []
        while True:
            old = r.name()
            if r.kw("WAIT"):
                r.i += 1
            r.kw("NOWAIT")
            if old is None or not r.kw("TO"):
                break
            new = r.name()
            if new is None:
                break
            pairs += [old, new]
            if not r.comma():
                break
            r.kw("IF", "EXISTS")
        return Ddl(DdlKind.RENAME, tuple(pairs))
    if r.kw("TRUNCATE"):
        r.kw("TABLE")
        table = r.name()
        return None if table is None else Ddl(DdlKind.TRUNCATE, (table,))
    return None
