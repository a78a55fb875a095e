"""The operations on the tier, one round trip (or one pipeline) each, synchronous.

Writes (the writer thread) and reads (the worker's loop, for read-through fills) both
come through a :class:`Remote` over their own :class:`~pion.tier.client.TierClient`.
The key layout is ``keys.py``'s, the meta hash ``meta.py``'s.

Ordering, and why readers can trust what they see:

- a store writes its row chunks first (``SETRANGE``, spread over the cluster), then
  raises the layer's high-water mark and sets the blocks' bits in one Lua script on
  the meta's slot, which first checks that the session still has the generation the
  chunks were written under. A reader that sees a high-water mark therefore finds the
  chunks below it, unless the cluster evicted one (``maxmemory-policy``): the bitmap
  says which blocks must exist, so a missing one is detected, never read as zeros;
- a drop removes the meta, bitmap and block table atomically (Lua), leaves a
  tombstone naming the dropped generation (so other nodes can tell "dropped" from
  "evicted by the cluster"), then deletes the chunks. Chunk names carry the
  generation, so a chunk that outlives a drop is never read as a newer session's.
"""

from __future__ import annotations

import contextlib
import secrets
import struct
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from pion.config import VStoreLimits
from pion.tier.client import TierClient, TierIOError, TierRejected
from pion.tier.health import Kind
from pion.tier.keys import BLOCKS_PER_LAYER, CHUNK_ROWS, FORMAT_VERSION, KeyLayout, chunks_of
from pion.tier.meta import Layout, TierFormatError, TierMeta, parse_meta
from pion.tier.ops import StoreOp
from pion.tier.rowread import Landed, Want, read_into

__all__ = [
    "MAX_HASH_COUNT",
    "TOMBSTONE_TTL_S",
    "Remote",
    "RemoteBlocks",
    "decode_blocks",
    "new_generation",
]

Client = redis.Redis | RedisCluster

# How long a tombstone says "dropped" after a DROP: other nodes validate their local
# copies against it on LOOKUP. A node that stays away longer may push its copy back.
TOMBSTONE_TTL_S = 86_400
# KV.PREFIX.REGISTER's bound on a block table (docs/protocol.md): what the tier may hold too.
MAX_HASH_COUNT = 1_048_576
_MAX_BLOCK_SIZE = 8192
_BLOCKS_HEADER = struct.Struct("<I")
# Nodes read at once besides the calling thread's (a fill reads every node holding its
# chunks; a larger cluster queues the rest on these).
_READ_THREADS = 8

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HMGET', KEYS[1], 'gen', 'dim', 'fmt', 'schema', 'ver')
end
redis.call('HSET', KEYS[1], 'ver', ARGV[1], 'gen', ARGV[2], 'sid', ARGV[3],
           'dim', ARGV[4], 'fmt', ARGV[5], 'schema', ARGV[6])
redis.call('DEL', KEYS[2])
return {ARGV[2], ARGV[4], ARGV[5], ARGV[6], ARGV[1]}
"""

_STORE = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return 0 end
local field = 't:' .. ARGV[2]
local held = tonumber(redis.call('HGET', KEYS[1], field) or '0')
if tonumber(ARGV[3]) > held then redis.call('HSET', KEYS[1], field, ARGV[3]) end
for bit = tonumber(ARGV[4]), tonumber(ARGV[5]) do redis.call('SETBIT', KEYS[2], bit, 1) end
return 1
"""

_BLOCKS = """
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""

_DROP = """
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then return false end
if ARGV[1] ~= '' and gen ~= ARGV[1] then return false end
local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
-- pcall: under maxmemory with noeviction a SET is refused, and a drop must still
-- free what it can; other nodes then see "gone" without "dropped" (LOOKUP keeps
-- their copies until they are evicted or dropped there).
redis.pcall('SET', KEYS[4], gen, 'EX', ARGV[2])
return fields
"""


# Cut layers back (V.RESTORE): lower each high-water mark to the recorded length (a
# layer not named goes to 0) and unmark the blocks wholly past it; returns the cuts as
# layer, old rows, new rows. The caller then clears the row keys.
_TRUNCATE = f"""
if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[1] then return false end
local keep = {{}}
for i = 2, #ARGV, 2 do keep[ARGV[i]] = tonumber(ARGV[i + 1]) end
local cuts = {{}}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 2) == 't:' then
    local layer = string.sub(name, 3)
    local held = tonumber(fields[i + 1])
    local new = keep[layer] or 0
    if new < held then
      if new == 0 then
        redis.call('HDEL', KEYS[1], name)
      else
        redis.call('HSET', KEYS[1], name, new)
      end
      for b = math.ceil(new / {CHUNK_ROWS}), math.floor((held - 1) / {CHUNK_ROWS}) do
        redis.call('SETBIT', KEYS[2], tonumber(layer) * {BLOCKS_PER_LAYER} + b, 0)
      end
      table.insert(cuts, layer)
      table.insert(cuts, held)
      table.insert(cuts, new)
    end
  end
end
return cuts
"""


def new_generation() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class RemoteBlocks:
    block_size: int
    hashes: bytes  # count * 8 bytes of little-endian u64


def decode_blocks(raw: bytes) -> RemoteBlocks:
    """``[u32 block_size LE][u64 LE ...]``, checked against REGISTER's bounds."""
    if len(raw) < _BLOCKS_HEADER.size or (len(raw) - _BLOCKS_HEADER.size) % 8:
        raise TierFormatError(f"block table of {len(raw)} bytes is not 4 + 8n")
    (block_size,) = _BLOCKS_HEADER.unpack_from(raw)
    count = (len(raw) - _BLOCKS_HEADER.size) // 8
    if not 1 <= block_size <= _MAX_BLOCK_SIZE or count > MAX_HASH_COUNT:
        raise TierFormatError(f"block table out of range (block size {block_size}, {count})")
    return RemoteBlocks(block_size, raw[_BLOCKS_HEADER.size :])


class Remote:
    def __init__(self, client: TierClient, keys: KeyLayout, limits: VStoreLimits) -> None:
        self.client = client
        self.keys = keys
        self.limits = limits
        # Threads reading the nodes other than the caller's (read_into), made on first use.
        self._threads: ThreadPoolExecutor | None = None

    # -- writes ----------------------------------------------------------------------

    def create(self, sid: bytes, layout: Layout) -> tuple[str, Layout | None]:
        """Create the session unless the tier holds it; ``(generation, its layout)``.
        The layout is None when what the tier holds is not a format-1 layout."""
        k = self.keys
        fields = layout.fields()
        args: list[bytes | str | int] = [FORMAT_VERSION, new_generation(), sid]
        args += [fields["dim"], fields["fmt"], fields["schema"]]

        def run(r: Client) -> list[bytes | None]:
            script = r.register_script(_CREATE)
            reply: list[bytes | None] = script(keys=[k.meta(sid), k.tombstone(sid)], args=args)
            return reply

        gen, dim, fmt, schema, ver = self.client.call("write", run)
        raw = {b"ver": ver, b"gen": gen, b"sid": sid, b"dim": dim, b"fmt": fmt}
        raw[b"schema"] = schema
        try:
            meta = parse_meta(sid, {n: v for n, v in raw.items() if v is not None}, self.limits)
        except TierFormatError:
            return (gen or b"").decode("ascii", "replace"), None
        return meta.gen, meta.layout

    def store(self, gen: str, op: StoreOp) -> bool:
        """Write the rows of ``op`` (stored-format bytes) into generation ``gen``, then
        the meta. False when the session's generation changed (dropped or re-created
        meanwhile): the chunks just written are deleted again."""
        try:
            return self.store_many([(gen, op)])[0]
        except TierRejected:
            # Some chunks may have been written (a pipeline is not atomic) and no meta
            # will ever point at them: delete them rather than leave them to eviction.
            with contextlib.suppress(TierIOError, TierRejected):
                self._delete(self._chunk_names(gen, op))
            raise

    def _chunk_names(self, gen: str, op: StoreOp) -> list[str]:
        k = self.keys
        return [k.chunk(op.sid, gen, op.layer, c.block) for c in chunks_of(op.start, op.count)]

    def store_many(self, items: Sequence[tuple[str, StoreOp]]) -> list[bool]:
        """:meth:`store` of several ``(generation, op)`` in two round trips: every row
        chunk in one pipeline (all nodes at once), then every meta commit in one. On
        TierRejected nothing is cleaned up (the caller redoes them one by one)."""
        k = self.keys

        def write_chunks(r: Client) -> None:
            pipe = r.pipeline(transaction=False)
            for gen, op in items:
                row_bytes = len(op.data) // op.count
                view = memoryview(op.data)
                for c in chunks_of(op.start, op.count):
                    offset = (c.start - c.block * CHUNK_ROWS) * row_bytes
                    rows = view[c.lo * row_bytes : c.hi * row_bytes]
                    pipe.setrange(k.chunk(op.sid, gen, op.layer, c.block), offset, rows)
            pipe.execute()

        self.client.call("write", write_chunks)

        def commit(r: Client) -> list[int]:
            pipe = r.pipeline(transaction=False)
            for gen, op in items:
                pieces = chunks_of(op.start, op.count)
                args: list[bytes | str | int] = [gen, op.layer, op.start + op.count]
                args += [k.bit(op.layer, pieces[0].block), k.bit(op.layer, pieces[-1].block)]
                keys = [k.meta(op.sid), k.written(op.sid)]
                pipe.execute_command("EVAL", _STORE, 2, *keys, *args)
            return [int(x) for x in pipe.execute()]

        done = self.client.call("write", commit)
        stale = [
            name
            for ok, (gen, op) in zip(done, items, strict=True)
            if not ok
            for name in self._chunk_names(gen, op)
        ]
        if stale:
            self._delete(stale)
        return [bool(ok) for ok in done]

    def set_blocks(self, sid: bytes, gen: str, block_size: int, hashes: bytes) -> bool:
        k = self.keys
        value = _BLOCKS_HEADER.pack(block_size) + hashes

        def run(r: Client) -> int:
            script = r.register_script(_BLOCKS)
            return int(script(keys=[k.meta(sid), k.blocks(sid)], args=[gen, value]))

        return bool(self.client.call("write", run))

    def truncate(
        self, sid: bytes, gen: str, layout: Layout, lengths: tuple[tuple[int, int], ...]
    ) -> bool:
        """Cut the session back to ``lengths`` (see :data:`_TRUNCATE`); the rows cut
        are zeroed (a block partly kept) or deleted (blocks wholly past the cut), so a
        later write past the cut never finds rows of the rejected branch. False when
        the generation changed."""
        k = self.keys
        args: list[bytes | str | int] = [gen]
        for layer, rows in lengths:
            args += [layer, rows]

        def run(r: Client) -> list[bytes | int] | None:
            script = r.register_script(_TRUNCATE)
            reply: list[bytes | int] | None = script(keys=[k.meta(sid), k.written(sid)], args=args)
            return reply

        cuts = self.client.call("write", run)
        if cuts is None:
            return False

        def clear(r: Client) -> None:
            pipe = r.pipeline(transaction=False)
            for i in range(0, len(cuts), 3):
                layer, held, new = int(cuts[i]), int(cuts[i + 1]), int(cuts[i + 2])
                row_bytes = layout.row_bytes(layer)
                first_gone = -(-new // CHUNK_ROWS)
                if new % CHUNK_ROWS:  # the block keeping rows below the cut
                    block = new // CHUNK_ROWS
                    end = min(held, (block + 1) * CHUNK_ROWS)
                    offset = (new - block * CHUNK_ROWS) * row_bytes
                    zeros = bytes((end - new) * row_bytes)
                    pipe.setrange(k.chunk(sid, gen, layer, block), offset, zeros)
                for block in range(first_gone, (held - 1) // CHUNK_ROWS + 1):
                    pipe.delete(k.chunk(sid, gen, layer, block))
            pipe.execute()

        if cuts:
            self.client.call("write", clear)
        return True

    def drop(self, sid: bytes, gen: str | None) -> str | None:
        """Drop the session (only generation ``gen`` when given); the generation
        dropped, or None when there was nothing to drop."""
        k = self.keys
        keys = [k.meta(sid), k.written(sid), k.blocks(sid), k.tombstone(sid)]

        def run(r: Client) -> list[bytes] | None:
            script = r.register_script(_DROP)
            reply: list[bytes] | None = script(keys=keys, args=[gen or "", TOMBSTONE_TTL_S])
            return reply

        fields = self.client.call("write", run)
        if not fields:
            return None
        meta = dict(zip(fields[::2], fields[1::2], strict=False))
        dropped = meta.get(b"gen", b"").decode("ascii", "replace")
        # The chunks below each high-water mark; a corrupt field only leaves orphans
        # (never read: their generation is gone) for the cluster's eviction.
        names = []
        for name, value in meta.items():
            if name.startswith(b"t:") and name[2:].isdigit() and value.isdigit():
                layer, tpl = int(name[2:]), min(int(value), self.limits.max_rows)
                names += [k.chunk(sid, dropped, layer, b) for b in range(-(-tpl // CHUNK_ROWS))]
        self._delete(names)
        return dropped

    def _delete(self, names: Iterable[str]) -> None:
        batch = list(names)
        if not batch:
            return

        def run(r: Client) -> None:
            pipe = r.pipeline(transaction=False)
            for name in batch:
                pipe.delete(name)
            pipe.execute()

        self.client.call("write", run)

    # -- reads -----------------------------------------------------------------------

    def load(self, sid: bytes) -> TierMeta | None:
        """The session's meta (for the writer), or None when the tier does not hold
        it."""
        return self.read_metas([sid], "write")[sid]

    def read_metas(
        self, sids: Sequence[bytes], kind: Kind = "read"
    ) -> dict[bytes, TierMeta | None]:
        k = self.keys

        def run(r: Client) -> list[dict[bytes, bytes]]:
            pipe = r.pipeline(transaction=False)
            for sid in sids:
                pipe.hgetall(k.meta(sid))
            out: list[dict[bytes, bytes]] = pipe.execute()
            return out

        replies = self.client.call(kind, run)
        return {
            sid: parse_meta(sid, fields, self.limits) if fields else None
            for sid, fields in zip(sids, replies, strict=True)
        }

    def tombstone(self, sid: bytes) -> str | None:
        def run(r: Client) -> bytes | None:
            raw = r.get(self.keys.tombstone(sid))
            return raw if isinstance(raw, bytes) or raw is None else raw.encode()

        raw = self.client.call("write", run)
        return None if raw is None else raw.decode("ascii", "replace")

    def probe(self, sids: Sequence[bytes]) -> dict[bytes, tuple[str | None, str | None]]:
        """``(generation, tombstone)`` of each session, either None when absent."""
        k = self.keys

        def run(r: Client) -> list[bytes | None]:
            pipe = r.pipeline(transaction=False)
            for sid in sids:
                pipe.hget(k.meta(sid), "gen")
                pipe.get(k.tombstone(sid))
            out: list[bytes | None] = pipe.execute()
            return out

        replies = self.client.call("read", run)
        out: dict[bytes, tuple[str | None, str | None]] = {}
        for i, sid in enumerate(sids):
            gen, tomb = replies[2 * i], replies[2 * i + 1]
            out[sid] = (
                None if gen is None else gen.decode("ascii", "replace"),
                None if tomb is None else tomb.decode("ascii", "replace"),
            )
        return out

    def read_extras(self, metas: Sequence[TierMeta]) -> list[tuple[bytes, bytes | None]]:
        """Each session's written-blocks bitmap (b"" when none) and raw block table."""
        k = self.keys

        def run(r: Client) -> list[bytes | None]:
            pipe = r.pipeline(transaction=False)
            for meta in metas:
                pipe.get(k.written(meta.sid))
                pipe.get(k.blocks(meta.sid))
            out: list[bytes | None] = pipe.execute()
            return out

        replies = self.client.call("read", run)
        return [(replies[2 * i] or b"", replies[2 * i + 1]) for i in range(len(metas))]

    def sizes(self, names: Sequence[str]) -> list[int]:
        """Each key's value length (``STRLEN``; 0 for a key the tier does not hold,
        as a written row chunk is never empty), one pipeline over every node."""

        def run(r: Client) -> list[int]:
            pipe = r.pipeline(transaction=False)
            for name in names:
                pipe.strlen(name)
            return [int(n) for n in pipe.execute()]

        return self.client.call("read", run)

    def read_into(self, wants: Sequence[Want], landed: Landed | None = None) -> list[int]:
        """Row chunks received into their rows, every node at once
        (:func:`~pion.tier.rowread.read_into`): each value's length, or ABSENT."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(_READ_THREADS, thread_name_prefix="pion-tier-read")
        threads = self._threads
        return self.client.call("read", lambda r: read_into(r, wants, threads, landed))

    def close(self) -> None:
        """Close the connection and the reading threads."""
        self.client.close()
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=True)
