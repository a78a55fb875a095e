"""Geospatial indexes on sorted sets (Redis's ``geo.c``, ``geohash.c``,
``geohash_helper.c``): a member's score is its position as a 52-bit geohash, and a
search walks the geohash boxes around a point as Redis does, so replies (members,
their order, ``ANY``'s early stop, distances) are redis-server's.

The hash. Longitude in [-180, 180] and latitude in [-85.05112878, 85.05112878] (the
Web Mercator band) are each scaled to 26 bits (truncated, as C's double to uint32),
then interleaved: latitude on the even bits, longitude on the odd ones. The score is
that integer as a double (exact: 52 bits fit). Decoding takes a box's centre.

Distances are the haversine on a sphere of radius :data:`EARTH_RADIUS_M`, with
``math``'s ``sin``/``cos``/``asin`` (the C library's, as Redis's), and the same
operations in the same order, so the doubles agree bit for bit.

A search (GEOSEARCH, GEORADIUS) picks a geohash precision from the radius, takes the
centre's box and its eight neighbours (dropping those the bounding box cannot reach),
and for each box reads the members whose scores fall in it, in score order, keeping
those within the shape. What the commands do with the result (sort, COUNT, STORE) is
``pion.commands.geo``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pion.keyspace.sortedset import SortedSet

__all__ = [
    "EARTH_RADIUS_M",
    "LAT_MAX",
    "LAT_MIN",
    "LON_MAX",
    "LON_MIN",
    "STEP_MAX",
    "GeoPoint",
    "Shape",
    "decode",
    "distance",
    "encode",
    "geohash_text",
    "search",
]

# geohash.h / geohash_helper.c: the constants Redis uses.
STEP_MAX = 26
LON_MIN, LON_MAX = -180.0, 180.0
LAT_MIN, LAT_MAX = -85.05112878, 85.05112878
EARTH_RADIUS_M = 6372797.560856
_MERCATOR_MAX = 20037726.37
_D_R = math.pi / 180.0
_U64 = (1 << 64) - 1
_EVEN = 0x5555555555555555
_ODD = 0xAAAAAAAAAAAAAAAA
_GEOALPHABET = b"0123456789bcdefghjkmnpqrstuvwxyz"


def _spread(v: int) -> int:
    """The 32 bits of ``v`` on the even bits of a 64-bit integer."""
    v &= 0xFFFFFFFF
    v = (v | (v << 16)) & 0x0000FFFF0000FFFF
    v = (v | (v << 8)) & 0x00FF00FF00FF00FF
    v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0F
    v = (v | (v << 2)) & 0x3333333333333333
    return (v | (v << 1)) & _EVEN


def _squash(v: int) -> int:
    """The even bits of ``v`` packed into 32 bits (the inverse of :func:`_spread`)."""
    v &= _EVEN
    v = (v | (v >> 1)) & 0x3333333333333333
    v = (v | (v >> 2)) & 0x0F0F0F0F0F0F0F0F
    v = (v | (v >> 4)) & 0x00FF00FF00FF00FF
    v = (v | (v >> 8)) & 0x0000FFFF0000FFFF
    return (v | (v >> 16)) & 0x00000000FFFFFFFF


def _encode(
    lon: float,
    lat: float,
    step: int,
    lon_range: tuple[float, float],
    lat_range: tuple[float, float],
) -> int:
    """``geohashEncode``: the interleaved bits of (lon, lat) at ``step`` bits each."""
    lat_off = (lat - lat_range[0]) / (lat_range[1] - lat_range[0]) * float(1 << step)
    lon_off = (lon - lon_range[0]) / (lon_range[1] - lon_range[0]) * float(1 << step)
    # C converts the doubles to uint32 (truncating); the top of a range is 2**step.
    return _spread(int(lat_off)) | (_spread(int(lon_off)) << 1)


def encode(lon: float, lat: float) -> int:
    """The 52-bit score of a position (the caller checked the ranges)."""
    return _encode(lon, lat, STEP_MAX, (LON_MIN, LON_MAX), (LAT_MIN, LAT_MAX))


@dataclass(frozen=True, slots=True)
class _Area:
    lon_min: float
    lon_max: float
    lat_min: float
    lat_max: float


def _area(bits: int, step: int) -> _Area:
    """``geohashDecode``: the box a hash of ``step`` bits names."""
    ilat, ilon = _squash(bits), _squash(bits >> 1)
    scale = float(1 << step)
    lat_scale, lon_scale = LAT_MAX - LAT_MIN, LON_MAX - LON_MIN
    return _Area(
        LON_MIN + (ilon * 1.0 / scale) * lon_scale,
        LON_MIN + ((ilon + 1) * 1.0 / scale) * lon_scale,
        LAT_MIN + (ilat * 1.0 / scale) * lat_scale,
        LAT_MIN + ((ilat + 1) * 1.0 / scale) * lat_scale,
    )


def _score_bits(score: float) -> int:
    """C's ``(uint64_t)`` cast of a score, as x86-64 computes it (a GEOADD score is a
    52-bit integer; any other a ZADD may have put there decodes as in Redis): below
    2**63 a truncation to int64 (out of its range: 2**63, the "integer indefinite"),
    from 2**63 the value less 2**63, converted the same, with the top bit flipped."""
    if score >= 2.0**63:
        score -= 2.0**63
        flip = 1 << 63
    else:
        flip = 0
    if math.isnan(score) or not -(2.0**63) <= score < 2.0**63:
        return (1 << 63) ^ flip
    return (int(score) & _U64) ^ flip


def decode(score: float) -> tuple[float, float]:
    """``decodeGeohash``: the (lon, lat) centre of the box a score names, clamped."""
    a = _area(_score_bits(score), STEP_MAX)
    lon = (a.lon_min + a.lon_max) / 2
    lat = (a.lat_min + a.lat_max) / 2
    return min(max(lon, LON_MIN), LON_MAX), min(max(lat, LAT_MIN), LAT_MAX)


def geohash_text(score: float) -> bytes:
    """GEOHASH's 11 characters: the position re-encoded with the standard latitude
    range [-90, 90] (the 11th character is always ``0``: 52 bits make 10)."""
    lon, lat = decode(score)
    bits = _encode(lon, lat, STEP_MAX, (-180.0, 180.0), (-90.0, 90.0))
    out = bytearray(_GEOALPHABET[(bits >> (52 - (i + 1) * 5)) & 0x1F] for i in range(10))
    out.append(_GEOALPHABET[0])
    return bytes(out)


def _lat_distance(lat1: float, lat2: float) -> float:
    return EARTH_RADIUS_M * abs(lat2 * _D_R - lat1 * _D_R)


def distance(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    """``geohashGetDistance``: the haversine distance in meters."""
    lon1r, lon2r = lon1 * _D_R, lon2 * _D_R
    v = math.sin((lon2r - lon1r) / 2)
    if v == 0.0:  # the same meridian: Redis skips the costly terms
        return _lat_distance(lat1, lat2)
    lat1r, lat2r = lat1 * _D_R, lat2 * _D_R
    u = math.sin((lat2r - lat1r) / 2)
    a = u * u + math.cos(lat1r) * math.cos(lat2r) * v * v
    return 2.0 * EARTH_RADIUS_M * math.asin(math.sqrt(a))


@dataclass(frozen=True, slots=True)
class Shape:
    """A search's centre and extent: a radius (``width`` 0) or a box, in the unit
    ``to_meters`` converts."""

    lon: float
    lat: float
    to_meters: float
    radius: float = 0.0
    width: float = 0.0
    height: float = 0.0
    box: bool = False

    def within(self, lon: float, lat: float) -> float | None:
        """``geoWithinShape``: the distance to (lon, lat) in meters, or None outside."""
        if not self.box:
            d = distance(self.lon, self.lat, lon, lat)
            return None if d > self.radius * self.to_meters else d
        if _lat_distance(lat, self.lat) > self.height * self.to_meters / 2:
            return None
        if distance(lon, lat, self.lon, lat) > self.width * self.to_meters / 2:
            return None
        return distance(self.lon, self.lat, lon, lat)


@dataclass(slots=True)
class GeoPoint:
    member: bytes
    score: float
    dist: float  # meters until the command converts it
    lon: float
    lat: float


def _steps_for(range_m: float, lat: float) -> int:
    """``geohashEstimateStepsByRadius``."""
    if range_m == 0:
        return 26
    step = 1
    while range_m < _MERCATOR_MAX:
        range_m *= 2
        step += 1
    step -= 2
    if lat > 66 or lat < -66:
        step -= 1
        if lat > 80 or lat < -80:
            step -= 1
    return min(max(step, 1), 26)


def _move(bits: int, step: int, dx: int, dy: int) -> int:
    """``geohash_move_x``/``geohash_move_y``: the neighbouring box's hash."""
    for d, moving, still in ((dx, _ODD, _EVEN), (dy, _EVEN, _ODD)):
        if d == 0:
            continue
        x, y = bits & moving, bits & still
        zz = still >> (64 - step * 2)
        # Forward: add one at the lowest moving bit (the still bits, set, carry it
        # across); back: set the still bits, subtract one. Then keep step's bits.
        x = (x + zz + 1) if d > 0 else ((x | zz) - (zz + 1))
        x &= _U64 & (moving >> (64 - step * 2))
        bits = x | y
    return bits


# membersOfAllNeighbors' order: the centre, N, S, E, W, NE, NW, SE, SW.
_AROUND = ((0, 0), (0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (-1, 1), (1, -1), (-1, -1))


def _bounds(shape: Shape) -> tuple[float, float, float, float]:
    """``geohashBoundingBox``: (min lon, min lat, max lon, max lat)."""
    half_h = shape.to_meters * (shape.height / 2 if shape.box else shape.radius)
    half_w = shape.to_meters * (shape.width / 2 if shape.box else shape.radius)
    lat_delta = half_h / EARTH_RADIUS_M / _D_R
    top = half_w / EARTH_RADIUS_M / math.cos((shape.lat + lat_delta) * _D_R) / _D_R
    bottom = half_w / EARTH_RADIUS_M / math.cos((shape.lat - lat_delta) * _D_R) / _D_R
    delta = bottom if shape.lat < 0 else top
    return shape.lon - delta, shape.lat - lat_delta, shape.lon + delta, shape.lat + lat_delta


def _boxes(shape: Shape) -> list[tuple[int, int] | None]:
    """``geohashCalculateAreasByShapeWGS84``: the nine (hash, step) boxes, None for
    those dropped."""
    min_lon, min_lat, max_lon, max_lat = _bounds(shape)
    if shape.box:
        radius_m = math.sqrt((shape.width / 2) ** 2 + (shape.height / 2) ** 2)
    else:
        radius_m = shape.radius
    steps = _steps_for(radius_m * shape.to_meters, shape.lat)
    lon_range, lat_range = (LON_MIN, LON_MAX), (LAT_MIN, LAT_MAX)
    bits = _encode(shape.lon, shape.lat, steps, lon_range, lat_range)
    north = _area(_move(bits, steps, 0, 1), steps)
    south = _area(_move(bits, steps, 0, -1), steps)
    east = _area(_move(bits, steps, 1, 0), steps)
    west = _area(_move(bits, steps, -1, 0), steps)
    if steps > 1 and (
        north.lat_max < max_lat
        or south.lat_min > min_lat
        or east.lon_max < max_lon
        or west.lon_min > min_lon
    ):
        steps -= 1
        bits = _encode(shape.lon, shape.lat, steps, lon_range, lat_range)
    area = _area(bits, steps)
    out: list[tuple[int, int] | None] = [(_move(bits, steps, dx, dy), steps) for dx, dy in _AROUND]
    if steps >= 2:
        for i, (dx, dy) in enumerate(_AROUND):
            if (
                (dy == -1 and area.lat_min < min_lat)
                or (dy == 1 and area.lat_max > max_lat)
                or (dx == -1 and area.lon_min < min_lon)
                or (dx == 1 and area.lon_max > max_lon)
            ):
                out[i] = None
    return out


def search(z: SortedSet, shape: Shape, limit: int = 0) -> list[GeoPoint]:
    """``membersOfAllNeighbors``: the members within ``shape``, box by box, each box
    in score order; with ``limit`` (ANY) the walk stops once that many are found."""
    found: list[GeoPoint] = []
    boxes = _boxes(shape)
    last = 0
    for i, box in enumerate(boxes):
        if box is None:
            continue
        # With a huge radius neighbours can coincide: skip a repeat of the previous
        # box (Redis never compares with the centre, its index 0, being "unset").
        if last and box == boxes[last]:
            continue
        if found and limit and len(found) >= limit:
            break
        bits, step = box
        low = float(bits << (52 - step * 2))
        high = float((bits + 1) << (52 - step * 2))
        first, end = z.rank_bounds(low, False, high, True)
        for score, member in z.at(first, end):
            lon, lat = decode(score)
            dist = shape.within(lon, lat)
            if dist is not None:
                found.append(GeoPoint(member, score, dist, lon, lat))
            if found and limit and len(found) >= limit:
                break
        last = i
    return found
