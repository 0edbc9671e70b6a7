"""``SocketReader`` against the bytes a peer sent: over a socket pair, arbitrary writes
read back through arbitrary ``read`` sizes and ``fill`` and ``peek`` calls (buffers smaller and larger
than the reads) give the same bytes in order; a read past the peer's end is short; a
socket timeout raises as with ``makefile``'s reader."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.sources.mysql.sockread import SocketReader


@settings(max_examples=150, deadline=None)
@given(data=st.binary(min_size=0, max_size=4000), size=st.integers(1, 300),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 700)), min_size=1, max_size=60))
def test_reads_return_the_stream_in_order(data: bytes, size: int,
                                          steps: list[tuple[bool, int]]) -> None:
    a, b = socket.socketpair()
    try:
        def send() -> None:
            a.sendall(data)
            a.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=send)
        writer.start()
        reader = SocketReader(b, size)
        got = bytearray()
        for fill, n in steps:
            if fill:
                before = reader.buffered()
                added = reader.fill()
                assert reader.buffered() == before + added
                assert reader.peek() == data[len(got):len(got) + reader.buffered()]
                continue
            part = reader.read(n)
            expected = data[len(got):len(got) + n]
            assert part == expected  # short only at the peer's end
            got += part
        while True:
            part = reader.read(97)
            got += part
            if len(part) < 97:
                break
        assert bytes(got) == data
        assert reader.read(5) == b""
        writer.join()
    finally:
        a.close()
        b.close()


def test_a_timeout_raises() -> None:
    a, b = socket.socketpair()
    try:
        b.settimeout(0.05)
        a.sendall(b"abc")
        reader = SocketReader(b, 16)
        with pytest.raises(TimeoutError):
            reader.read(4)
    finally:
        a.close()
        b.close()
