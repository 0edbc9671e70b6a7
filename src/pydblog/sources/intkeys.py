"""Which chunk keys are integers, for arithmetic key ranges (``core.intsplit``)."""

from __future__ import annotations

import os

DISABLE_ENV = "PYDBLOG_INT_RANGES"
"""``PYDBLOG_INT_RANGES=0`` cuts integer keys by bounds queries too (benchmarks compare
both)."""

POSTGRES_TYPES = frozenset({"smallint", "integer", "bigint"})
"""``format_type`` names of PostgreSQL's integer types (a domain over one is not
recognised: it keeps bounds queries)."""

MYSQL_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})
"""MySQL/MariaDB ``DATA_TYPE``s of the integer types, signed or unsigned (not ``bit``,
``year`` nor ``tinyint(1)``, which the mapping may carry as a boolean)."""


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0"
