"""The GGUF generator writes what llama.cpp expects (the server fixtures prove it loads)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from pion_testing.testmodel import CHAT_TEMPLATE, ModelSpec, main, make_model

# The vocabulary comes from the llama.cpp tree that scripts/build-llama-server unpacks.
pytestmark = pytest.mark.llama


def test_llama_model_metadata(tmp_path: Path, llama_bin: Path) -> None:
    path = make_model(tmp_path / "m.gguf", ModelSpec(layers=3, width=32, heads=2, kv_heads=1))
    reader = gguf.GGUFReader(path)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.block_count"].contents() == 3
    assert fields["llama.embedding_length"].contents() == 32
    assert fields["tokenizer.chat_template"].contents() == CHAT_TEMPLATE
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    n_vocab = len(fields["tokenizer.ggml.tokens"].contents())
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 2 + 3 * 9
    assert tuple(tensors["token_embd.weight"].shape) == (32, n_vocab)


def test_cli_and_deterministic(tmp_path: Path, llama_bin: Path) -> None:
    assert main([str(tmp_path / "a.gguf"), "--layers", "1", "--width", "16", "--heads", "2"]) == 0
    assert main([str(tmp_path / "b.gguf"), "--layers", "1", "--width", "16", "--heads", "2"]) == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError):
        ModelSpec(width=30, heads=4).check()
    with pytest.raises(ValueError):
        ModelSpec(arch="gpt2").check()
