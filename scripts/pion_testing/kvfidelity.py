"""Store a real prefix through the transformers bridge in one process, restore it in
another, and measure what the restore changed and what it saved.

The two halves:

* the storing side (:func:`store_variant`, called by the tests and the benchmark in
  their own process) writes a prefix under a namespace per *variant*: one storage
  format for K and V, or one for K and another for V (the two halves of a namespace are
  separate V-store sessions; creating them first with ``V.CREATE ... VQUANT`` fixes
  their formats, since KV.PREFIX.REGISTER keeps a half that exists);
* the restoring side (:func:`run_job`, run as ``python -m pion_testing.kvfidelity JOB
  OUT`` through :func:`run_worker`) loads the model on its own, computes the namespaces
  again (so a hit also proves they are stable across processes), and for each variant
  measures against a fresh prefill of the whole prompt in that process:

  - ``k_rel_err`` / ``v_rel_err``: per layer, ``||restored - fresh|| / ||fresh||``
    (Frobenius, over the prefix rows);
  - ``logit_cosine``: the next-token logits after the suffix, restored vs fresh;
  - ``tokens``, ``agreement``, ``first_divergence``: greedy decoding (argmax, EOS not
    special) for ``new_tokens`` steps against the fresh run's tokens;

  and, with ``ttft`` in the job, the time to first token from cold (a prefill of the
  whole prompt) and after a restore (``load_prefix`` + a forward over the suffix),
  interleaved rep by rep so both see the same machine load, with the restore split
  into LOOKUP, fetch (server, wire and client decode) and building the cache.

Test and benchmark scaffolding: not part of the installed package.
"""

from __future__ import annotations

import copy
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FORMATS",
    "ROPE",
    "Variant",
    "k_only",
    "mixed",
    "namespace",
    "row_bytes",
    "run_job",
    "run_worker",
    "store_variant",
    "uniform",
    "v_only",
]

# Every storage format, from most to least faithful (the order of the tables), then the
# SCHEMA-only one: per layer, with a ``rope=`` parameter (ROPE below).
FORMATS = ("fp16", "int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2", "bf16_rope_fp8_body")
# bf16_rope_fp8_body keeps a row's first ``rope`` values in bf16. It is made for keys
# with a decoupled rotary slice (MLA); SmolLM2 rotates every dim of every head, so
# there is no such slice: rope=64 keeps the first of the three K/V heads in bf16.
ROPE = 64
# The other half of a K-only or V-only variant: stored bit-near-exact, so the variant's
# error is the tested half's alone.
EXACT = "fp16"
_PATHS = (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2] / "src")


@dataclass(frozen=True)
class Variant:
    """A namespace's storage: ``k_fmt`` for the keys, ``v_fmt`` for the values."""

    label: str
    k_fmt: str
    v_fmt: str
    new_tokens: int = 64

    @property
    def tag(self) -> str:
        """The storage part of the namespace."""
        k, v = _spec(self.k_fmt), _spec(self.v_fmt)
        return k if k == v else f"k={k},v={v}"


def _spec(fmt: str) -> str:
    """A format as a SCHEMA spec names it (with its parameter, if it has one)."""
    from pion.codecs.registry import SCHEMA_ONLY_FORMATS

    return f"{fmt},rope={ROPE}" if fmt in SCHEMA_ONLY_FORMATS else fmt


def row_bytes(fmt: str, kv_dim: int) -> int:
    """Stored bytes of one row of ``kv_dim`` values in ``fmt``."""
    from pion.codecs.registry import SCHEMA_ONLY_FORMATS, get_codec

    return get_codec(fmt, ROPE if fmt in SCHEMA_ONLY_FORMATS else 0).row_bytes(kv_dim)


def uniform(fmt: str, new_tokens: int = 64) -> Variant:
    return Variant(fmt, fmt, fmt, new_tokens)


def k_only(fmt: str, new_tokens: int = 64) -> Variant:
    """``fmt`` for K, V exact: the cost of ``fmt`` on keys alone."""
    return Variant(f"K {fmt}", fmt, EXACT, new_tokens)


def v_only(fmt: str, new_tokens: int = 64) -> Variant:
    """``fmt`` for V, K exact: the cost of ``fmt`` on values alone."""
    return Variant(f"V {fmt}", EXACT, fmt, new_tokens)


def mixed(k_fmt: str, v_fmt: str, new_tokens: int = 64) -> Variant:
    """``k_fmt`` for K and ``v_fmt`` for V: a recommended pairing, measured whole."""
    return Variant(f"K {k_fmt} + V {v_fmt}", k_fmt, v_fmt, new_tokens)


def namespace(model: Any, prefix_ids: Any, variant: Variant) -> str:
    from pion.integrations.transformers import prefix_namespace
    from pion_testing.smollm2 import MODEL_ID

    return prefix_namespace(model, prefix_ids, variant.tag, model_id=MODEL_ID)


def store_variant(
    pc: Any,
    raw: Any,
    model: Any,
    prefix_ids: Any,
    variant: Variant,
    *,
    arrays: tuple[list[Any], list[Any], float] | None = None,
) -> tuple[list[Any], list[Any], float]:
    """Store ``prefix_ids`` under ``variant``'s namespace and return ``(keys, values,
    prefill_ms)``. Without ``arrays`` it is ``store_prefix`` (a prefill, timed); with
    them (from an earlier call) the same register + store of those arrays, no prefill.
    ``raw`` is a redis-py client on the same server, for the halves' ``V.CREATE``."""
    from pion.client.wire import session_ids
    from pion.codecs.registry import SCHEMA_ONLY_FORMATS
    from pion.integrations.transformers import cache_to_arrays, kv_layout, store_prefix

    ns = namespace(model, prefix_ids, variant)
    pc.drop(ns)
    n_layers, kv_heads, head_dim = kv_layout(model)
    kv_dim = kv_heads * head_dim
    schema_only = {variant.k_fmt, variant.v_fmt} & set(SCHEMA_ONLY_FORMATS)
    if variant.k_fmt != variant.v_fmt or schema_only:
        for sid, fmt in zip(session_ids(ns), (variant.k_fmt, variant.v_fmt), strict=True):
            if fmt in SCHEMA_ONLY_FORMATS:  # per layer only: every layer the same spec
                spec = f"fmt={fmt},dim={kv_dim},rope={ROPE}"
                raw.execute_command("V.CREATE", sid, 0, "SCHEMA", n_layers, *[spec] * n_layers)
            else:
                raw.execute_command("V.CREATE", sid, kv_dim, "VQUANT", fmt)
    # REGISTER keeps halves that exist; its own format only shapes halves it creates.
    vquant = "fp8" if variant.k_fmt in SCHEMA_ONLY_FORMATS else variant.k_fmt
    if arrays is None:
        t0 = time.perf_counter()
        cache = store_prefix(pc, ns, model, prefix_ids, vquant)
        # The whole call, prefill (most of it), conversion and store: what a reuse of
        # these arrays registers as PREFILL_MS (only the server's receipt reads it).
        took_ms = (time.perf_counter() - t0) * 1000
        keys, values = cache_to_arrays(cache, n_layers)
        return keys, values, took_ms
    keys, values, prefill_ms = arrays
    pc.register(ns, kv_dim, vquant, prefill_ms=prefill_ms)
    pc.store(ns, keys, values)
    return keys, values, prefill_ms


# ----------------------------------------------------------------- restoring side


def _rel_errors(got: list[Any], want: list[Any]) -> list[float]:
    out = []
    for g, w in zip(got, want, strict=True):
        w64 = w.astype(np.float64)
        out.append(float(np.linalg.norm(g.astype(np.float64) - w64) / np.linalg.norm(w64)))
    return out


def _greedy(model: Any, cache: Any, logits: Any, steps: int) -> tuple[list[int], list[Any]]:
    """``steps`` greedy tokens (the argmax of ``logits``, then one forward per token)
    and the logits each was picked from."""
    import torch

    from pion.integrations.transformers import cache_kwargs

    tokens, seen = [int(logits.argmax())], [logits]
    with torch.no_grad():
        while len(tokens) < steps:
            step = torch.tensor([[tokens[-1]]])
            out = model(step, use_cache=True, **cache_kwargs(model, cache))
            seen.append(out.logits[0, -1])
            tokens.append(int(seen[-1].argmax()))
    return tokens, seen


def _teacher_forced(model: Any, cache: Any, logits: Any, ref: dict[str, Any]) -> dict[str, Any]:
    """Feed the reference's greedy tokens in one forward and compare the logits at every
    position with the reference's: unlike free-running greedy decoding, one early
    disagreement does not change what every later position is compared on."""
    import torch
    import torch.nn.functional as F

    from pion.integrations.transformers import cache_kwargs

    steps = len(ref["tokens"])
    with torch.no_grad():
        feed = torch.tensor([ref["tokens"][: steps - 1]])
        out = model(feed, use_cache=True, **cache_kwargs(model, cache))
    got = torch.cat([logits[None], out.logits[0]]) if steps > 1 else logits[None]
    want = torch.stack(ref["step_logits"])
    cosine = F.cosine_similarity(got, want, dim=1)
    kl = F.kl_div(F.log_softmax(got, 1), F.log_softmax(want, 1), log_target=True, reduction="none")
    return {
        "tf_top1": float((got.argmax(1) == torch.tensor(ref["tokens"])).float().mean()),
        "tf_cosine_mean": float(cosine.mean()),
        "tf_cosine_min": float(cosine.min()),
        "tf_kl_mean": float(kl.sum(1).mean()),
        "tf_kl_max": float(kl.sum(1).max()),
    }


def _forward(model: Any, ids: Any, cache: Any) -> Any:
    """The last position's logits of ``ids`` appended to ``cache`` (extended in place)."""
    import torch

    from pion.integrations.transformers import cache_kwargs

    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1, **cache_kwargs(model, cache))
    return out.logits[0, -1]


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _fidelity(
    pc: Any, model: Any, full: Any, variant: Variant, ref: dict[str, Any]
) -> dict[str, Any]:
    import torch

    from pion.integrations.transformers import cache_to_arrays, kv_layout, load_prefix

    prefix, suffix = full[:, : ref["prefix_len"]], full[:, ref["prefix_len"] :]
    cache = load_prefix(pc, namespace(model, prefix, variant), model)
    if cache is None:
        return {"hit": False}
    keys, values = cache_to_arrays(cache, kv_layout(model)[0])
    logits = _forward(model, suffix, cache)
    cosine = torch.nn.functional.cosine_similarity(logits, ref["logits"], dim=0).item()
    forced = _teacher_forced(model, copy.deepcopy(cache), logits, ref)
    tokens, _ = _greedy(model, cache, logits, variant.new_tokens)
    want = ref["tokens"][: len(tokens)]
    same = [a == b for a, b in zip(tokens, want, strict=True)]
    return {
        "hit": True,
        "k_rel_err": _rel_errors(keys, ref["keys"]),
        "v_rel_err": _rel_errors(values, ref["values"]),
        "logit_cosine": cosine,
        "argmax_held": tokens[0] == want[0],
        "tokens": tokens,
        "agreement": sum(same) / len(same),
        "first_divergence": same.index(False) if False in same else len(same),
        **forced,
    }


class _StageClock:
    """Times a client's ``lookup`` and ``fetch`` by wrapping them on the instance, so the
    path measured is ``load_prefix`` itself."""

    def __init__(self, pc: Any) -> None:
        self.seconds = {"lookup": 0.0, "fetch": 0.0}
        for name in self.seconds:
            setattr(pc, name, self._timed(name, getattr(pc, name)))

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0

        return call

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, dict.fromkeys(self.seconds, 0.0)
        return out


def _ttft(pc: Any, model: Any, full: Any, prefix_len: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Cold vs restored time to first token; per suffix length, per format."""
    from pion.integrations.transformers import load_prefix

    clock = _StageClock(pc)
    prefix = full[:, :prefix_len]
    suffixes = {"chat": full.shape[1] - prefix_len, "one": 1}
    result: dict[str, Any] = {}
    for kind, n_suffix in suffixes.items():
        ids = full[:, : prefix_len + n_suffix]
        cold: list[float] = []
        restored: dict[str, list[dict[str, float]]] = {f: [] for f in spec["formats"]}
        for _ in range(int(spec["reps"])):
            t0 = time.perf_counter()
            first = int(_forward(model, ids, _new_cache(model)).argmax())
            cold.append(time.perf_counter() - t0)
            for fmt in spec["formats"]:
                ns = namespace(model, prefix, uniform(fmt))
                clock.take()
                t0 = time.perf_counter()
                cache = load_prefix(pc, ns, model)
                t1 = time.perf_counter()
                token = int(_forward(model, ids[:, prefix_len:], cache).argmax())
                t2 = time.perf_counter()
                stages = clock.take()
                restored[fmt].append(
                    {
                        "total": t2 - t0,
                        "lookup": stages["lookup"],
                        "fetch": stages["fetch"],
                        "build": (t1 - t0) - stages["lookup"] - stages["fetch"],
                        "suffix_forward": t2 - t1,
                        "same_first_token": float(token == first),
                    }
                )
        result[kind] = {"suffix_tokens": n_suffix, "cold_s": cold, "restored": restored}
    return result


def _profile(pc: Any, model: Any, prefix: Any, fmt: str, top: int = 12) -> list[dict[str, Any]]:
    """The functions one ``load_prefix`` spends its time in (own time, cProfile)."""
    from pion.integrations.transformers import load_prefix

    ns = namespace(model, prefix, uniform(fmt))
    profiler = cProfile.Profile()
    profiler.runcall(load_prefix, pc, ns, model)
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).name}:{line}({name})"
        rows.append({"function": where, "calls": calls, "own_s": own, "cum_s": cumulative})
    rows.sort(key=lambda r: -r["own_s"])
    return rows[:top]


def _progress(message: str) -> None:
    print(f"  [restore process] {message}", file=sys.stderr, flush=True)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """The restoring side: see the module docstring. ``job``: host, port, ids (a ``.npy``
    of the whole prompt), prefix_tokens, reference_tokens, variants, optional ttft
    ``{"reps", "formats"}`` and profile (format names)."""
    import torch

    from pion.client import PionPromptCache
    from pion.integrations.transformers import cache_to_arrays, kv_layout
    from pion_testing.smollm2 import load

    t0 = time.perf_counter()
    model = load(tokenizer=False).model
    load_s = time.perf_counter() - t0
    full = torch.from_numpy(np.load(job["ids"]).astype(np.int64))[None]
    prefix_len = int(job["prefix_tokens"])
    # The fresh reference: a prefill of the whole prompt, then greedy decoding.
    cache = _new_cache(model)
    t0 = time.perf_counter()
    logits = _forward(model, full, cache)
    reference_prefill_s = time.perf_counter() - t0
    keys, values = cache_to_arrays(cache, kv_layout(model)[0])
    tokens, step_logits = _greedy(model, cache, logits, int(job["reference_tokens"]))
    ref = {
        "prefix_len": prefix_len,
        "logits": logits,
        "keys": [k[:prefix_len] for k in keys],
        "values": [v[:prefix_len] for v in values],
        "tokens": tokens,
        "step_logits": step_logits,
    }
    del cache
    out: dict[str, Any] = {
        "load_s": load_s,
        "reference_prefill_s": reference_prefill_s,
        "torch_threads": torch.get_num_threads(),
        "reference_tokens": ref["tokens"],
        "variants": {},
    }
    with PionPromptCache(job["host"], int(job["port"])) as pc:
        for spec in job["variants"]:
            variant = Variant(**spec)
            _progress(f"restoring {variant.label}")
            out["variants"][variant.label] = {
                **asdict(variant),
                **_fidelity(pc, model, full, variant, ref),
            }
        if job.get("ttft"):
            _progress("timing first tokens")
            out["ttft"] = _ttft(pc, model, full, prefix_len, job["ttft"])
        out["profile"] = {
            fmt: _profile(pc, model, full[:, :prefix_len], fmt) for fmt in job.get("profile", ())
        }
    return out


def run_worker(
    job: dict[str, Any],
    workdir: Path,
    ids: npt.NDArray[np.int64],
    *,
    timeout: float = 3600,
    echo: bool = False,
) -> dict[str, Any]:
    """Run :func:`run_job` in a fresh Python process and return its result; ``echo``
    passes its progress lines (stderr) through, else they are kept for the error."""
    workdir.mkdir(parents=True, exist_ok=True)
    ids_path, job_path, out_path = (workdir / n for n in ("ids.npy", "job.json", "out.json"))
    np.save(ids_path, ids)
    job_path.write_text(json.dumps({**job, "ids": str(ids_path)}))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(p) for p in _PATHS), *filter(None, [env.get("PYTHONPATH")])]
    )
    cmd = [sys.executable, "-m", "pion_testing.kvfidelity", str(job_path), str(out_path)]
    log_path = workdir / "worker.log"
    with log_path.open("w") as log:  # progress lines go to the caller's stderr when echo
        stderr = None if echo else log
        proc = subprocess.run(cmd, check=False, env=env, stderr=stderr, timeout=timeout)
    if proc.returncode != 0:
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(f"restore worker exited {proc.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m pion_testing.kvfidelity JOB.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run_job(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
