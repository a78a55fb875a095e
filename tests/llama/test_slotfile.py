"""Reading a slot file's cache layout: synthetic files byte by byte, hostile bytes, and
the files real llama-servers write (f16, f32 keys, three streams, a recurrent model)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pion_testing.launcher import LlamaServerProcess

from pion.llama.client import LlamaClient
from pion.llama.slotfile import (
    SEQ_MAGIC,
    SEQ_VERSION,
    SlotLayout,
    file_sha256,
    read_layout,
    read_tokens,
)

from .conftest import StartServer


def synthetic(
    *,
    cells: int = 3,
    n_stream: int = 1,
    stream: int = 0,
    layers: int = 2,
    k_type: int = 1,
    k_row: int = 64,
    v_type: int = 1,
    v_row: int = 64,
    v_trans: bool = False,
    ext: bool = False,
) -> bytes:
    """A slot file as b11434 writes one for a plain K/V cache."""
    out = struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, 2) + struct.pack("<ii", 7, 8)
    out += struct.pack("<I", n_stream)
    for s in range(n_stream):
        if s != stream:
            out += struct.pack("<I", 0)
            continue
        out += struct.pack("<I", cells)
        for i in range(cells):
            out += struct.pack("<iI", i, 1) + (b"\0" * 12 if ext else b"") + struct.pack("<i", 0)
        out += struct.pack("<IIII", int(v_trans), layers, 0, 0)
        for _ in range(layers):
            out += struct.pack("<iQ", k_type, k_row) + b"k" * (cells * k_row)
        for _ in range(layers):
            if v_trans:
                elem, n_embd = 2, v_row // 2
                out += struct.pack("<iII", v_type, elem, n_embd) + b"v" * (n_embd * cells * elem)
            else:
                out += struct.pack("<iQ", v_type, v_row) + b"v" * (cells * v_row)
    return out


def layout_of(tmp_path: Path, data: bytes) -> SlotLayout | None:
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    return read_layout(path)


def test_plain_cache_layouts(tmp_path: Path) -> None:
    got = layout_of(tmp_path, synthetic())
    assert got == SlotLayout(1, 2, False, 0, 0, ("f16", "f16"), ("f16", "f16"), (64, 64), (64, 64))
    assert got.cache_types() == "K f16 / V f16"
    q8 = layout_of(tmp_path, synthetic(k_type=8, k_row=34, n_stream=3, stream=1))
    assert q8 is not None and q8.n_stream == 3 and q8.cache_types() == "K q8_0 / V f16"
    trans = layout_of(tmp_path, synthetic(v_trans=True, v_type=0, v_row=128))
    assert trans is not None and trans.v_trans and trans.v_types == ("f32", "f32")
    ext = layout_of(tmp_path, synthetic(ext=True))
    assert ext is not None and ext.n_layer == 2
    assert SlotLayout.from_json(got.to_json()) == got


def test_anything_else_is_unknown_not_guessed(tmp_path: Path) -> None:
    good = synthetic()
    assert layout_of(tmp_path, good + b"\0") is None  # trailing bytes: another layout
    assert layout_of(tmp_path, synthetic(cells=0)) is None  # no cells, no types
    assert layout_of(tmp_path, b"ggsq" + good[4:]) is None
    assert layout_of(tmp_path, good[:4] + struct.pack("<I", 3) + good[8:]) is None
    assert layout_of(tmp_path, synthetic(k_type=99)) is None  # not a cache type
    two = synthetic(n_stream=2, stream=1)[:-1]
    assert layout_of(tmp_path, two) is None  # stream 1 named but missing
    huge = struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, 2**31)  # tokens past the end
    assert layout_of(tmp_path, huge) is None
    assert read_layout(tmp_path / "missing.bin") is None


def test_every_truncation_is_unknown(tmp_path: Path) -> None:
    data = synthetic(cells=2, layers=1, k_row=8, v_row=8)
    for cut in range(len(data)):
        assert layout_of(tmp_path, data[:cut]) is None, cut


@settings(max_examples=200)
@given(st.binary(max_size=400), st.integers(0, 120))
def test_random_bytes_never_raise(
    tmp_path_factory: pytest.TempPathFactory, noise: bytes, at: int
) -> None:
    base = bytearray(synthetic(cells=2, layers=1, k_row=8, v_row=8))
    base[at : at + len(noise)] = noise
    path = tmp_path_factory.mktemp("fuzz") / "f.bin"
    path.write_bytes(bytes(base))
    result = read_layout(path)
    assert result is None or isinstance(result, SlotLayout)


def test_file_sha256(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    assert file_sha256(path) == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        3,
    )


def saved(server: LlamaServerProcess, slot_dir: Path, name: str, slot: int = 0) -> Path:
    with LlamaClient(server.url, timeout=60) as client:
        client.complete(
            {"prompt": "hello there", "n_predict": 0, "id_slot": slot, "cache_prompt": True}
        )
        client.slot_save(slot, name)
    return slot_dir / name


@pytest.mark.llama
def test_files_of_real_servers(
    start_server: StartServer,
    tiny_model: Path,
    mamba_model: Path,
    slot_dir: Path,
) -> None:
    f16 = read_layout(saved(start_server(tiny_model), slot_dir, "a.bin"))
    f32 = read_layout(
        saved(start_server(tiny_model, extra_args=["-ctk", "f32"]), slot_dir, "b.bin")
    )
    np3 = read_layout(
        saved(start_server(tiny_model, parallel=3, ctx=3 * 4096), slot_dir, "c.bin", 2)
    )
    mamba = read_layout(saved(start_server(mamba_model), slot_dir, "d.bin"))
    assert f16 is not None and f16.cache_types() == "K f16 / V f16" and f16.n_stream == 1
    assert f32 is not None and f32.cache_types() == "K f32 / V f16"
    assert f16.difference(f32) == "cache type K f16 / V f16 != K f32 / V f16"
    assert np3 is not None and np3.n_stream == 3 and f16.difference(np3) is not None
    assert mamba is None  # a recurrent cache: not a plain K/V layout


def test_tokens_of_both_packings(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(synthetic())  # an older build's plain token list: 7, 8
    assert read_tokens(path) == (7, 8)
    packed = struct.pack("<iII", -1, 1, 3) + struct.pack("<3i", 11, 12, 13) + struct.pack("<I", 0)
    data = struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, len(packed) // 4) + packed
    path.write_bytes(data + synthetic()[20:])
    assert read_tokens(path) == (11, 12, 13)
    path.write_bytes(struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, 1000) + b"\0" * 8)
    assert read_tokens(path) is None  # truncated
    path.write_bytes(struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, 3) + struct.pack("<iII", -1, 1, 9))
    assert read_tokens(path) is None  # a count beyond the packed words
    assert read_tokens(tmp_path / "missing.bin") is None


@pytest.mark.llama
def test_tokens_of_a_real_slot_file(llama_server: LlamaServerProcess, slot_dir: Path) -> None:
    with LlamaClient(llama_server.url) as client:
        tokens = client.tokenize("The slot file holds the prompt's own tokens.", True)
        client.complete({"prompt": tokens, "n_predict": 0, "id_slot": 0, "cache_prompt": True})
        client.slot_save(0, "tok.bin")
    assert read_tokens(slot_dir / "tok.bin") == tuple(tokens)
