"""Small RGB images drawn and encoded with the standard library (zlib, struct).

Two users: the smoke test's vision image (red left half, blue right half) and the bench's
plot. Neither needs more than rectangles, lines and a 3x5 pixel font, which is not worth a
plotting dependency (and its native wheels) on a DGX Spark head.
"""

from __future__ import annotations

import struct
import zlib

Colour = tuple[int, int, int]

WHITE: Colour = (255, 255, 255)
BLACK: Colour = (0, 0, 0)
GLYPH_WIDTH = 3

# 3x5 glyphs, rows top to bottom, '1' = ink. Text is drawn upper-cased.
_FONT: dict[str, str] = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
    "A": "010101111101101",
    "B": "110101110101110",
    "C": "011100100100011",
    "D": "110101101101110",
    "E": "111100110100111",
    "F": "111100110100100",
    "G": "011100101101011",
    "H": "101101111101101",
    "I": "111010010010111",
    "J": "001001001101010",
    "K": "101101110101101",
    "L": "100100100100111",
    "M": "101111111101101",
    "N": "110101101101101",
    "O": "010101101101010",
    "P": "110101110100100",
    "Q": "010101101110011",
    "R": "110101110101101",
    "S": "011100010001110",
    "T": "111010010010010",
    "U": "101101101101111",
    "V": "101101101101010",
    "W": "101101111111101",
    "X": "101101010101101",
    "Y": "101101010010010",
    "Z": "111001010100111",
    ".": "000000000000010",
    ",": "000000000010100",
    "/": "001001010100100",
    "-": "000000111000000",
    "+": "000010111010000",
    "=": "000111000111000",
    "(": "010100100100010",
    ")": "010001001001010",
    ":": "000010000010000",
    "%": "101001010100101",
    " ": "000000000000000",
}


class Canvas:
    """An RGB pixel buffer with just enough drawing for a chart."""

    def __init__(self, width: int, height: int, background: Colour = WHITE) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(background) * (width * height))

    def point(self, x: int, y: int, colour: Colour) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            offset = 3 * (y * self.width + x)
            self.pixels[offset : offset + 3] = bytes(colour)

    def fill(self, x0: int, y0: int, x1: int, y1: int, colour: Colour) -> None:
        """The rectangle [x0, x1) x [y0, y1), clipped to the canvas."""
        left, right = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        if left >= right:
            return
        row = bytes(colour) * (right - left)
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1))):
            offset = 3 * (y * self.width + left)
            self.pixels[offset : offset + len(row)] = row

    def line(self, x0: int, y0: int, x1: int, y1: int, colour: Colour, thickness: int = 1) -> None:
        """Bresenham's line, drawn with a square pen `thickness` pixels wide."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        low = thickness // 2
        while True:
            self.fill(x0 - low, y0 - low, x0 - low + thickness, y0 - low + thickness, colour)
            if x0 == x1 and y0 == y1:
                return
            doubled = 2 * error
            if doubled >= dy:
                error, x0 = error + dy, x0 + sx
            if doubled <= dx:
                error, y0 = error + dx, y0 + sy

    def text(self, x: int, y: int, text: str, colour: Colour = BLACK, scale: int = 2) -> int:
        """Draw `text` with its top-left corner at (x, y); returns the width drawn."""
        cursor = x
        for char in text.upper():
            glyph = _FONT.get(char, _FONT[" "])
            for index, ink in enumerate(glyph):
                if ink == "1":
                    gx, gy = cursor + (index % GLYPH_WIDTH) * scale, y + (index // GLYPH_WIDTH) * scale
                    self.fill(gx, gy, gx + scale, gy + scale, colour)
            cursor += (GLYPH_WIDTH + 1) * scale
        return cursor - x

    def encode(self) -> bytes:
        return encode_png(self.width, self.height, bytes(self.pixels))


def text_width(text: str, scale: int = 2) -> int:
    return len(text) * (GLYPH_WIDTH + 1) * scale


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


def two_halves(width: int, height: int, left: Colour, right: Colour) -> bytes:
    """A PNG whose left half is one colour and right half another (the smoke vision check)."""
    canvas = Canvas(width, height, right)
    canvas.fill(0, 0, width // 2, height, left)
    return canvas.encode()
