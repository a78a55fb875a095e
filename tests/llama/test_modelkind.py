"""pion.llama.modelkind: which models keep state that slot files may not carry, read from
generated GGUFs of each kind; `pion llama serve` passing --swa-full for sliding-window
models; and what a real llama-server b11434 does when it restores such a slot file."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest
from pion_testing.testmodel import ModelSpec, make_model

from pion.llama.modelkind import (
    ModelKind,
    classify_metadata,
    detect_model_state,
    read_gguf_metadata,
)
from pion.llama.serve import ServeOptions, llama_server_args, swa_full_reason


@pytest.fixture(scope="module")
def gemma3_model(models_dir: Path) -> Path:
    return make_model(models_dir / "gemma3.gguf", ModelSpec(arch="gemma3", sliding_window=32))


@pytest.fixture
def kind_models(
    tiny_model: Path, gemma3_model: Path, mamba_model: Path, hybrid_model: Path
) -> dict[str, Path]:
    return {"llama": tiny_model, "gemma3": gemma3_model, "mamba": mamba_model, "lfm2": hybrid_model}


def test_the_header_reader_agrees_with_the_gguf_package(gemma3_model: Path) -> None:
    meta = read_gguf_metadata(gemma3_model)
    reader = gguf.GGUFReader(gemma3_model)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's own pseudo-fields (version, counts)
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert key not in meta
        else:
            assert meta[key] == pytest.approx(field.contents()), key
    assert meta["gemma3.attention.sliding_window"] == 32


def test_each_generated_kind(
    tiny_model: Path, gemma3_model: Path, mamba_model: Path, hybrid_model: Path
) -> None:
    plain = detect_model_state({"model_path": str(tiny_model)})
    assert (plain.kind, plain.arch, plain.slot_files_partial) == (
        ModelKind.ATTENTION,
        "llama",
        False,
    )
    swa = detect_model_state({"model_path": str(gemma3_model)})
    assert (swa.kind, swa.sliding_window, swa.slot_files_partial) == (
        ModelKind.SLIDING_WINDOW,
        32,
        True,
    )
    assert "without --swa-full" in swa.reason
    full = detect_model_state({"model_path": str(gemma3_model)}, swa_full=True)
    assert not full.slot_files_partial and "--swa-full" in full.reason
    rec = detect_model_state({"model_path": str(mamba_model)})
    assert (rec.kind, rec.slot_files_partial) == (ModelKind.RECURRENT, True)
    assert rec.reason.startswith("mamba is a recurrent model")
    assert rec.to_json()["kind"] == "recurrent" and rec.to_json()["slot_files_partial"]
    hybrid = detect_model_state({"model_path": str(hybrid_model)})
    assert (hybrid.kind, hybrid.arch, hybrid.slot_files_partial) == (
        ModelKind.HYBRID,
        "lfm2",
        True,
    )
    assert hybrid.reason.startswith("lfm2 is a hybrid model")


def test_architectures_from_metadata_alone() -> None:
    assert classify_metadata({"general.architecture": "jamba"}).kind is ModelKind.HYBRID
    assert classify_metadata({"general.architecture": "rwkv7"}).kind is ModelKind.RECURRENT
    # An architecture llama.cpp may add later: its keys tell.
    new_hybrid = {
        "general.architecture": "newarch",
        "newarch.ssm.state_size": 16,
        "newarch.attention.head_count": 8,
    }
    assert classify_metadata(new_hybrid).kind is ModelKind.HYBRID
    new_rnn = {"general.architecture": "newrnn", "newrnn.wkv.head_size": 64}
    assert classify_metadata(new_rnn).kind is ModelKind.RECURRENT
    gpt_oss = {"general.architecture": "gpt-oss", "gpt-oss.attention.sliding_window": 128}
    assert classify_metadata(gpt_oss).kind is ModelKind.SLIDING_WINDOW
    no_window = {"general.architecture": "gemma3", "gemma3.attention.sliding_window": 0}
    assert classify_metadata(no_window).kind is ModelKind.ATTENTION
    assert classify_metadata({}).kind is ModelKind.UNKNOWN


def test_unreadable_or_foreign_files(tmp_path: Path, tiny_model: Path) -> None:
    missing = detect_model_state({"model_path": str(tmp_path / "gone.gguf")})
    assert missing.kind is ModelKind.UNKNOWN and "cannot read" in missing.reason
    assert detect_model_state({}).kind is ModelKind.UNKNOWN
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_metadata(not_gguf)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated"):
        read_gguf_metadata(cut)
    huge = tmp_path / "huge.gguf"
    huge.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40))
    with pytest.raises(ValueError, match="too long"):
        read_gguf_metadata(huge)


def test_serve_passes_swa_full_for_sliding_window_models(
    tmp_path: Path, tiny_model: Path, gemma3_model: Path
) -> None:
    binary = Path("/bin/llama-server")

    def args(model: Path, **kwargs: Any) -> list[str]:
        return llama_server_args(binary, ServeOptions(model=model, slot_dir=tmp_path, **kwargs), 1)

    assert "--swa-full" in args(gemma3_model)
    assert "sliding-window" in (swa_full_reason(ServeOptions(model=gemma3_model)) or "")
    assert "--swa-full" not in args(gemma3_model, swa_full=False)
    assert "--swa-full" not in args(tiny_model)
    assert "--swa-full" in args(tiny_model, swa_full=True)
    assert args(gemma3_model, llama_args=("--swa-full",)).count("--swa-full") == 1
    assert "--swa-full" not in args(tmp_path / "missing.gguf")


def _restored_reuse(server_url: str) -> tuple[int, int, int]:
    """Fill slot 0, save it; the caller restarts the server; see :func:`_after_restart`."""
    prompt = " ".join(f"word{i}" for i in range(200))
    with httpx.Client(base_url=server_url, timeout=120) as c:
        first = c.post("/completion", json={"prompt": prompt, "n_predict": 2, "id_slot": 0})
        saved = c.post("/slots/0?action=save", json={"filename": "kind.bin"}).json()
    return first.json()["timings"]["prompt_n"], saved["n_saved"], saved["n_written"]


def _after_restart(server_url: str) -> tuple[int, int, int]:
    prompt = " ".join(f"word{i}" for i in range(200)) + " and then a question"
    with httpx.Client(base_url=server_url, timeout=120) as c:
        restored = c.post("/slots/0?action=restore", json={"filename": "kind.bin"})
        assert restored.status_code == 200, restored.text
        t = c.post("/completion", json={"prompt": prompt, "n_predict": 2, "id_slot": 0}).json()
    return restored.json()["n_restored"], t["timings"]["cache_n"], t["timings"]["prompt_n"]


@pytest.mark.llama
@pytest.mark.parametrize(
    ("kind", "extra", "reused"),
    [
        ("llama", (), True),
        ("gemma3", (), False),  # the file keeps only the window
        ("gemma3", ("--swa-full",), True),
        ("mamba", (), False),  # no recurrent state in the file
        ("lfm2", (), False),  # nor the hybrid's convolution state
    ],
)
def test_what_a_restored_slot_file_reuses_on_b11434(
    start_server: Any, kind_models: dict[str, Path], kind: str, extra: tuple[str, ...], reused: bool
) -> None:
    model = kind_models[kind]
    server = start_server(model, extra_args=list(extra))
    n_prompt, n_saved, _ = _restored_reuse(server.url)
    server.restart()
    n_restored, cache_n, _ = _after_restart(server.url)
    # The restore itself always succeeds, with every token...
    assert n_restored == n_saved >= n_prompt
    # ...but only a plain or --swa-full model reuses them.
    assert (cache_n >= n_saved * 9 // 10) is reused
    assert (cache_n == 0) is not reused
