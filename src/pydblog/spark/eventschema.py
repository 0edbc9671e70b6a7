"""The row schema of the ``dblog`` Spark source, apart from the source itself: the
executors' decoder (``decode.py``) and the planning side (``source.py``) both read it,
and neither imports the other for it (this module imports nothing)."""

from __future__ import annotations

EVENT_SCHEMA_DDL = (
    "offset BIGINT, op STRING, schema STRING, table STRING, key STRING, before STRING, "
    "after STRING, unchanged ARRAY<STRING>, ts_ms BIGINT, source_ts_ms BIGINT, "
    "snapshot STRING, connector STRING, db STRING, lsn BIGINT, tx_id BIGINT, "
    "tx_index BIGINT, position STRING"
)
"""Row schema. ``key``/``before``/``after`` are JSON text (null when absent);
``ts_ms`` is the time the capture logged the event, ``source_ts_ms`` the source commit
time; ``lsn``/``tx_id``/``tx_index`` are PostgreSQL position fields (null for other
sources) and ``position`` is every source position field as JSON (any connector)."""

EVENT_COLUMNS = tuple(c.split()[0] for c in EVENT_SCHEMA_DDL.split(", "))
"""The columns of ``EVENT_SCHEMA_DDL`` (``decode.ARROW_SCHEMA``) in order."""
