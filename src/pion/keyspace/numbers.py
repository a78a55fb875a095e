"""Numbers as Redis reads them from arguments and values.

* :func:`parse_int64` is Redis's ``string2ll``: optional ``-``, digits, no ``+``, no
  spaces, no leading zeros, no ``-0``, within a signed 64-bit integer.
* :func:`parse_score` is Redis's ``string2d`` (ZADD scores): C's ``strtod`` over the
  whole argument (decimal, hexadecimal ``0x1.8p3``, ``inf``/``infinity`` in any case),
  refusing a leading space, NaN, overflow to infinity and underflow to zero.
* :func:`parse_range_bound` is ``zslParseRange``'s reading of one ZRANGE BYSCORE bound:
  an optional ``(`` (exclusive), then plain ``strtod`` (which, unlike ``string2d``,
  takes leading spaces, an empty string as 0 and overflow as infinity).
* :func:`parse_long_double` is Redis's ``string2ld`` (INCRBYFLOAT, HINCRBYFLOAT): like
  ``string2d`` but C's ``strtold``, so the range is x87's 80-bit extended (``1e400``
  is a number); :func:`format_long_double` is its ``ld2string`` in human mode
  (``%.17Lf`` with the trailing zeros and dot removed). numpy's ``longdouble`` is that
  same type on x86-64, and parses and prints it exactly.
* :func:`parse_sort_weight` is SORT's reading of a weight: plain ``strtod`` of the C
  string (it ends at a NUL byte), leading spaces taken, an empty string 0, refusing
  trailing bytes, NaN and ``ERANGE`` (overflow, underflow to zero).
* :func:`parse_cursor` is ``parseScanCursorOrReply``: C's ``strtoul``, so ``+5``,
  ``007`` and even ``-1`` (wrapping to 2**64-1) are cursors, and an empty one is 0.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np

__all__ = [
    "format_long_double",
    "parse_cursor",
    "parse_int64",
    "parse_long_double",
    "parse_range_bound",
    "parse_score",
    "parse_sort_weight",
]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_DECIMAL = re.compile(rb"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEX = re.compile(rb"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?)")
_INF = re.compile(rb"([+-]?)(?:inf|infinity)", re.IGNORECASE)
_NAN = re.compile(rb"[+-]?nan(?:\([0-9A-Za-z_]*\))?", re.IGNORECASE)
_NONZERO_MANTISSA = re.compile(rb"[1-9]")
# C's isspace in the "C" locale.
_SPACE = frozenset(b" \t\n\v\f\r")


def parse_int64(raw: bytes) -> int | None:
    """Redis's ``string2ll``; None when ``raw`` is not such an integer."""
    if raw == b"0":
        return 0
    if not 0 < len(raw) <= 20:
        return None
    digits = raw[1:] if raw[:1] == b"-" else raw
    # No sign but '-', digits only, the first of them 1-9 (so no "-0", no "007").
    if not digits.isdigit() or digits[:1] == b"0":
        return None
    value = int(raw)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _strtod_whole(text: bytes) -> tuple[float, bool] | None:
    """``strtod`` over all of ``text``: (value, out of range), or None when ``text`` is
    not one complete number."""
    if _DECIMAL.fullmatch(text):
        value = float(text)
        mantissa = text.split(b"e")[0].split(b"E")[0]
        underflow = value == 0.0 and _NONZERO_MANTISSA.search(mantissa) is not None
        return value, math.isinf(value) or underflow
    m = _HEX.fullmatch(text)
    if m is not None:
        try:
            value = float.fromhex((m.group(1) + b"0x" + m.group(2)).decode("ascii"))
        except OverflowError:
            return math.copysign(math.inf, -1.0 if m.group(1) == b"-" else 1.0), True
        digits = m.group(2).split(b"p")[0].split(b"P")[0]
        underflow = value == 0.0 and re.search(rb"[1-9a-fA-F]", digits) is not None
        return value, underflow
    m = _INF.fullmatch(text)
    if m is not None:
        return (-math.inf if m.group(1) == b"-" else math.inf), False
    if _NAN.fullmatch(text):
        return math.nan, False
    return None


def parse_score(raw: bytes) -> float | None:
    """Redis's ``string2d``; None for anything it refuses."""
    if not raw or raw[0] in _SPACE:
        return None
    parsed = _strtod_whole(raw)
    if parsed is None:
        return None
    value, out_of_range = parsed
    if math.isnan(value) or (out_of_range and (math.isinf(value) or value == 0.0)):
        return None
    return value


def parse_sort_weight(raw: bytes) -> float | None:
    """SORT's weight of an element (see the module docstring); None when refused."""
    text = raw.split(b"\0", 1)[0]
    if not text:
        return 0.0  # nothing converted, and the end pointer is at the NUL: no error
    parsed = _strtod_whole(text.lstrip(bytes(_SPACE)))
    if parsed is None:
        return None
    value, out_of_range = parsed
    return None if out_of_range or math.isnan(value) else value


# Redis's MAX_LONG_DOUBLE_CHARS: string2ld refuses longer text.
_MAX_LONG_DOUBLE_CHARS = 5 * 1024


def parse_long_double(raw: bytes) -> np.longdouble | None:
    """Redis's ``string2ld``; None for anything it refuses."""
    if not raw or len(raw) >= _MAX_LONG_DOUBLE_CHARS or raw[0] in _SPACE:
        return None
    if _strtod_whole(raw) is None or _NAN.fullmatch(raw):
        return None
    with warnings.catch_warnings():
        # numpy warns on overflow in conversion; the check below is Redis's answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        value = np.longdouble(raw.decode("ascii"))
    if np.isinf(value) and _INF.fullmatch(raw) is None:
        return None  # ERANGE overflow
    if value == 0 and re.search(rb"[1-9a-fA-F]", raw.split(b"e")[0].split(b"E")[0].split(b"p")[0]):
        return None  # ERANGE underflow to zero
    return value


def format_long_double(value: np.longdouble) -> bytes:
    """Redis's ``ld2string(LD_STR_HUMAN)`` of a finite value."""
    text = np.format_float_positional(value, precision=17, unique=False, trim="-")
    return b"0" if text == "-0" else text.encode("ascii")


def parse_range_bound(raw: bytes) -> tuple[float, bool] | None:
    """One BYSCORE bound: (value, exclusive), or None for "not a float"."""
    exclusive = raw[:1] == b"("
    text = raw[1:] if exclusive else raw
    stripped = text.lstrip(bytes(_SPACE))
    if not stripped:
        # strtod converts nothing; with nothing after it, Redis takes the 0 it returned.
        return (0.0, exclusive) if not text else None
    parsed = _strtod_whole(stripped)
    if parsed is None or math.isnan(parsed[0]):
        return None
    return parsed[0], exclusive


def parse_cursor(raw: bytes) -> int | None:
    """A SCAN cursor as ``strtoul`` reads it (see the module docstring)."""
    if raw and raw[0] in _SPACE:
        return None
    if not raw:
        return 0
    sign = raw[:1] if raw[:1] in (b"+", b"-") else b""
    digits = raw[len(sign) :]
    if not digits or not digits.isdigit():
        return None
    value = int(digits)
    if value > (1 << 64) - 1:
        return None  # ERANGE
    return ((1 << 64) - value) % (1 << 64) if sign == b"-" else value
