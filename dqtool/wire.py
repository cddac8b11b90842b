"""Protobuf's wire format, as far as dqtool reads and writes it by hand: varints, and the
fields of a message's bytes (what ``storage.inline_read`` scans and ``inline_write``
frames, and ``convert.value_info`` reads names from, without parsing whole models)."""

from __future__ import annotations

from collections.abc import Iterator

LEN = 2  # the wire type of a length-delimited field (a message, bytes, a string)


class Malformed(ValueError):
    """Bytes that are not protobuf's wire format."""


def encode_varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``buf[pos]``."""
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed("bad varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def length_field(number: int, body_length: int) -> bytes:
    """The tag and length that frame a length-delimited field of ``body_length`` bytes."""
    return encode_varint(number << 3 | LEN) + encode_varint(body_length)


def fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(number, wire type, field start, body start, field end) of each field of the
    message in ``buf[start:end]``."""
    pos = start
    while pos < end:
        key, p = decode_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        body = p
        if wire == 0:
            _, p = decode_varint(buf, p, end)
        elif wire == 1:
            p += 8
        elif wire == 5:
            p += 4
        elif wire == LEN:
            n, body = decode_varint(buf, p, end)
            p = body + n
        else:  # groups: not in onnx.proto
            raise Malformed(f"wire type {wire}")
        if p > end or number == 0:
            raise Malformed("field past the end")
        yield number, wire, pos, body, p
        pos = p
