"""MySQL / MariaDB source: row-based binlog capture, keyset chunk reader, watermark table.

Importing this package registers ``BinlogPosition`` with ``pydblog.positions``.
"""

from pydblog.sources.mysql.position import BinlogPosition

__all__ = ["BinlogPosition"]
