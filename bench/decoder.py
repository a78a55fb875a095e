"""Request decoding: our sans-IO decoder against ``hiredis.Reader`` on the same bytes.

hiredis cannot refuse an oversized ``$<n>`` header before buffering its payload, so the
decoder is our own (``pion.resp.decoder``): a batch scanner for well-formed small
commands (compiled when a C compiler was present, else pure Python) in front of an exact
parser. This measures what that costs: (a) 100k small pipelined commands
(``KV.PREFIX.LOOKUP ns``), fed in 64 KiB reads, with the compiled scanner (when built)
and with the pure-Python one; (b) 16 commands carrying a 16 MiB blob each (a 16-layer
V.STOREBATCH), fed in 256 KiB reads. hiredis parses the same bytes as RESP replies (the
request format is the array-of-bulks subset), so the work is the same. Both sides are
driven the way the server drives them: one ``get()``/``gets()`` call per command.

Issue 13 target: small pipelined commands at >= 0.5x hiredis.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import hiredis

from _common import print_table, write_results
from pion.resp import decoder as decoder_module
from pion.resp import scan as scan_module
from pion.resp.decoder import RequestDecoder


def encode(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


def ours(wire: bytes, chunk: int) -> int:
    dec = RequestDecoder()
    n = 0
    view = memoryview(wire)
    for i in range(0, len(wire), chunk):
        dec.feed(view[i : i + chunk])
        while dec.get() is not None:
            n += 1
    return n


def pure(wire: bytes, chunk: int) -> int:
    """``ours`` with the pure-Python scanner (what runs without a C compiler)."""
    saved = decoder_module.scan, decoder_module.BulkWriter
    decoder_module.scan = scan_module.py_scan
    decoder_module.BulkWriter = scan_module.PyBulkWriter  # type: ignore[misc]
    try:
        return ours(wire, chunk)
    finally:
        decoder_module.scan, decoder_module.BulkWriter = saved  # type: ignore[misc]


def theirs(wire: bytes, chunk: int) -> int:
    reader = hiredis.Reader()
    n = 0
    view = memoryview(wire)
    for i in range(0, len(wire), chunk):
        reader.feed(view[i : i + chunk])
        while reader.gets() is not False:
            n += 1
    return n


def best(fn: Callable[[], int], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--small", type=int, default=100_000, help="small commands")
    ap.add_argument("--big-mib", type=int, default=16, help="MiB per big command")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.small, args.big_mib, args.repeat = 20_000, 4, 3
    small = encode(b"KV.PREFIX.LOOKUP", b"0123456789abcdef0123456789abcdef") * args.small
    blob = bytes(args.big_mib << 20)
    big = b"".join(
        encode(b"V.STOREBATCH", b"ns_pk", b"%d" % layer, b"0", b"4096", blob) for layer in range(16)
    )
    assert ours(small, 65536) == pure(small, 65536) == theirs(small, 65536) == args.small
    assert ours(big, 262144) == theirs(big, 262144) == 16
    rows = []
    results: dict[str, object] = {"compiled_scanner": scan_module.COMPILED}
    cases = [
        ("small commands", ours, small, 65536, args.small),
        ("small commands, pure Python", pure, small, 65536, args.small),
        ("16 MiB bulks", ours, big, 262144, 16),
    ]
    if not scan_module.COMPILED:
        cases.pop(0)  # "ours" is the pure-Python scanner then
    print(f"compiled scanner: {'yes' if scan_module.COMPILED else 'no (pure Python)'}")
    for name, fn, wire, chunk, count in cases:
        t_ours = best(lambda f=fn, w=wire, c=chunk: f(w, c), args.repeat)
        t_hiredis = best(lambda w=wire, c=chunk: theirs(w, c), args.repeat)
        results[name] = {
            "pion_cmds_per_s": count / t_ours,
            "hiredis_cmds_per_s": count / t_hiredis,
            "pion_mb_s": len(wire) / t_ours / 1e6,
            "hiredis_mb_s": len(wire) / t_hiredis / 1e6,
            "ratio": t_hiredis / t_ours,
        }
        r = results[name]
        assert isinstance(r, dict)
        rows.append(
            [
                name,
                r["pion_cmds_per_s"],
                r["hiredis_cmds_per_s"],
                r["pion_mb_s"],
                r["hiredis_mb_s"],
                f"{r['ratio']:.2f}x",
            ]
        )
    print_table(
        ["input", "pion cmd/s", "hiredis cmd/s", "pion MB/s", "hiredis MB/s", "x hiredis"], rows
    )
    write_results("decoder", results)


if __name__ == "__main__":
    main()
