"""Block hashes for cache-aware routing: the schemes routers use, byte by byte.

A router asks ``KV.PREFIX.MEMBERSHIP`` which blocks of an incoming prompt a namespace
holds; the registrant put those blocks there with ``KV.PREFIX.REGISTER ... BLOCKS``. The
server only compares opaque u64s, so **a router and a registrant must use the same
scheme, the same block size and the same seed**. A mismatch is not an error anywhere:
it silently gives zero hits. This module owns the hash definitions and the u64 LE blob
layout; it does not talk to a server (see ``docs/hashing.md`` for the commands).

Common rules (every scheme)
---------------------------
* Token ids are unsigned 32-bit. Each id must satisfy ``0 <= id <= 0xFFFFFFFF``; an id
  outside that range raises :class:`ValueError` (it is never masked or wrapped), and a
  non-integer input raises :class:`TypeError`. Where a scheme hashes raw token bytes
  it uses ``np.asarray(tokens, "<u4").tobytes()``: 4 bytes per token, little-endian.
* Blocks are ``tokens[i*B:(i+1)*B]`` for block size ``B >= 1``. Only **full** blocks
  are hashed: ``len(tokens) // B`` hashes come back, in token order; a trailing partial
  block is ignored, as every engine below does (Pion's ``blocks_of``, vLLM's
  ``request_block_hasher`` "We only hash full blocks", Dynamo's ``chunks_exact``,
  SGLang's page-aligned radix keys).
* The result is a ``numpy.uint64`` array. :func:`hashes_to_blob` packs it as the
  ``count*8``-byte little-endian u64 blob that ``KV.PREFIX.REGISTER ... BLOCKS`` and
  ``KV.PREFIX.MEMBERSHIP`` take; :func:`blob_to_hashes` reads one back.

Notation: ``tok_le(b)`` is the ``4*B`` bytes of block ``b`` as LE u32; ``u64le(x)`` is
``x`` as 8 little-endian bytes; ``||`` concatenates; ``D[i:j]`` slices a digest.

``pion`` (Pion's reference router; not chained)
-----------------------------------------------
``h_b = int.from_bytes(blake2b(tok_le(b), digest_size=8).digest(), "little")``.
blake2b unkeyed, no salt or person, 8-byte digest, read as a little-endian u64.
Source: ``pavelhorak/pion`` ``pion-exo/pion_exo/prefix_router.py`` ``hash_token_block``
and ``blocks_of`` (commit d4fa1c79). No seed.

``vllm-sha256-cbor`` (vLLM ``--prefix-caching-hash-algo sha256_cbor``; chained)
-------------------------------------------------------------------------------
``D_b = sha256(cbor((P_b, tuple(block b token ids), extra_keys_b)))`` with
``P_0 = NONE_HASH`` and ``P_b = D_{b-1}``; ``h_b = int.from_bytes(D_b[24:32], "big")``,
which is vLLM's KV-event integer ``int.from_bytes(D_b, "big") & (2**64 - 1)`` (the
default, ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``). The CBOR is RFC 8949 canonical as
``cbor2.dumps(..., canonical=True)`` writes it; for this input that is exactly::

    0x83                                   array of 3
    0x58 0x20 <32 bytes P_b>               byte string, length 32
    <array head, B items>                  0x80+B (B<24) | 0x98 B | 0x99 B(2 BE) | 0x9a B(4 BE)
    <B unsigned ints, shortest form>       t (t<24) | 0x18 t | 0x19 t(2 BE) | 0x1a t(4 BE)
    <extra_keys_b>                         0xf6 (null) when there are none, else an
                                           array of text strings (0x60+len | 0x78 len ...)

``extra_keys_b`` is ``None`` for plain text, else the tuple of, in this order, the LoRA
name (every block, when ``lora_name`` is given) and the cache salt (block 0 only, when
``cache_salt`` is non-empty); multimodal and prompt-embedding keys are not supported.
``NONE_HASH`` is the seed: vLLM sets it to ``sha256_cbor(os.environ["PYTHONHASHSEED"])``
(the env value as a CBOR text string: see :func:`vllm_none_hash`) and, when
PYTHONHASHSEED is unset, to ``os.urandom(32)``, which no router can reproduce. So
``seed`` is required: the engine's PYTHONHASHSEED string, or the raw 32-byte
NONE_HASH. Source: ``vllm-project/vllm`` ``vllm/v1/core/kv_cache_utils.py``
(``hash_block_tokens``, ``init_none_hash``, ``generate_block_hash_extra_keys``,
``maybe_convert_block_hash``; commit 001cabc1), ``vllm/utils/hashing.py``
``sha256_cbor`` (commit ac621345).

``dynamo`` (Dynamo KV router ``LocalBlockHash``; not chained)
------------------------------------------------------------
``h_b = xxh3_64(tok_le(b), seed=S)`` with ``S = 1337`` (``XXH3_SEED``), or with
``lora_name``: ``S = (1337 + xxh3_64(utf8(lora_name), seed=0)) mod 2**64`` (an empty
name counts as none). ``seed`` replaces 1337. This is the hash the Dynamo router
computes for a request (``compute_block_hash_for_seq``) and matches against the
``tokens_hash`` workers publish, walking its radix tree from the root.

``dynamo-seq`` (Dynamo ``SequenceHash``; chained)
-------------------------------------------------
``s_0 = h_0``; ``s_b = xxh3_64(u64le(s_{b-1}) || u64le(h_b), seed=1337)`` where ``h_b``
is the ``dynamo`` hash above. The chain step always uses 1337, as the kv-router's
``compute_seq_hash_for_block`` does. Dynamo source for both: ``ai-dynamo/dynamo``
``lib/kv-router/src/protocols.rs`` (commit 038eab23) and ``lib/llm/src/tokens.rs``
``TokenBlock::from_chunk`` (commit 21c2355a).

``sglang`` (SGLang radix / HiCache page hash; chained)
------------------------------------------------------
``D_0 = sha256(tok_le(0))``; ``D_b = sha256(D_{b-1} || tok_le(b))`` (the raw 32-byte
previous digest, not its hex); ``h_b = int.from_bytes(D_b[0:8], "big")``, the unsigned
reading of SGLang's event id ``hash_str_to_int64`` (first 16 hex digits; SGLang
publishes it as a signed int64 with the same bits). The block size is SGLang's
``page_size``. No seed. Source: ``sgl-project/sglang``
``python/sglang/srt/utils/hashing.py`` ``get_hash_str``, ``hash_str_to_int64``
(commit 4d374af2).
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import xxhash

__all__ = [
    "DYNAMO_XXH3_SEED",
    "SCHEMES",
    "Tokens",
    "blob_to_hashes",
    "block_hashes",
    "hashes_to_blob",
    "vllm_none_hash",
]

SCHEMES: Final[tuple[str, ...]] = ("pion", "vllm-sha256-cbor", "dynamo", "dynamo-seq", "sglang")
"""Every ``scheme`` :func:`block_hashes` accepts."""

DYNAMO_XXH3_SEED: Final = 1337
"""Dynamo's ``XXH3_SEED`` (``lib/kv-router/src/protocols.rs``)."""

Tokens: TypeAlias = Sequence[int] | npt.NDArray[Any]
"""Token ids: any sequence of ints, or a 1-D integer numpy array."""

_U32_MAX: Final = 0xFFFF_FFFF
_U64_MAX: Final = 0xFFFF_FFFF_FFFF_FFFF
_VLLM_DIGEST_LEN: Final = 32  # sha256; vLLM's NONE_HASH is one such digest (or 32 random bytes)


def block_hashes(
    tokens: Tokens,
    block_size: int,
    scheme: str = "pion",
    *,
    seed: str | bytes | int | None = None,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> npt.NDArray[np.uint64]:
    """One u64 per full block of ``tokens``, in token order, under ``scheme``.

    ``seed`` means, per scheme: ``pion`` and ``sglang`` take none; ``vllm-sha256-cbor``
    requires the engine's PYTHONHASHSEED as a ``str`` or its raw 32-byte NONE_HASH as
    ``bytes``; ``dynamo``/``dynamo-seq`` take an int XXH3 seed (default 1337).
    ``lora_name`` applies to ``vllm-sha256-cbor``, ``dynamo`` and ``dynamo-seq``;
    ``cache_salt`` to ``vllm-sha256-cbor`` only. The module docstring defines each
    scheme byte by byte.

    Raises :class:`ValueError` for a token id outside u32, ``block_size < 1``, an
    unknown scheme, or an option the scheme does not take; :class:`TypeError` for
    non-integer tokens or block size.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown block-hash scheme {scheme!r} (want one of {', '.join(SCHEMES)})")
    bs = _block_size(block_size)
    le = _tokens_le_u32(tokens)
    n_blocks = le.size // bs
    le = le[: n_blocks * bs]  # a trailing partial block is never hashed

    if scheme == "pion":
        _refuse(scheme, seed=seed, lora_name=lora_name, cache_salt=cache_salt)
        return _pion(le, bs, n_blocks)
    if scheme == "vllm-sha256-cbor":
        return _vllm(le, bs, n_blocks, _vllm_root(seed), lora_name=lora_name, cache_salt=cache_salt)
    if scheme in ("dynamo", "dynamo-seq"):
        _refuse(scheme, cache_salt=cache_salt)
        local = _dynamo_local(le, bs, n_blocks, _dynamo_seed(seed, lora_name))
        return local if scheme == "dynamo" else _dynamo_chain(local)
    _refuse(scheme, seed=seed, lora_name=lora_name, cache_salt=cache_salt)
    return _sglang(le, bs, n_blocks)


def hashes_to_blob(hashes: Sequence[int] | npt.NDArray[Any]) -> bytes:
    """Pack u64 hashes as the ``count*8``-byte little-endian blob of BLOCKS/MEMBERSHIP.

    Values must be integers in ``0..2**64-1``. A signed int64 (as SGLang publishes its
    event hashes) is refused rather than reinterpreted: convert it explicitly with
    ``np.asarray(h, np.int64).view(np.uint64)``.
    """
    arr = np.asarray(hashes)
    if arr.ndim != 1:
        raise ValueError(f"hashes must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return b""
    if arr.dtype.kind == "u":
        return arr.astype("<u8").tobytes()
    if arr.dtype.kind == "i":
        if int(arr.min()) < 0:
            raise ValueError(
                "hashes must be unsigned 64-bit, got a negative value "
                "(for signed int64 event hashes use .view(np.uint64))"
            )
        return arr.astype("<u8").tobytes()
    if arr.dtype.kind in "fO" and not isinstance(hashes, np.ndarray):
        return np.array(_python_ints(hashes, "hash", _U64_MAX), dtype="<u8").tobytes()
    raise TypeError(f"hashes must be integers, got dtype {arr.dtype}")


def blob_to_hashes(blob: bytes | bytearray | memoryview) -> npt.NDArray[np.uint64]:
    """Read a little-endian u64 blob (as :func:`hashes_to_blob` writes) into an array."""
    view = memoryview(blob).cast("B")
    if len(view) % 8:
        raise ValueError(f"hash blob length {len(view)} is not a multiple of 8")
    return np.frombuffer(view, dtype="<u8").astype(np.uint64)


def vllm_none_hash(pythonhashseed: str) -> bytes:
    """vLLM's NONE_HASH for a given PYTHONHASHSEED: ``sha256(cbor text string)``.

    ``init_none_hash`` computes ``sha256_cbor(os.getenv("PYTHONHASHSEED"))``; the value
    is the environment string, so ``"0"`` and ``"00"`` are different seeds.
    """
    if not isinstance(pythonhashseed, str):
        raise TypeError("pythonhashseed must be the PYTHONHASHSEED string, e.g. '0'")
    return hashlib.sha256(_cbor_text(pythonhashseed)).digest()


# ---------------------------------------------------------------- input validation


def _block_size(block_size: int) -> int:
    if isinstance(block_size, bool | np.bool_):
        raise TypeError("block_size must be an integer, got a bool")
    try:
        bs = operator.index(block_size)
    except TypeError:
        raise TypeError(f"block_size must be an integer, got {type(block_size).__name__}") from None
    if bs < 1:
        raise ValueError(f"block_size must be >= 1, got {bs}")
    return bs


def _tokens_le_u32(tokens: Tokens) -> npt.NDArray[np.uint32]:
    """Validate token ids (u32 range, integers, 1-D) and return them as ``<u4``."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype="<u4")
    kind = arr.dtype.kind
    if kind in "iu":
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > _U32_MAX:
            bad = int(np.flatnonzero((arr < 0) | (arr > _U32_MAX))[0])
            raise ValueError(_u32_message(int(arr[bad]), bad))
        return arr.astype("<u4")
    if kind == "b":
        raise TypeError("token ids must be integers, got bool")
    if kind in "fO" and not isinstance(tokens, np.ndarray):
        # numpy turns a list holding ints beyond int64/uint64 into a float64 or object
        # array; look at the original values so that the error names the real problem.
        return np.array(_python_ints(tokens, "token id", _U32_MAX), dtype="<u4")
    raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")


def _python_ints(values: Sequence[Any], what: str, top: int) -> list[int]:
    """Check each value is an int in ``0..top``; only reached for unusual inputs."""
    out: list[int] = []
    for i, item in enumerate(values):
        if isinstance(item, bool | np.bool_) or not isinstance(item, int | np.integer):
            raise TypeError(
                f"each {what} must be an integer, got {type(item).__name__} at index {i}"
            )
        v = int(item)
        if not 0 <= v <= top:
            if top == _U32_MAX:
                raise ValueError(_u32_message(v, i))
            raise ValueError(f"{what} {v} at index {i} does not fit u64 (0..{top})")
        out.append(v)
    return out


def _u32_message(value: int, index: int) -> str:
    return f"token id {value} at index {index} does not fit u32 (0..{_U32_MAX})"


def _refuse(scheme: str, **options: object) -> None:
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"scheme {scheme!r} takes no {name}")


# ---------------------------------------------------------------- pion


def _pion(le: npt.NDArray[np.uint32], bs: int, n: int) -> npt.NDArray[np.uint64]:
    raw = memoryview(le.tobytes())
    step = 4 * bs
    digests = b"".join(
        hashlib.blake2b(raw[i * step : (i + 1) * step], digest_size=8).digest() for i in range(n)
    )
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


# ---------------------------------------------------------------- vLLM sha256_cbor


def _vllm_root(seed: object) -> bytes:
    if seed is None:
        raise ValueError(
            "scheme 'vllm-sha256-cbor' needs seed: vLLM's NONE_HASH is random unless the "
            "engine runs with PYTHONHASHSEED set; pass that value as a str (seed='0') or "
            "the 32-byte NONE_HASH as bytes"
        )
    if isinstance(seed, str):
        return vllm_none_hash(seed)
    if isinstance(seed, bytes | bytearray | memoryview):
        root = bytes(seed)
        if len(root) != _VLLM_DIGEST_LEN:
            raise ValueError(f"a bytes seed is vLLM's 32-byte NONE_HASH, got {len(root)} bytes")
        return root
    raise TypeError(
        f"scheme 'vllm-sha256-cbor' takes a str (PYTHONHASHSEED) or 32-byte seed, "
        f"got {type(seed).__name__}"
    )


def _vllm(
    le: npt.NDArray[np.uint32],
    bs: int,
    n: int,
    root: bytes,
    *,
    lora_name: str | None,
    cache_salt: str | None,
) -> npt.NDArray[np.uint64]:
    if lora_name is not None and not isinstance(lora_name, str):
        raise TypeError("lora_name must be a str")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise TypeError("cache_salt must be a str")
    ints, offsets = _cbor_uints(le)
    array_head = _cbor_head(4, bs)
    lora_keys = [lora_name] if lora_name is not None else []
    # generate_block_hash_extra_keys: LoRA name, then the salt on block 0 when non-empty;
    # no keys at all is CBOR null, not an empty array.
    first_keys = lora_keys + ([cache_salt] if cache_salt else [])
    first_extra = _cbor_text_array(first_keys) if first_keys else b"\xf6"
    later_extra = _cbor_text_array(lora_keys) if lora_keys else b"\xf6"
    parent = root
    tails: list[bytes] = []
    for b in range(n):
        body = ints[offsets[b * bs] : offsets[(b + 1) * bs]].tobytes()
        encoded = b"".join(
            (
                b"\x83",
                _cbor_head(2, len(parent)),
                parent,
                array_head,
                body,
                first_extra if b == 0 else later_extra,
            )
        )
        parent = hashlib.sha256(encoded).digest()
        # maybe_convert_block_hash: int.from_bytes(digest, "big") & (2**64 - 1).
        tails.append(parent[-8:])
    return np.frombuffer(b"".join(tails), dtype=">u8").astype(np.uint64)


def _cbor_head(major: int, value: int) -> bytes:
    """RFC 8949 initial byte plus the shortest argument for ``value``."""
    top = major << 5
    if value < 24:
        return bytes((top | value,))
    if value < 0x100:
        return bytes((top | 24, value))
    if value < 0x1_0000:
        return bytes((top | 25,)) + value.to_bytes(2, "big")
    if value < 0x1_0000_0000:
        return bytes((top | 26,)) + value.to_bytes(4, "big")
    return bytes((top | 27,)) + value.to_bytes(8, "big")


def _cbor_text(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _cbor_head(3, len(raw)) + raw


def _cbor_text_array(items: list[str]) -> bytes:
    return _cbor_head(4, len(items)) + b"".join(_cbor_text(s) for s in items)


def _cbor_uints(
    values: npt.NDArray[np.uint32],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Canonical CBOR of each u32, concatenated, and the byte offset of each value.

    Every value is laid out as five bytes ``[head, b3, b2, b1, b0]`` (big-endian
    argument) and a mask keeps the head plus the 0, 1, 2 or 4 argument bytes its size
    class needs; numpy's row-major boolean indexing keeps them in order.
    """
    v = values.astype(np.uint32)
    rows = np.empty((v.size, 5), dtype=np.uint8)
    rows[:, 1:] = v.astype(">u4").view(np.uint8).reshape(v.size, 4)
    one = (v >= 24) & (v < 0x100)
    two = (v >= 0x100) & (v < 0x1_0000)
    four = v >= 0x1_0000
    rows[:, 0] = np.where(v < 24, v, np.where(one, 0x18, np.where(two, 0x19, 0x1A)))
    keep = np.zeros((v.size, 5), dtype=bool)
    keep[:, 0] = True
    keep[one, 4] = True
    keep[two, 3:] = True
    keep[four, 1:] = True
    offsets = np.zeros(v.size + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return rows[keep], offsets


# ---------------------------------------------------------------- Dynamo


def _dynamo_seed(seed: object, lora_name: str | None) -> int:
    if seed is None:
        base = DYNAMO_XXH3_SEED
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"a Dynamo seed is an int (XXH3 seed), got {type(seed).__name__}")
    elif not 0 <= seed <= _U64_MAX:
        raise ValueError(f"a Dynamo seed is an int in 0..{_U64_MAX}, got {seed}")
    else:
        base = seed
    if lora_name is not None and not isinstance(lora_name, str):
        raise TypeError("lora_name must be a str")
    if lora_name:  # Dynamo treats an empty name as no LoRA
        base = (base + xxhash.xxh3_64_intdigest(lora_name.encode("utf-8"), seed=0)) & _U64_MAX
    return base


def _dynamo_local(le: npt.NDArray[np.uint32], bs: int, n: int, seed: int) -> npt.NDArray[np.uint64]:
    raw = memoryview(le.tobytes())
    step = 4 * bs
    out = [xxhash.xxh3_64_intdigest(raw[i * step : (i + 1) * step], seed=seed) for i in range(n)]
    return np.array(out, dtype=np.uint64)


def _dynamo_chain(local: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    seq: list[int] = []
    for h in local.tolist():
        if not seq:
            seq.append(h)
            continue
        pair = seq[-1].to_bytes(8, "little") + h.to_bytes(8, "little")
        seq.append(xxhash.xxh3_64_intdigest(pair, seed=DYNAMO_XXH3_SEED))
    return np.array(seq, dtype=np.uint64)


# ---------------------------------------------------------------- SGLang


def _sglang(le: npt.NDArray[np.uint32], bs: int, n: int) -> npt.NDArray[np.uint64]:
    raw = memoryview(le.tobytes())
    step = 4 * bs
    prior = b""
    heads: list[bytes] = []
    for i in range(n):
        prior = hashlib.sha256(prior + raw[i * step : (i + 1) * step]).digest()
        heads.append(prior[:8])  # hash_str_to_int64 reads the first 16 hex digits
    return np.frombuffer(b"".join(heads), dtype=">u8").astype(np.uint64)
