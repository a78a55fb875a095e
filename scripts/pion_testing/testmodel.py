"""Generate tiny random-weight GGUF models that a real llama-server loads and serves.

Owns: writing a llama-architecture GGUF with the `gguf` package (``arch="llama"``), a
sliding-window Gemma 3 one (``arch="gemma3"``), a recurrent Mamba one (``arch="mamba"``) or
a hybrid LFM2 one (``arch="lfm2"``: short-convolution layers between attention layers; the
last three exercise the warmer's path for models whose slot files may not carry their state),
with the vocabulary copied from a ``models/ggml-vocab-*.gguf`` of the llama.cpp source tree
and a chat template in the metadata. The weights are random (fixed seed), so the text a
model writes is noise, but prompt processing, prompt caching and slot save/restore are the
real thing, which is all the `pion llama` tests and benchmark need.

Does not own: building llama-server or starting it (:mod:`pion_testing.paths`,
:mod:`pion_testing.launcher`). Generated models go to temporary or cache directories and are
never committed (``*.gguf`` is ignored).

The chat template renders the tool list *before* the system message (as pi-prefix-cache's
"tools-first" ``--chat-template-file`` does), so tools are part of the reusable prefix.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from pion_testing.paths import vocab_file

__all__ = ["ARCHS", "CHAT_TEMPLATE", "ModelSpec", "main", "make_model"]

# Tools first, then every message, then the generation prompt; `enable_thinking` is a
# chat_template_kwargs switch so that kwargs change the rendering (and the fingerprint).
CHAT_TEMPLATE = """\
{%- if tools -%}
<|tools|>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
<|end|>
{% endif -%}
{%- for message in messages -%}
<|{{ message.role }}|>
{% if message.content is string -%}
{{ message.content }}
{%- else -%}
{%- for part in message.content -%}
{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}
{%- endfor -%}
{%- endif %}
<|end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>
{% if enable_thinking is defined and enable_thinking %}<think>
{% endif -%}
{%- endif -%}
"""


ARCHS = ("llama", "gemma3", "mamba", "lfm2")
# LFM2's short convolution: the tokens each convolution layer keeps (its recurrent state).
_LFM2_CONV = 3


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a generated model. The defaults are the tiny test model."""

    # "llama", "gemma3" (sliding-window attention), "mamba" (recurrent) or "lfm2" (hybrid)
    arch: str = "llama"
    layers: int = 2
    width: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    context: int = 4096
    vocab: str = "llama-spm"
    seed: int = 0
    name: str = "pion-test"
    # gemma3 only: tokens each sliding-window layer attends to (small, so that a short
    # prompt already slides past it).
    sliding_window: int = 32

    def check(self) -> None:
        """Raise ValueError for a shape llama.cpp would reject."""
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {', '.join(ARCHS)}, not {self.arch!r}")
        if self.layers < 1 or self.width < 8 or self.ff < 1 or self.context < 16:
            raise ValueError("layers >= 1, width >= 8, ff >= 1 and context >= 16 are required")
        if self.arch != "mamba" and (
            self.width % self.heads or self.heads % self.kv_heads or (self.width // self.heads) % 2
        ):
            raise ValueError("width must split into heads of even size; heads % kv_heads == 0")


def _copy_vocab(writer: Any, source: Path) -> int:
    """Copy every ``tokenizer.*`` key of a vocab-only GGUF; return the vocabulary size."""
    reader = gguf.GGUFReader(source)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        main = field.types[0]
        value = field.contents()
        if main == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, main, sub_type=field.types[-1])
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(key, value, main)
    if n_vocab == 0:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return n_vocab


def _llama_tensors(spec: ModelSpec, n_vocab: int, rng: np.random.Generator) -> dict[str, Any]:
    head_dim = spec.width // spec.heads
    kv_width = head_dim * spec.kv_heads

    def w(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    # numpy shapes are (rows, cols) = (out, in); gguf reverses them into ggml's ne order.
    tensors: dict[str, Any] = {
        "token_embd.weight": w(n_vocab, spec.width),
        "output_norm.weight": np.ones(spec.width, np.float32),
    }
    for i in range(spec.layers):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": np.ones(spec.width, np.float32),
            p + "attn_q.weight": w(spec.width, spec.width),
            p + "attn_k.weight": w(kv_width, spec.width),
            p + "attn_v.weight": w(kv_width, spec.width),
            p + "attn_output.weight": w(spec.width, spec.width),
            p + "ffn_norm.weight": np.ones(spec.width, np.float32),
            p + "ffn_gate.weight": w(spec.ff, spec.width),
            p + "ffn_up.weight": w(spec.ff, spec.width),
            p + "ffn_down.weight": w(spec.width, spec.ff),
        }
    return tensors


def _gemma3_tensors(spec: ModelSpec, n_vocab: int, rng: np.random.Generator) -> dict[str, Any]:
    """Llama's tensors plus Gemma 3's extra norms (post-attention, post-FFN, Q/K norms)."""
    tensors = _llama_tensors(spec, n_vocab, rng)
    head_dim = spec.width // spec.heads
    for i in range(spec.layers):
        p = f"blk.{i}."
        tensors |= {
            p + "post_attention_norm.weight": np.ones(spec.width, np.float32),
            p + "post_ffw_norm.weight": np.ones(spec.width, np.float32),
            p + "attn_q_norm.weight": np.ones(head_dim, np.float32),
            p + "attn_k_norm.weight": np.ones(head_dim, np.float32),
        }
    return tensors


# Mamba-1 state sizes: d_inner = 2 * width, a 4-wide causal conv, 16 state channels.
_MAMBA_CONV = 4
_MAMBA_STATE = 16


def _mamba_tensors(spec: ModelSpec, n_vocab: int, rng: np.random.Generator) -> dict[str, Any]:
    d_inner = 2 * spec.width
    dt_rank = max(1, spec.width // 16)

    def w(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors: dict[str, Any] = {
        "token_embd.weight": w(n_vocab, spec.width),
        "output_norm.weight": np.ones(spec.width, np.float32),
    }
    for i in range(spec.layers):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": np.ones(spec.width, np.float32),
            p + "ssm_in.weight": w(2 * d_inner, spec.width),
            p + "ssm_conv1d.weight": w(d_inner, _MAMBA_CONV),
            p + "ssm_conv1d.bias": np.zeros(d_inner, np.float32),
            p + "ssm_x.weight": w(dt_rank + 2 * _MAMBA_STATE, d_inner),
            p + "ssm_dt.weight": w(d_inner, dt_rank),
            p + "ssm_dt.bias": np.zeros(d_inner, np.float32),
            # A must be negative for a stable scan; llama.cpp stores -exp(A_log).
            p + "ssm_a": -np.tile(np.arange(1, _MAMBA_STATE + 1, dtype=np.float32), (d_inner, 1)),
            p + "ssm_d": np.ones(d_inner, np.float32),
            p + "ssm_out.weight": w(spec.width, d_inner),
        }
    return tensors


def _lfm2_attention(spec: ModelSpec, layer: int) -> bool:
    """LFM2's layout in small: convolution layers, every other one attention (the last
    always), so both kinds of state are in every model of two layers or more."""
    return layer % 2 == 1 or layer == spec.layers - 1


def _lfm2_tensors(spec: ModelSpec, n_vocab: int, rng: np.random.Generator) -> dict[str, Any]:
    head_dim = spec.width // spec.heads
    kv_width = head_dim * spec.kv_heads

    def w(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors: dict[str, Any] = {
        "token_embd.weight": w(n_vocab, spec.width),
        "token_embd_norm.weight": np.ones(spec.width, np.float32),  # LFM2's output norm
    }
    for i in range(spec.layers):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": np.ones(spec.width, np.float32),
            p + "ffn_norm.weight": np.ones(spec.width, np.float32),
            p + "ffn_gate.weight": w(spec.ff, spec.width),
            p + "ffn_up.weight": w(spec.ff, spec.width),
            p + "ffn_down.weight": w(spec.width, spec.ff),
        }
        if _lfm2_attention(spec, i):
            tensors |= {
                p + "attn_q_norm.weight": np.ones(head_dim, np.float32),
                p + "attn_k_norm.weight": np.ones(head_dim, np.float32),
                p + "attn_q.weight": w(spec.width, spec.width),
                p + "attn_k.weight": w(kv_width, spec.width),
                p + "attn_v.weight": w(kv_width, spec.width),
                p + "attn_output.weight": w(spec.width, spec.width),
            }
        else:
            tensors |= {
                p + "shortconv.conv.weight": w(spec.width, _LFM2_CONV),
                p + "shortconv.in_proj.weight": w(3 * spec.width, spec.width),
                p + "shortconv.out_proj.weight": w(spec.width, spec.width),
            }
    return tensors


def make_model(path: Path, spec: ModelSpec | None = None, vocab: Path | None = None) -> Path:
    """Write a random-weight GGUF model described by ``spec`` to ``path`` and return it.

    ``vocab`` defaults to ``models/ggml-vocab-<spec.vocab>.gguf`` of the llama.cpp tree.
    """
    spec = spec or ModelSpec()
    spec.check()
    source = vocab or vocab_file(spec.vocab)
    if not source.is_file():
        raise FileNotFoundError(f"vocabulary {source} not found; run scripts/build-llama-server")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, spec.arch)
    writer.add_name(spec.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.width)
    writer.add_block_count(spec.layers)
    writer.add_layer_norm_rms_eps(1e-5)
    if spec.arch == "mamba":
        writer.add_feed_forward_length(0)
        writer.add_head_count(0)
        writer.add_ssm_conv_kernel(_MAMBA_CONV)
        writer.add_ssm_inner_size(2 * spec.width)
        writer.add_ssm_state_size(_MAMBA_STATE)
        writer.add_ssm_time_step_rank(max(1, spec.width // 16))
    else:
        writer.add_feed_forward_length(spec.ff)
        writer.add_head_count(spec.heads)
        if spec.arch == "lfm2":
            # Per layer: no K/V heads marks a convolution layer.
            kv = [spec.kv_heads if _lfm2_attention(spec, i) else 0 for i in range(spec.layers)]
            writer.add_head_count_kv(kv)
            writer.add_shortconv_l_cache(_LFM2_CONV)
        else:
            writer.add_head_count_kv(spec.kv_heads)
        writer.add_rope_dimension_count(spec.width // spec.heads)
        writer.add_rope_freq_base(10000.0)
    if spec.arch == "gemma3":
        # Every layer slides (llama.cpp's default pattern makes every 6th global; with
        # fewer layers none is), which is what makes its slot files partial.
        writer.add_key_length(spec.width // spec.heads)
        writer.add_value_length(spec.width // spec.heads)
        writer.add_sliding_window(spec.sliding_window)
    n_vocab = _copy_vocab(writer, source)
    writer.add_vocab_size(n_vocab)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(spec.seed)
    build = {
        "llama": _llama_tensors,
        "gemma3": _gemma3_tensors,
        "mamba": _mamba_tensors,
        "lfm2": _lfm2_tensors,
    }[spec.arch]
    for name, tensor in build(spec, n_vocab, rng).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """``scripts/make-test-model``: print the path of the written model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("output", type=Path, help="where to write the .gguf")
    parser.add_argument("--arch", choices=ARCHS, default="llama")
    parser.add_argument("--layers", type=int, default=ModelSpec.layers)
    parser.add_argument("--width", type=int, default=ModelSpec.width)
    parser.add_argument("--heads", type=int, default=ModelSpec.heads)
    parser.add_argument("--kv-heads", type=int, default=ModelSpec.kv_heads)
    parser.add_argument("--ff", type=int, default=None, help="feed-forward width (2x width)")
    parser.add_argument("--context", type=int, default=ModelSpec.context)
    parser.add_argument("--vocab", default=ModelSpec.vocab, help="ggml-vocab-<NAME>.gguf")
    parser.add_argument("--seed", type=int, default=ModelSpec.seed)
    args = parser.parse_args(argv)
    spec = ModelSpec(
        arch=args.arch,
        layers=args.layers,
        width=args.width,
        heads=args.heads,
        kv_heads=args.kv_heads,
        ff=args.ff if args.ff is not None else 2 * args.width,
        context=args.context,
        vocab=args.vocab,
        seed=args.seed,
    )
    print(make_model(args.output, spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
