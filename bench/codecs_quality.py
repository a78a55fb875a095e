"""Storage-format quality and speed: rel. MSE and encode/decode time for every codec.

Quality (seeded): rel. MSE = sum((x - y)**2) / sum(x**2) on N(0, 1) rows at dim 1024,
and on the same rows with 8 of 1024 channels x50, both over the whole row and over the
1016 ordinary channels only (what outliers cost their neighbours).

Speed: best of ``--repeat`` runs of encode and of decode on one fp32 ``[rows, 1024]``
array (default 4096 rows, one layer of the V-store benchmark), with a plain copy of the
same fp32 array as the same-run baseline (README.md, "Benchmarks"), so ``x copy`` reads as
"this codec costs N memory copies".

    python bench/codecs_quality.py [--rows 4096] [--repeat 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from pion.codecs import FORMAT_NAMES, get_codec

OUTLIER_CHANNELS = (3, 100, 257, 511, 640, 777, 900, 1000)


def rel_mse(x: np.ndarray, y: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(((x64 - y) ** 2).sum() / (x64**2).sum())


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm caches and lazy allocations
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="512 rows, 3 repeats")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    rows, repeat = (512, 3) if args.quick else (args.rows, args.repeat)

    rng = np.random.default_rng(20250419)
    gauss = rng.standard_normal((512, 1024)).astype(np.float32)
    outl = gauss.copy()
    outl[:, list(OUTLIER_CHANNELS)] *= 50
    ordinary = np.ones(1024, bool)
    ordinary[list(OUTLIER_CHANNELS)] = False
    big = rng.standard_normal((rows, 1024)).astype(np.float32)
    copy_ms = best_ms(big.copy, repeat)

    results: dict[str, dict[str, float]] = {}
    print(f"[{rows}, 1024] fp32; baseline copy {copy_ms:.2f} ms")
    head = "fmt       B/elem  relMSE N(0,1)  outlier total  outlier rest   enc ms  dec ms  x copy"
    print(head)
    for name in FORMAT_NAMES:
        codec = get_codec(name)
        y_outl = codec.decode(codec.encode(outl), 1024)
        data = codec.encode(big)
        r = {
            "bytes_per_elem": codec.row_bytes(1024) / 1024,
            "rel_mse_gaussian": rel_mse(gauss, codec.decode(codec.encode(gauss), 1024)),
            "rel_mse_outlier_total": rel_mse(outl, y_outl),
            "rel_mse_outlier_rest": rel_mse(outl[:, ordinary], y_outl[:, ordinary]),
            "encode_ms": best_ms(partial(codec.encode, big), repeat),
            "decode_ms": best_ms(partial(codec.decode, data, 1024), repeat),
        }
        results[name] = r
        print(
            f"{name:8s}  {r['bytes_per_elem']:6.3f}  {r['rel_mse_gaussian']:13.3e}"
            f"  {r['rel_mse_outlier_total']:13.3e}  {r['rel_mse_outlier_rest']:12.3e}"
            f"  {r['encode_ms']:7.1f} {r['decode_ms']:7.1f}"
            f"  {(r['encode_ms'] + r['decode_ms']) / copy_ms:6.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "copy_ms": copy_ms, "formats": results}, f, indent=2)


if __name__ == "__main__":
    main()
