"""V-store commands: ``V.CREATE`` and ``V.STOREBATCH`` here, ``V.FETCH`` and ``V.INFO`` in
``vstore_fetch.py`` (docs/protocol.md, "V-store"; ``V.SNAPSHOT``/``V.RESTORE``/
``V.COMMIT`` are in ``rollback.py``). The choices below hold for both modules.

Handlers parse and bound every argument with the ``Args`` cursor before touching the
store, then call :class:`pion.vstore.VStore`. Sizes are declared, never inferred: a
blob is checked against ``count * dim * 4`` (or ``* 2`` with ``FMT F16``) before it is
looked at, and option scans stop at the command's own last argument.

Error texts follow Pion where clients or people match them (``blob size``,
``session not found``, ``invalid value_dim``, the ``V.CREATE SCHEMA: ...`` family).
Fetch replies are memoryviews of numpy arrays: the encoder writes them out as they are.

Large payloads (:data:`OFFLOAD_MIN_BYTES` and up) convert off the event loop
(``pion.commands.deferred``): a ``V.STOREBATCH`` is checked here, quantized on a worker
thread, then checked again and stored on the loop (the hint is used only if the layer
still has the codec it was quantized for; a failed quantization is redone here, so its
error is exactly the synchronous one). A fetch that decodes is checked, counted and
leased on the loop, and streamed: decoded piece by piece while the previous piece is
sent (``vstore_fetch.py``).

Where Pion is silent or lax, we choose (and the tests pin):
- ``V.CREATE`` without ``VQUANT`` stores ``int8``, as Pion does; an unknown format, an
  unknown option or a malformed spec is an error, never a silent default.
- ``V.FETCH ... BATCH`` answers ``L`` elements (``num_layers`` when given, else the
  session's layer count), ``$-1`` for a layer absent or empty; the error
  ``session has no stored layers`` when the session holds no rows at all.
- The legacy id list answers ``$-1`` when no id names a held row.
- ``RANGE``/``BATCH`` replies pad rows never written (past a layer's ``tpl``, or in a
  hole) with zeros, as Pion does, but a reply may carry at most as many bytes of such
  zeros as of held rows (or 1 MiB, whichever is larger; ``pion.vstore.store``): a
  range far past the stored rows is an error naming both sizes, never a huge reply of
  zeros. Writes past a layer's end are accepted, as Pion accepts them; the hole costs
  nothing (``pion.vstore.layer``).
- ``bf16_rope_fp8_body`` exists only per layer (``fmt=bf16_rope_fp8_body,dim=D,rope=R``,
  ``1 <= R < D``); ``VQUANT bf16_rope_fp8_body`` is refused naming SCHEMA, and
  ``rope=`` with any other format is refused (Pion ignores it there).
- Every V.FETCH adds the payload bytes it delivers (RANGE, id list, BATCH, NATIVE) to
  the value receipt's ``kvprefix_bytes_served``, as Pion's receipt defines it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from pion.codecs import ALL_FORMAT_NAMES, FORMAT_NAMES, SCHEMA_ONLY_FORMATS, Codec
from pion.commands.args import Args, parse_int
from pion.commands.deferred import Deferred, Offload, Split
from pion.commands.state import Command, Context
from pion.commands.workers import redirect_session
from pion.errors import PionError
from pion.resp.decoder import SCRATCH_BYTES
from pion.resp.reply import Reply, Simple
from pion.vstore import ENCODE_CHUNK_BYTES, Encoded, FloatRows, encode_rows

__all__ = [
    "COMMANDS",
    "DEFAULT_FORMAT",
    "ENCODE_TEMPORARIES",
    "OFFLOAD_MIN_BYTES",
    "PART_BYTES",
    "format_name",
    "from_tier",
    "store_in_flight_bound",
]

# Pion's V.CREATE default when VQUANT is absent (VFMT_INT8): same request, same format.
DEFAULT_FORMAT = "int8"
_WANT = "|".join(FORMAT_NAMES)
_WANT_SPEC = "|".join(ALL_FORMAT_NAMES)
# One layer spec's text (``fmt=...,dim=...,rope=...`` is under 60 bytes): a bound on
# what a spec may make the parser split and show back.
MAX_SPEC_LEN = 256
# Payloads (a store's blob, a fetch's reply) from this size convert on a worker thread
# (module docstring). Handing work to a thread and back costs ~0.1 ms; converting
# 1 MiB costs 1-7 ms depending on the format, so from here the overlap pays.
OFFLOAD_MIN_BYTES = 1 << 20
# Input bytes per part of a large store's quantization (``_encode_work``): row blocks
# the offload pool runs on several threads at once. A hand-off costs ~0.05 ms, a 2 MiB
# block ~0.3-1 ms of compiled encode, so blocks this size keep every core busy on one
# 16 MiB layer at a few percent of overhead.
PART_BYTES = 2 << 20
# What the numpy references (no compiled twin) allocate quantizing one slice of a store
# (ENCODE_CHUNK_BYTES of input) beyond its output, as a multiple of the slice: at most
# 4.6x for any format (fp8; turbo ~3.3x, int8 ~3.4x), measured with tracemalloc by
# tests/commands/test_vstore_memory.py. The compiled twins allocate nothing.
ENCODE_TEMPORARIES = 5


def store_in_flight_bound(blob_bytes: int, stored_bytes: int, *, compiled: bool = True) -> int:
    """The memory one client's pipelined ``V.STOREBATCH`` commands of ``blob_bytes``
    each (``stored_bytes`` once encoded) can make the server hold beyond what the store
    keeps, whatever the pipeline's depth: the command being encoded and the next one,
    received ahead (two blobs: two layers in flight); the partial command after those
    and the receive buffer (``pion.server.connection``); one command's stored rows
    once more. The rows are encoded in place into the array the layer then keeps as a
    new run's buffer; the extra copy is only for rows that extend a run already there
    (copied into it). With the numpy references (``compiled`` False): also the
    encoded rows' copy into the layer and one slice's encode temporaries.
    docs/protocol.md states it; bench/vstore_throughput.py measures peak RSS
    against it."""
    bound = 2 * blob_bytes + stored_bytes + 2 * SCRATCH_BYTES
    if not compiled:
        bound += stored_bytes + ENCODE_TEMPORARIES * ENCODE_CHUNK_BYTES
    return bound


def _show(raw: bytes) -> str:
    """An argument quoted in an error message: bounded, printable."""
    return raw[:64].decode("utf-8", "replace")


def format_name(raw: bytes, names: tuple[str, ...] = FORMAT_NAMES) -> str | None:
    """The format among ``names`` named by ``raw``, or None: lenient about ASCII case,
    strict about the set, as Pion's V.CREATE and KV.PREFIX.REGISTER both are (one
    function for both, so they cannot drift apart). Only ASCII is folded, so no
    Unicode look-alike maps to a format."""
    name = raw.lower().decode("ascii", "replace")
    return name if name in names else None


def from_tier(ctx: Context, sid: bytes, *, required: bool, may_wait: bool = True) -> None:
    """With ``--tier``: a session this worker does not hold is filled from the tier
    first. ``required``: the command cannot answer without it (see pion.tier);
    ``may_wait`` False: the fill is read here even on a live connection."""
    if ctx.state.tier is not None:
        wait = may_wait and ctx.may_wait
        ctx.state.tier.ensure_local((sid,), required=required, may_wait=wait)


# -- V.CREATE ------------------------------------------------------------------------


def v_create(ctx: Context, argv: Sequence[bytes]) -> Reply:
    """``V.CREATE sid dim [VQUANT fmt]`` | ``V.CREATE sid [default_dim] SCHEMA N spec...``"""
    max_dim = ctx.state.config.vstore.max_dim
    a = Args(argv, "V.CREATE")
    sid = a.arg("session_id")
    if a.peek_keyword() == "SCHEMA":
        a.arg()
        return _create_schema(ctx, a, sid, 0)
    dim = a.integer("value_dim")
    if a.peek_keyword() == "SCHEMA":
        a.arg()
        if not 0 <= dim <= max_dim:
            raise PionError(f"V.CREATE SCHEMA: default_dim must be 0-{max_dim}")
        return _create_schema(ctx, a, sid, dim)
    if not 1 <= dim <= max_dim:
        raise PionError(f"invalid value_dim (must be 1-{max_dim})")
    fmt = DEFAULT_FORMAT
    while not a.done():
        option = a.arg()
        if option.upper() != b"VQUANT":
            raise PionError(f"V.CREATE: unknown option '{_show(option)}' (expected VQUANT <fmt>)")
        if a.done():
            raise PionError(f"V.CREATE: VQUANT requires a format (want {_WANT})")
        raw = a.arg()
        named = format_name(raw)
        if named is None:
            if format_name(raw, SCHEMA_ONLY_FORMATS) is not None:
                raise PionError(
                    f"V.CREATE: {_show(raw).lower()} requires the SCHEMA form with a "
                    "per-layer rope=N (V.CREATE sid 0 SCHEMA N "
                    "fmt=bf16_rope_fp8_body,dim=D,rope=R ...)"
                )
            raise PionError(f"V.CREATE: unknown VQUANT format '{_show(raw)}' (want {_WANT})")
        fmt = named
    from_tier(ctx, sid, required=False)
    return ctx.state.vstore.create(sid, dim, fmt)


def _create_schema(ctx: Context, a: Args, sid: bytes, default_dim: int) -> Reply:
    limits = ctx.state.config.vstore
    if a.done():
        raise PionError("V.CREATE SCHEMA requires N (layer count)")
    n = a.integer("N")
    top = limits.max_schema_layers
    if n > top:
        # "exceeds" is Pion's word for it; operators' tools look for it.
        raise PionError(
            f"V.CREATE SCHEMA: N {n} exceeds {top} (N must be 1-{top}; "
            "split larger models into several sessions)"
        )
    if n < 1:
        raise PionError(f"V.CREATE SCHEMA: N must be 1-{top}")
    if len(a) != n:
        raise PionError(f"V.CREATE SCHEMA: expected {n} layer specs, got {len(a)}")
    specs = [
        _parse_spec(index, raw, default_dim, limits.max_dim) for index, raw in enumerate(a.rest())
    ]
    schema = [(fmt, dim) for fmt, dim, _ in specs]
    ropes = [rope for _, _, rope in specs]
    from_tier(ctx, sid, required=False)
    return ctx.state.vstore.create_schema(sid, default_dim, schema, ropes)


def _spec_int(value: bytes) -> int:
    try:
        return parse_int(value)
    except PionError:
        return -1


def _parse_spec(index: int, raw: bytes, default_dim: int, max_dim: int) -> tuple[str, int, int]:
    """``fmt=<fmt>,dim=<d>[,rope=<r>]`` -> (fmt, dim, rope). Keys are case-insensitive
    and may be absent: ``fmt`` defaults to int8 as in Pion, ``dim`` to ``default_dim``,
    ``rope`` to 0 (required, ``1 <= rope < dim``, for ``bf16_rope_fp8_body`` only)."""
    where = f"V.CREATE SCHEMA: layer {index}"
    if len(raw) > MAX_SPEC_LEN:
        raise PionError(f"{where} spec longer than {MAX_SPEC_LEN} bytes")
    fmt, dim, rope = DEFAULT_FORMAT, default_dim, 0
    rope_given = False
    for segment in raw.split(b","):
        key, eq, value = segment.partition(b"=")
        key = key.lower()
        if eq and key == b"fmt":
            named = format_name(value, ALL_FORMAT_NAMES)
            if named is None:
                raise PionError(f"{where} unknown fmt '{_show(value)}' (want {_WANT_SPEC})")
            fmt = named
        elif eq and key == b"dim":
            dim = _spec_int(value)
            if not 1 <= dim <= max_dim:
                raise PionError(f"{where} dim must be 1-{max_dim}")
        elif eq and key == b"rope":
            rope, rope_given = _spec_int(value), True
            if not 1 <= rope < max_dim:
                raise PionError(f"{where} rope must be 1-{max_dim - 1}")
        elif eq and key == b"s":
            # Pion reserves a third per-layer tensor under `s=`; its text is matched.
            raise PionError(
                f"{where} S-tensor reserved: the s= key is not supported "
                "(spec is fmt=<fmt>,dim=<d>[,rope=<r>])"
            )
        else:
            raise PionError(
                f"{where} unknown key '{_show(key)}' (spec is fmt=<fmt>,dim=<d>[,rope=<r>])"
            )
    if dim == 0:
        raise PionError(f"{where} missing dim and no default supplied")
    if fmt in SCHEMA_ONLY_FORMATS:
        if not rope_given:
            raise PionError(f"{where} {fmt} needs rope=N (0 < N < dim)")
        if rope >= dim:
            raise PionError(f"{where} {fmt} needs rope=N (0 < N < dim): rope {rope} >= dim {dim}")
    elif rope_given:
        raise PionError(f"{where} rope= applies only to fmt={'|'.join(SCHEMA_ONLY_FORMATS)}")
    return fmt, dim, rope


# -- V.STOREBATCH --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreRequest:
    """A V.STOREBATCH's arguments, parsed once: used on the loop and off it."""

    sid: bytes
    layer: int
    start: int
    count: int
    blob: bytes
    f16: bool


def v_storebatch(ctx: Context, argv: Sequence[bytes]) -> Reply | Deferred:
    """``V.STOREBATCH sid layer start count blob [FMT F16]`` -> ``+OK``"""
    req = _parse_storebatch(argv)
    rows, codec = _storebatch_rows(ctx, req)
    verbatim = rows.dtype == np.dtype("<f2") and codec.name == "fp16"
    if rows.nbytes >= OFFLOAD_MIN_BYTES and not verbatim:
        return Offload(
            work=_encode_work(codec, rows, req.layer, req.start),
            finish=partial(_storebatch_finish, ctx, req, codec),
        )
    ctx.state.vstore.store(req.sid, req.layer, req.start, rows)
    return Simple("OK")


def _encode_work(codec: Codec, rows: FloatRows, layer: int, start: int) -> Split[Encoded]:
    """Quantizing a store off the loop: into one array of the stored rows (which the
    layer then keeps as its buffer, ``VStore.store``), in row blocks of
    :data:`PART_BYTES` of input that the pool runs on several threads at once. The
    numpy references (no compiled twin) run as one part: their temporaries grow with
    the number of parts at once."""
    count, dim = int(rows.shape[0]), int(rows.shape[1])
    out = np.empty((count, codec.row_bytes(dim)), np.uint8)
    step = max(1, PART_BYTES // (rows.itemsize * dim)) if codec.compiled else count
    parts = [
        partial(encode_rows, codec, rows[lo : lo + step], layer, start + lo, out[lo : lo + step])
        for lo in range(0, count, step)
    ]
    return Split(parts, partial(_tagged, codec, out))


def _tagged(codec: Codec, out: npt.NDArray[np.uint8]) -> Encoded:
    return codec, out


def _storebatch_finish(
    ctx: Context, req: StoreRequest, codec: Codec, encoded: Encoded | BaseException
) -> Reply:
    """On the loop, after the rows were quantized off it: check the state again (other
    clients ran meanwhile) and store. The rows quantized off the loop are used if the
    layer's codec is still theirs; so is an error found there (a non-finite value),
    returned as found. Under another codec the store is worked out anew."""
    rows, now = _storebatch_rows(ctx, req, may_wait=False)  # an offload's finish never waits
    if isinstance(encoded, PionError) and now is codec:
        raise encoded
    hint = None if isinstance(encoded, BaseException) else encoded
    ctx.state.vstore.store(req.sid, req.layer, req.start, rows, encoded=hint)
    return Simple("OK")


def _parse_storebatch(argv: Sequence[bytes]) -> StoreRequest:
    """The arguments alone (no state read)."""
    a = Args(argv, "V.STOREBATCH")
    sid = a.arg("session_id")
    layer = a.integer("layer_id")
    start = a.integer("start_id")
    count = a.integer("count")
    blob = a.arg("values_blob")
    f16 = False
    if not a.done():
        if len(a) != 2 or a.peek_keyword() != "FMT":
            raise PionError("V.STOREBATCH: unknown option (expected FMT F16)")
        a.arg()
        width = a.arg().upper()
        if width not in (b"F16", b"F32"):
            raise PionError("V.STOREBATCH: unknown option (expected FMT F16)")
        f16 = width == b"F16"
    return StoreRequest(sid, layer, start, count, blob, f16)


def _storebatch_rows(
    ctx: Context, req: StoreRequest, *, may_wait: bool = True
) -> tuple[npt.NDArray[np.float32] | npt.NDArray[np.float16], Codec]:
    """``req`` checked against the state now: its rows and the layer's codec."""
    sid, start, count = req.sid, req.start, req.count
    max_rows = ctx.state.config.vstore.max_rows
    redirect_session(ctx, sid, "V.STOREBATCH")
    from_tier(ctx, sid, required=True, may_wait=may_wait)
    dim, codec = ctx.state.vstore.layer_layout(sid, req.layer)  # not found / out of range
    if start < 0 or count < 1:
        raise PionError("V.STOREBATCH: invalid start/count (start >= 0, count >= 1)")
    if start + count > max_rows:
        raise PionError(f"V.STOREBATCH: rows out of range (start+count must be <= {max_rows})")
    elem = 2 if req.f16 else 4
    expected = count * dim * elem
    if len(req.blob) != expected:
        raise PionError(
            f"V.STOREBATCH: blob size {len(req.blob)} != expected {expected} "
            f"(count={count} x dim={dim} x {elem} bytes)"
        )
    rows = np.frombuffer(req.blob, dtype="<f2" if req.f16 else "<f4").reshape(count, dim)
    return rows, codec


COMMANDS: list[Command] = [
    Command(
        "V.CREATE",
        v_create,
        -3,
        frozenset({"write"}),
        "Create a V-store session (uniform, or per-layer SCHEMA); replies its slot",
    ),
    Command(
        "V.STOREBATCH",
        v_storebatch,
        -6,
        frozenset({"write"}),
        "Store count rows of one layer from an fp32 (or FMT F16) blob",
    ),
]
