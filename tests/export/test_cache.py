"""ExportCache over a real VStore: file contents, reuse while the rows hold, removal as
soon as they change, and the bounds (budget, file count, free space), each checked
before a byte is written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from pion.codecs import FORMAT_NAMES, get_codec
from pion.errors import PionError, SessionNotFoundError
from pion.export import cache as cache_module
from pion.export import writer
from pion.export.cache import ExportCache
from pion.export.writer import ExportRequest
from pion.vstore import VStore
from support import make_store, rows

H, D, N, L = 4, 8, 24, 3


def _cache(tmp_path: Path, **kw: int) -> ExportCache:
    kw.setdefault("max_bytes", 1 << 30)
    return ExportCache(tmp_path / "exports", kw.pop("max_bytes"), min_free=kw.pop("min_free", 0))


def _prefix(vs: VStore, ns: bytes, fmt: str = "fp16", seed: int = 0) -> dict[str, np.ndarray]:
    data: dict[str, np.ndarray] = {}
    for side, suffix in (("k", b"_pk"), ("v", b"_pv")):
        vs.create(ns + suffix, H * D, fmt)
        for i in range(L):
            x = rows(N, H * D, seed=seed + 10 * i + (side == "v"))
            vs.store(ns + suffix, i, 0, x)
            data[f"{side}.{i}"] = x
    return data


def _req(ns: bytes, start: int = 0, end: int = N, layers: int = L, heads: int = H) -> ExportRequest:
    return ExportRequest(ns + b"_pk", ns + b"_pv", start, end, layers, heads, H * D // heads)


def _files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "exports").iterdir())


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_file_holds_the_rows_heads_first(tmp_path: Path, fmt: str) -> None:
    vs = make_store()
    data = _prefix(vs, b"p", fmt)
    ex = _cache(tmp_path)
    codec = get_codec(fmt)
    for heads, start, end in ((H, 0, N), (1, 0, N), (2, 5, 17), (H, 3, N + 6)):
        req = _req(b"p", start, end, heads=heads)
        done = ex.export(vs, req)
        assert not done.reused and done.nbytes == 2 * L * (end - start) * H * D * 2
        tensors = load_file(done.path)
        assert sorted(tensors) == sorted(data)
        head_dim = H * D // heads
        for name, x in data.items():
            # What V.FETCH RANGE answers (rows past what is stored are zeros), as fp16.
            want = np.zeros((end - start, H * D), np.float32)
            held = codec.decode(codec.encode(x), H * D)[start:end]
            want[: len(held)] = held
            want16 = want.astype(np.float16).reshape(end - start, heads, head_dim)
            got = tensors[name]
            assert got.dtype == np.float16 and got.shape == (1, heads, end - start, head_dim)
            np.testing.assert_array_equal(got[0], want16.transpose(1, 0, 2))


def test_fp16_layers_keep_their_bits(tmp_path: Path) -> None:
    vs = make_store()
    vs.create(b"b_pk", 4, "fp16")
    vs.create(b"b_pv", 4, "fp16")
    # Opaque 16-bit patterns (bf16 bits, NaN payloads) stored with FMT F16.
    bits = np.array([[0x7E01, 0xFC00, 0x3F80, 0x8001]], dtype="<u2")
    for sid in (b"b_pk", b"b_pv"):
        vs.store(sid, 0, 0, bits.view("<f2"))
    path = _cache(tmp_path).export(vs, ExportRequest(b"b_pk", b"b_pv", 0, 1, 1, 1, 4)).path
    got = load_file(path)["k.0"].view("<u2").reshape(1, 4)
    np.testing.assert_array_equal(got, bits)


def test_reused_while_unchanged_then_removed_at_once(tmp_path: Path) -> None:
    vs = make_store()
    _prefix(vs, b"p")
    _prefix(vs, b"q", seed=5)
    ex = _cache(tmp_path)
    vs.change_listeners.append(ex.invalidate)
    first = ex.export(vs, _req(b"p"))
    other = ex.export(vs, _req(b"q"))
    fetches = vs.total_fetches
    again = ex.export(vs, _req(b"p"))
    assert again.reused and again.path == first.path and ex.reused == 1
    assert vs.total_fetches == fetches + 2 * L  # a reuse is still a fetch of every layer
    assert vs.sids()[-2:] == [b"p_pk", b"p_pv"]  # and touches both sessions
    # A different range or layout is a different file.
    assert ex.export(vs, _req(b"p", end=N - 1)).path != first.path
    assert ex.files == 3

    vs.store(b"p_pv", 1, 0, rows(1, H * D, seed=99))  # one row of one half
    assert not os.path.exists(first.path)  # removed at once, not at the next export
    assert ex.files == 1 and os.path.exists(other.path)
    fresh = ex.export(vs, _req(b"p"))
    assert not fresh.reused and fresh.path != first.path

    snap = vs.snapshot(b"p_pk")
    assert ex.export(vs, _req(b"p")).reused  # a snapshot changes no rows
    vs.store(b"p_pk", 0, N, rows(2, H * D))
    vs.restore(b"p_pk", snap)
    assert not os.path.exists(fresh.path)
    after_restore = ex.export(vs, _req(b"p"))
    assert not after_restore.reused

    vs.drop(b"p_pk")
    assert not os.path.exists(after_restore.path) and os.path.exists(other.path)
    with pytest.raises(SessionNotFoundError):
        ex.export(vs, _req(b"p"))
    ex.close()
    assert _files(tmp_path) == []


def test_generations_guard_even_without_the_listener(tmp_path: Path) -> None:
    vs = make_store()
    _prefix(vs, b"p")
    ex = _cache(tmp_path)  # not listening: only the generation check tells
    first = ex.export(vs, _req(b"p"))
    vs.store(b"p_pk", 0, 0, rows(1, H * D, seed=7))
    second = ex.export(vs, _req(b"p"))
    assert not second.reused and second.path != first.path
    assert not os.path.exists(first.path)


def test_a_file_removed_behind_our_back_is_written_again(tmp_path: Path) -> None:
    vs = make_store()
    _prefix(vs, b"p")
    ex = _cache(tmp_path)
    first = ex.export(vs, _req(b"p"))
    os.unlink(first.path)
    second = ex.export(vs, _req(b"p"))
    assert not second.reused and os.path.exists(second.path)
    with open(second.path, "r+b") as f:  # truncated: not the file we wrote
        f.truncate(100)
    assert not ex.export(vs, _req(b"p")).reused


def test_budget_evicts_least_recently_served(tmp_path: Path) -> None:
    vs = make_store()
    for ns in (b"a", b"b", b"c"):
        _prefix(vs, ns)
    size = 2 * L * N * H * D * 2
    # Room for two files and the header allowance the check adds, not for three.
    ex = _cache(tmp_path, max_bytes=2 * size + cache_module.HEADER_ALLOWANCE + 4096)
    a = ex.export(vs, _req(b"a"))
    b = ex.export(vs, _req(b"b"))
    assert ex.export(vs, _req(b"a")).reused  # a is now the most recent
    c = ex.export(vs, _req(b"c"))
    assert os.path.exists(a.path) and os.path.exists(c.path) and not os.path.exists(b.path)
    assert ex.files == 2 and ex.bytes <= ex.max_bytes


def test_file_count_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "MAX_FILES", 2)
    vs = make_store()
    _prefix(vs, b"a")
    ex = _cache(tmp_path)
    paths = [ex.export(vs, _req(b"a", end=N - i)).path for i in range(4)]
    assert [os.path.exists(p) for p in paths] == [False, False, True, True]
    assert len(_files(tmp_path)) == 2


def test_refusals_write_nothing(tmp_path: Path) -> None:
    vs = make_store()
    _prefix(vs, b"p")
    size = 2 * L * N * H * D * 2
    with pytest.raises(PionError, match="export-max-bytes"):
        _cache(tmp_path, max_bytes=size - 1).export(vs, _req(b"p"))
    with pytest.raises(PionError, match="must stay free"):
        _cache(tmp_path, min_free=1 << 62).export(vs, _req(b"p"))
    checks = [
        (_req(b"p", layers=L + 1), "layer 3 of the k session holds no rows"),
        (_req(b"p", start=N, end=N + 4), "holds no rows in \\[24, 28\\)"),
        (ExportRequest(b"p_pk", b"p_pv", 0, N, L, 3, 8), "has dim 32, not n_kv_heads"),
        (ExportRequest(b"p_pk", b"nope", 0, N, L, H, D), "session not found"),
    ]
    for req, why in checks:
        with pytest.raises(PionError, match=why):
            _cache(tmp_path).export(vs, req)
    assert _files(tmp_path) == []


def test_a_value_beyond_fp16_refuses_the_export(tmp_path: Path) -> None:
    vs = make_store()
    for sid in (b"big_pk", b"big_pv"):
        vs.create(sid, 32, "int8")  # int8 holds 1e6 (its scale is 1e6/127 in fp16)
        x = np.zeros((3, 32), np.float32)
        x[2, 5] = 1e6
        vs.store(sid, 0, 0, x)
    ex = _cache(tmp_path)
    with pytest.raises(PionError, match=r"k\.0 row 2 holds a value beyond fp16"):
        ex.export(vs, ExportRequest(b"big_pk", b"big_pv", 0, 3, 1, 1, 32))
    assert _files(tmp_path) == [] and ex.files == 0


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vs = make_store()
    _prefix(vs, b"p")
    ex = _cache(tmp_path)
    calls = 0
    real = os.pwrite

    def failing(fd: int, data: object, offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(writer.os, "pwrite", failing)
    with pytest.raises(PionError, match=r"writing the file failed.*No space left"):
        ex.export(vs, _req(b"p"))
    assert _files(tmp_path) == [] and ex.files == 0 and ex.bytes == 0
    monkeypatch.setattr(writer.os, "pwrite", real)
    assert os.path.exists(ex.export(vs, _req(b"p")).path)


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vs = make_store()
    data = _prefix(vs, b"p")
    real = os.pwrite
    monkeypatch.setattr(
        writer.os, "pwrite", lambda fd, buf, off: real(fd, memoryview(buf)[:7], off)
    )
    path = _cache(tmp_path).export(vs, _req(b"p", heads=1)).path
    got = load_file(path)
    np.testing.assert_array_equal(got["v.2"][0, 0], data["v.2"].astype(np.float16))
