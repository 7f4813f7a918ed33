"""The smoke test's vision image, drawn and encoded with the standard library (zlib, struct).

A red left half and a blue right half: all the vision check needs, and not worth an imaging
dependency on a DGX Spark head. (The bench's plots use matplotlib: reconciler/verify/plot.py.)
"""

from __future__ import annotations

import struct
import zlib

Colour = tuple[int, int, int]


def two_halves(width: int, height: int, left: Colour, right: Colour) -> bytes:
    """A PNG whose left half is one colour and right half another (the smoke vision check)."""
    half = width // 2
    row = bytes(left) * half + bytes(right) * (width - half)
    return encode_png(width, height, row * height)


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB, non-interlaced PNG; every row with filter 0 (None)."""
    if len(rgb) != width * height * 3:
        raise ValueError(f"{len(rgb)} bytes is not {width}x{height} RGB pixels")
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
