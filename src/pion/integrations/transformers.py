"""Hugging Face ``transformers`` <-> Pion: store a prefix's ``DynamicCache`` in a
namespace and restore it so generation continues without a prefill.

Install with ``pip install 'pion[transformers]'`` (torch + transformers). Flow::

    pc = PionPromptCache(port=1974)
    ns = prefix_namespace(model, prefix_ids, "fp16")
    cache = load_prefix(pc, ns, model)            # None on a miss
    if cache is None:
        cache = store_prefix(pc, ns, model, prefix_ids, "fp16")   # prefill + store
    out = model.generate(full_ids, **cache_kwargs(model, cache), max_new_tokens=32)

``full_ids`` must start with the prefix and be at least one token longer (the model
needs a token to run). ``generate`` extends the cache in place: restore again (or
``copy.deepcopy``) for the next request. ``cache_kwargs`` passes the cache as
``cache=`` where the model takes it (transformers 5.2x+, which deprecates
``past_key_values=``) and as ``past_key_values=`` on older versions.

What this owns: the ``[1, H_kv, N, D]`` <-> ``[N, H_kv*D]`` layout change per layer
(grouped-query attention is just ``H_kv < H_q``), dtypes (fp16 travels as fp16, bf16
and fp32 as fp32; restores come back in the model's dtype and device), the prefill
timing sent as ``PREFILL_MS``, and a namespace over everything that changes the K/V.
Not supported: sliding-window or hybrid (recurrent) caches, whose layers do not hold
every prefix token (refused with a clear error), and batches larger than one.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from pion.client import PionPromptCache, make_namespace

__all__ = [
    "NAMESPACE_VERSION",
    "cache_kwargs",
    "cache_to_arrays",
    "kv_layout",
    "load_prefix",
    "prefix_namespace",
    "store_prefix",
]

# Bumped when what the namespace covers changes, so old entries simply miss.
NAMESPACE_VERSION = "pion.transformers/1"
# Config fields that do not change the K/V a model computes.
_VOLATILE_CONFIG = ("transformers_version", "_name_or_path", "_commit_hash")


def _text_config(model: Any) -> Any:
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if callable(getter) else config


def kv_layout(model: Any) -> tuple[int, int, int]:
    """``(n_layers, n_kv_heads, head_dim)`` of a decoder's K/V cache, from its config."""
    cfg = _text_config(model)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.num_hidden_layers), kv_heads, head_dim


def _token_bytes(input_ids: Any) -> bytes:
    ids = np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ValueError(f"input_ids must be integer [N] or [1, N], got {ids.dtype} {ids.shape}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > 0xFFFFFFFF):
        raise ValueError("token ids must fit in u32")
    return ids.astype("<u4").tobytes()


def prefix_namespace(
    model: Any, input_ids: Any, vquant: str, *, model_id: str | None = None
) -> str:
    """The namespace of a prefix: model identity, its config (layers, heads, rope...),
    dtype, storage format and the exact prefix tokens (``<u4`` bytes, hashed).

    ``model_id`` defaults to the name or path the model was loaded from; pass a
    revision-specific id when weights change under one name (fine-tunes, adapters,
    models built in memory), since the weights themselves are not hashed.
    """
    identity = model_id or getattr(model.config, "_name_or_path", "") or type(model).__name__
    config = {k: v for k, v in model.config.to_dict().items() if k not in _VOLATILE_CONFIG}
    config_hash = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    tokens_hash = hashlib.sha256(_token_bytes(input_ids))
    # Only `identity` is free text; every other part is fixed-format and free of "|",
    # so Pion's "|"-join stays unambiguous even if the identity contains one.
    return make_namespace(
        NAMESPACE_VERSION,
        identity,
        config_hash.hexdigest(),
        str(model.dtype).removeprefix("torch."),
        vquant,
        tokens_hash.hexdigest(),
    )


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{"cache": cache}`` for models whose forward takes ``cache`` (transformers
    5.2x+), else ``{"past_key_values": cache}``; for ``forward`` and ``generate``."""
    params = inspect.signature(model.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


def _last_logits_only(model: Any) -> dict[str, Any]:
    """The keyword that makes the forward compute logits for the last position only
    (``logits_to_keep``; ``num_logits_to_keep`` before transformers 4.50): a prefill
    that only fills the cache need not multiply every position by the vocabulary."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def _new_cache(model: Any) -> Any:
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers before 4.56 takes no config
        return DynamicCache()


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56: one CacheLayer per layer
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def _rows(t: torch.Tensor) -> npt.NDArray[Any]:
    """``[1, H, N, D]`` -> ``[N, H*D]`` numpy; fp16 kept, anything else as fp32
    (numpy has no bf16, and bf16 -> fp32 is exact)."""
    _, h, n, d = t.shape
    rows = t[0].detach().transpose(0, 1).reshape(n, h * d)
    rows = rows if rows.dtype == torch.float16 else rows.float()
    return np.ascontiguousarray(rows.cpu().numpy())


def cache_to_arrays(
    cache: Any, n_layers: int
) -> tuple[list[npt.NDArray[Any]], list[npt.NDArray[Any]]]:
    """Per-layer ``[N, H*D]`` keys and values of a batch-1 cache."""
    keys, values = [], []
    for layer in range(n_layers):
        k, v = _layer_kv(cache, layer)
        if k.shape[0] != 1:
            raise ValueError(f"only batch size 1 is supported, got {k.shape[0]}")
        keys.append(_rows(k))
        values.append(_rows(v))
    return keys, values


def _synchronize(model: Any) -> None:
    # CUDA runs asynchronously: without this the clock stops before the prefill does.
    device = getattr(model, "device", None)
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def store_prefix(
    pc: PionPromptCache, ns: str, model: Any, input_ids: Any, vquant: str | None = None
) -> Any:
    """Run the prefill of ``input_ids`` (``[1, N]`` or ``[N]``), register ``ns`` with
    the measured time as ``PREFILL_MS``, store every layer's K/V, and return the
    ``DynamicCache`` (the caller continues generation from it)."""
    ids = torch.as_tensor(input_ids, device=model.device)
    ids = ids[None] if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids must be [N] or [1, N], got {list(ids.shape)}")
    n_layers, kv_heads, head_dim = kv_layout(model)
    cache = _new_cache(model)
    _synchronize(model)
    start = time.perf_counter()
    with torch.no_grad():
        model(ids, use_cache=True, **_last_logits_only(model), **cache_kwargs(model, cache))
    _synchronize(model)
    prefill_ms = (time.perf_counter() - start) * 1000
    keys, values = cache_to_arrays(cache, n_layers)
    n = ids.shape[1]
    for rows in (*keys, *values):
        if rows.shape != (n, kv_heads * head_dim):
            raise ValueError(
                f"cache layer holds {list(rows.shape)}, want [{n}, {kv_heads * head_dim}]: "
                "sliding-window and hybrid caches are not supported"
            )
    pc.register(ns, kv_heads * head_dim, vquant, prefill_ms=prefill_ms)
    pc.store(ns, keys, values)
    return cache


def load_prefix(pc: PionPromptCache, ns: str, model: Any) -> Any | None:
    """The ``DynamicCache`` stored under ``ns`` in the model's dtype and device, or
    None on a miss (the LOOKUP is recorded in the server's receipt)."""
    if not pc.lookup(ns):
        return None
    keys, values = pc.fetch(ns)
    if not keys:  # registered, but the store never landed: as good as a miss
        return None
    n_layers, kv_heads, head_dim = kv_layout(model)
    if len(keys) != n_layers or any(k.shape[1] != kv_heads * head_dim for k in keys):
        got = [k.shape[1] for k in keys]
        raise ValueError(
            f"namespace {ns} holds {len(keys)} layers of dims {got}, but the model has "
            f"{n_layers} layers of {kv_heads}x{head_dim}: a namespace of another model"
        )
    cache = _new_cache(model)
    for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.update(
            _heads(k, kv_heads, head_dim, model), _heads(v, kv_heads, head_dim, model), layer
        )
    return cache


def _heads(rows: npt.NDArray[np.float32], heads: int, head_dim: int, model: Any) -> torch.Tensor:
    """``[N, H*D]`` -> ``[1, H, N, D]`` in the model's dtype and device."""
    n = rows.shape[0]
    split = np.ascontiguousarray(rows.reshape(n, heads, head_dim).transpose(1, 0, 2))
    return torch.from_numpy(split)[None].to(device=model.device, dtype=model.dtype)
