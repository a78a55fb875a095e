"""Geospatial commands on sorted sets: GEOADD (NX/XX/CH), GEOPOS, GEODIST, GEOHASH,
GEOSEARCH, GEOSEARCHSTORE (STOREDIST), GEORADIUS and GEORADIUSBYMEMBER (STORE,
STOREDIST) with their ``_RO`` forms. Argument order, replies and error texts are
Redis 7.0's ``geo.c``; the geohash arithmetic is ``pion.keyspace.geo``'s.

Replies: distances are bulk strings with four decimals in both protocols (Redis's
``addReplyDoubleDistance``); coordinates are Redis's "human" long doubles (``%.17Lf``,
trailing zeros dropped): bulk strings in RESP2, ``,`` doubles in RESP3.

One difference: where Redis names the command as the client typed it ("exactly one
of FROMMEMBER or FROMLONLAT can be specified for geosearch"), we name it in capitals
(handlers are not handed the typed name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from pion.commands.args import parse_int
from pion.commands.state import Command, Context
from pion.commands.zsets import keyword
from pion.errors import PionError
from pion.keyspace.geo import (
    LAT_MAX,
    LAT_MIN,
    LON_MAX,
    LON_MIN,
    GeoPoint,
    Shape,
    decode,
    distance,
    encode,
    geohash_text,
    search,
)
from pion.keyspace.numbers import parse_score
from pion.keyspace.sort import partial_sort
from pion.keyspace.sortedset import SortedSet
from pion.keyspace.zsets import ZAddFlags, zadd
from pion.notify import GENERIC, ZSET, notify
from pion.resp.reply import Encoded, NullArray, Reply

__all__ = ["COMMANDS", "human_double"]

_SYNTAX = "syntax error"
_UNITS = {b"m": 1.0, b"km": 1000.0, b"ft": 0.3048, b"mi": 1609.34}


def human_double(ctx: Context, value: float) -> Reply:
    """Redis's ``addReplyHumanLongDouble`` of a double: ``%.17Lf`` without trailing
    zeros (the long double holds the double exactly, so Python's exact rounding
    agrees), a bulk string in RESP2 and a ``,`` double in RESP3."""
    text = f"{value:.17f}".rstrip("0").rstrip(".")
    if text == "-0":
        text = "0"
    raw = text.encode("ascii")
    return Encoded(b"," + raw + b"\r\n") if ctx.client.proto == 3 else raw


def _distance_text(d: float) -> bytes:
    return f"{d:.4f}".encode("ascii")


def _double(raw: bytes, error: str = "value is not a valid float") -> float:
    value = parse_score(raw)
    if value is None:
        raise PionError(error)
    return value


def _lonlat(lon_raw: bytes, lat_raw: bytes) -> tuple[float, float]:
    """``extractLongLatOrReply``."""
    lon, lat = _double(lon_raw), _double(lat_raw)
    if not (LON_MIN <= lon <= LON_MAX and LAT_MIN <= lat <= LAT_MAX):
        raise PionError(f"invalid longitude,latitude pair {lon:f},{lat:f}")
    return lon, lat


def _unit(raw: bytes) -> float:
    """``extractUnitOrReply`` (C's strcasecmp: the text ends at a NUL byte)."""
    to_meters = _UNITS.get(raw.split(b"\0", 1)[0].lower())
    if to_meters is None:
        raise PionError("unsupported unit provided. please use M, KM, FT, MI")
    return to_meters


def _radius(raw: bytes, unit: bytes) -> tuple[float, float]:
    """``extractDistanceOrReply``: (radius, meters per unit)."""
    radius = _double(raw, "need numeric radius")
    if radius < 0:
        raise PionError("radius cannot be negative")
    return radius, _unit(unit)


def _geoadd(ctx: Context, args: Sequence[bytes]) -> Reply:
    """GEOADD is ZADD of geohash scores: its options are ZADD's NX, XX and CH."""
    key = args[0]
    opts: set[str] = set()
    i = 1
    while i < len(args) and (word := keyword(args[i])) in ("NX", "XX", "CH"):
        opts.add(word)
        i += 1
    rest = args[i:]
    if len(rest) % 3 or ("NX" in opts and "XX" in opts):
        raise PionError(_SYNTAX)
    pairs: list[tuple[float, bytes]] = []
    for j in range(0, len(rest), 3):
        lon, lat = _lonlat(rest[j], rest[j + 1])
        pairs.append((float(encode(lon, lat)), rest[j + 2]))
    if not pairs:  # only options: ZADD's own "no elements" check
        raise PionError(_SYNTAX)
    flags = ZAddFlags(nx="NX" in opts, xx="XX" in opts, ch="CH" in opts)
    res = zadd(ctx.state.keyspace, key, pairs, flags)
    if res.added or res.updated:
        notify(ctx.state, ZSET, "zadd", key)
    return res.added + res.updated if flags.ch else res.added


def _geopos(ctx: Context, args: Sequence[bytes]) -> Reply:
    z = ctx.state.keyspace.zset(args[0])
    out: list[Reply] = []
    for member in args[1:]:
        score = None if z is None else z.scores.get(member)
        if score is None:
            out.append(NullArray())
        else:
            lon, lat = decode(score)
            out.append([human_double(ctx, lon), human_double(ctx, lat)])
    return out


def _geodist(ctx: Context, args: Sequence[bytes]) -> Reply:
    to_meters = 1.0
    if len(args) == 4:
        to_meters = _unit(args[3])
    elif len(args) > 4:
        raise PionError(_SYNTAX)
    z = ctx.state.keyspace.zset(args[0])
    if z is None:
        return None
    one, two = z.scores.get(args[1]), z.scores.get(args[2])
    if one is None or two is None:
        return None
    (lon1, lat1), (lon2, lat2) = decode(one), decode(two)
    return _distance_text(distance(lon1, lat1, lon2, lat2) / to_meters)


def _geohash(ctx: Context, args: Sequence[bytes]) -> Reply:
    z = ctx.state.keyspace.zset(args[0])
    out: list[Reply] = []
    for member in args[1:]:
        score = None if z is None else z.scores.get(member)
        out.append(None if score is None else geohash_text(score))
    return out


@dataclass
class _Query:
    """A search's options as ``georadiusGeneric`` collects them."""

    lon: float = 0.0
    lat: float = 0.0
    to_meters: float = 1.0
    radius: float = 0.0
    width: float = 0.0
    height: float = 0.0
    box: bool = False
    withdist: bool = False
    withhash: bool = False
    withcoord: bool = False
    sort: str = ""
    any: bool = False
    count: int = 0
    store: bytes | None = None
    storedist: bool = False
    from_member: bool = False
    from_lonlat: bool = False
    by_radius: bool = False
    by_box: bool = False


def _center_of(z: SortedSet, member: bytes) -> tuple[float, float]:
    score = z.scores.get(member)
    if score is None:
        raise PionError("could not decode requested zset member")
    return decode(score)


def _options(q: _Query, z: SortedSet | None, opts: Sequence[bytes], kind: str) -> None:
    """The optional arguments, in ``georadiusGeneric``'s order and with its checks.
    ``kind``: ``radius`` (GEORADIUS*), ``radius_ro`` (their _RO forms), ``search``
    or ``searchstore``."""
    search_cmd = kind in ("search", "searchstore")
    may_store = kind == "radius"
    i, n = 0, len(opts)
    while i < n:
        word = keyword(opts[i])
        left = n - i - 1
        if word in ("WITHDIST", "WITHHASH", "WITHCOORD"):
            setattr(q, word.lower(), True)
        elif word == "ANY":
            q.any = True
        elif word in ("ASC", "DESC"):
            q.sort = word
        elif word == "COUNT" and left >= 1:
            count = parse_int(opts[i + 1])
            if count <= 0:
                raise PionError("COUNT must be > 0")
            q.count = count
            i += 1
        elif word in ("STORE", "STOREDIST") and left >= 1 and may_store:
            q.store, q.storedist = opts[i + 1], word == "STOREDIST"
            i += 1
        elif word == "STOREDIST" and kind == "searchstore":
            q.storedist = True
        elif word == "FROMMEMBER" and left >= 1 and search_cmd and not q.from_lonlat:
            if z is not None:
                q.lon, q.lat = _center_of(z, opts[i + 1])
            q.from_member = True
            i += 1
        elif word == "FROMLONLAT" and left >= 2 and search_cmd and not q.from_member:
            q.lon, q.lat = _lonlat(opts[i + 1], opts[i + 2])
            q.from_lonlat = True
            i += 2
        elif word == "BYRADIUS" and left >= 2 and search_cmd and not q.by_box:
            q.radius, q.to_meters = _radius(opts[i + 1], opts[i + 2])
            q.box, q.by_radius = False, True
            i += 2
        elif word == "BYBOX" and left >= 3 and search_cmd and not q.by_radius:
            q.width = _double(opts[i + 1], "need numeric width")
            q.height = _double(opts[i + 2], "need numeric height")
            if q.height < 0 or q.width < 0:
                raise PionError("height or width cannot be negative")
            q.to_meters = _unit(opts[i + 3])
            q.box, q.by_box = True, True
            i += 3
        else:
            raise PionError(_SYNTAX)
        i += 1


def _search_generic(ctx: Context, args: Sequence[bytes], kind: str, by_member: bool) -> Reply:
    """Redis 7.0's ``georadiusGeneric``: the source key is looked up (and typed) first,
    then the fixed arguments, the options, their combined checks, and the search."""
    ks = ctx.state.keyspace
    q = _Query()
    name = "GEOSEARCHSTORE" if kind == "searchstore" else "GEOSEARCH"
    if kind == "searchstore":
        q.store, src, base = args[0], args[1], 2
    else:
        src = args[0]
        base = 1 if kind == "search" else (4 if by_member else 5)
    z = ks.zset(src)
    if kind not in ("search", "searchstore"):
        if not by_member:
            q.lon, q.lat = _lonlat(args[1], args[2])
            q.radius, q.to_meters = _radius(args[3], args[4])
        elif z is not None:
            q.lon, q.lat = _center_of(z, args[1])
            q.radius, q.to_meters = _radius(args[2], args[3])
    _options(q, z, args[base:], kind)
    if q.store is not None and (q.withdist or q.withhash or q.withcoord):
        what = "GEOSEARCHSTORE" if kind == "searchstore" else "STORE option in GEORADIUS"
        raise PionError(f"{what} is not compatible with WITHDIST, WITHHASH and WITHCOORD options")
    if kind in ("search", "searchstore"):
        if not (q.from_member or q.from_lonlat):
            raise PionError(f"exactly one of FROMMEMBER or FROMLONLAT can be specified for {name}")
        if not (q.by_radius or q.by_box):
            raise PionError(f"exactly one of BYRADIUS and BYBOX can be specified for {name}")
    if q.any and not q.count:
        raise PionError("the ANY argument requires COUNT argument")
    if z is None:
        return _stored(ctx, q.store, [], kind) if q.store is not None else []
    # COUNT picks the nearest: without ASC/DESC it sorts ascending (not with ANY).
    if q.count and not q.sort and not q.any:
        q.sort = "ASC"
    shape = Shape(q.lon, q.lat, q.to_meters, q.radius, q.width, q.height, q.box)
    points = search(z, shape, q.count if q.any else 0)
    if q.count and q.count < len(points):
        if q.sort and _ties_matter(points, q.count, q.sort == "DESC"):
            # Redis's partial quicksort: equal distances land where they land there.
            partial_sort(
                points, _by_distance if q.sort == "ASC" else _by_distance_desc, 0, q.count - 1
            )
        elif q.sort:
            points.sort(key=lambda p: p.dist, reverse=q.sort == "DESC")
        points = points[: q.count]
    elif q.sort:  # a whole sort: glibc's qsort, a stable merge sort
        points.sort(key=lambda p: p.dist, reverse=q.sort == "DESC")
    for p in points:
        p.dist /= q.to_meters
    if q.store is not None:
        entries = [(p.dist if q.storedist else p.score, p.member) for p in points]
        return _stored(ctx, q.store, entries, kind)
    return [_point_reply(ctx, q, p) for p in points]


def _ties_matter(points: list[GeoPoint], count: int, desc: bool) -> bool:
    """Whether the ``count`` nearest (farthest) include, or are cut among, equal
    distances: only then can the partial quicksort's order differ from a sort's."""
    dists = sorted((p.dist for p in points), reverse=desc)[: count + 1]
    return any(a == b for a, b in pairwise(dists))


def _by_distance(a: GeoPoint, b: GeoPoint) -> int:
    return (a.dist > b.dist) - (a.dist < b.dist)


def _by_distance_desc(a: GeoPoint, b: GeoPoint) -> int:
    return (a.dist < b.dist) - (a.dist > b.dist)


def _point_reply(ctx: Context, q: _Query, p: GeoPoint) -> Reply:
    if not (q.withdist or q.withhash or q.withcoord):
        return p.member
    out: list[Reply] = [p.member]
    if q.withdist:
        out.append(_distance_text(p.dist))
    if q.withhash:
        out.append(int(p.score))
    if q.withcoord:
        out.append([human_double(ctx, p.lon), human_double(ctx, p.lat)])
    return out


def _stored(ctx: Context, key: bytes, entries: list[tuple[float, bytes]], kind: str) -> Reply:
    """STORE/STOREDIST and GEOSEARCHSTORE: ``key`` becomes a sorted set of the results
    (whatever it held), or is deleted when there are none."""
    ks = ctx.state.keyspace
    if entries:
        ks.zset_replace(key, entries)
        event = "geosearchstore" if kind == "searchstore" else "georadiusstore"
        notify(ctx.state, ZSET, event, key)
    elif ks.delete((key,)):
        notify(ctx.state, GENERIC, "del", key)
    return len(entries)


def _georadius(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _search_generic(ctx, args, "radius", by_member=False)


def _georadius_ro(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _search_generic(ctx, args, "radius_ro", by_member=False)


def _georadiusbymember(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _search_generic(ctx, args, "radius", by_member=True)


def _georadiusbymember_ro(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _search_generic(ctx, args, "radius_ro", by_member=True)


def _geosearch(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _search_generic(ctx, args, "search", by_member=False)


def _geosearchstore(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _search_generic(ctx, args, "searchstore", by_member=False)


_READ = frozenset({"readonly"})
_WRITE = frozenset({"write"})

COMMANDS: list[Command] = [
    Command("GEOADD", _geoadd, -5, _WRITE, "Add members at longitude,latitude positions"),
    Command("GEOPOS", _geopos, -2, _READ, "Members' positions"),
    Command("GEODIST", _geodist, -4, _READ, "Distance between two members"),
    Command("GEOHASH", _geohash, -2, _READ, "Members' positions as geohash strings"),
    Command("GEOSEARCH", _geosearch, -7, _READ, "Members within a radius or box"),
    Command("GEOSEARCHSTORE", _geosearchstore, -8, _WRITE, "GEOSEARCH into a key"),
    Command("GEORADIUS", _georadius, -6, _WRITE, "Members within a radius of a point"),
    Command("GEORADIUS_RO", _georadius_ro, -6, _READ, "GEORADIUS without STORE"),
    Command("GEORADIUSBYMEMBER", _georadiusbymember, -5, _WRITE, "Members near a member"),
    Command("GEORADIUSBYMEMBER_RO", _georadiusbymember_ro, -5, _READ, "Near a member, no STORE"),
]
