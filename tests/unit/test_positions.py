"""Positions: total order, round trips, checkpoint comparison."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition, decode_position, encode_position

positions = st.builds(
    PgPosition,
    st.builds(Lsn, st.integers(min_value=0, max_value=2**64 - 1)),
    st.integers(min_value=0, max_value=10**6),
    st.none() | st.builds(Lsn, st.integers(min_value=0, max_value=2**64 - 1)),
    st.none() | st.integers(min_value=0, max_value=2**32),
)


@given(positions, positions)
def test_order_is_commit_lsn_then_index(a: PgPosition, b: PgPosition) -> None:
    key_a, key_b = (a.commit_lsn.value, a.index), (b.commit_lsn.value, b.index)
    assert (a < b) == (key_a < key_b) and (a <= b) == (key_a <= key_b)
    assert (a == b) == (key_a == key_b)


@given(positions)
def test_round_trip(p: PgPosition) -> None:
    back = decode_position(encode_position(p))
    assert isinstance(back, PgPosition)
    assert (back.commit_lsn, back.index, back.end_lsn, back.tx_id) == (p.commit_lsn, p.index, p.end_lsn, p.tx_id)
    assert p.with_index(p.index + 1) > p
    cp = Checkpoint(p, {"x": 1}, {"initial_started": True})
    again = Checkpoint.from_bytes(cp.to_bytes())
    assert again.position == p and again.snapshot == {"x": 1} and not again.is_newer_than(cp)


def test_lsn_text() -> None:
    assert str(Lsn.parse("16/B374D848")) == "16/B374D848"
    assert Lsn.parse("0/10") - Lsn.parse("0/8") == 8


def test_a_mysql_position_decodes_without_the_mysql_source_imported() -> None:
    """A reader of a MySQL capture's Kafka log (`dblog snapshot --wait`, `dblog tail`,
    `dblog status`) decodes the commits' checkpoints, MySQL positions, without ever
    importing the MySQL source (it failed with "unknown position kind")."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pydblog.positions import decode_position\n"
        "assert 'pydblog.sources.mysql.position' not in sys.modules\n"
        "p = decode_position({'kind': 'mysql', 'file': 'mariadb-bin.000009', 'pos': 14420,"
        " 'i': 3, 'gtids': '0-1-397'})\n"
        "print(type(p).__name__, p.source_fields()['file'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["BinlogPosition", "mariadb-bin.000009"]
