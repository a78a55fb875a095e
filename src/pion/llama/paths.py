"""Where `pion llama` keeps its files by default: one cache root shared with the
development scripts (``$PION_CACHE``, default ``~/.cache/pion``), outside any repository.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "default_log_path"]


def cache_dir() -> Path:
    """The cache root: ``$PION_CACHE`` or ``~/.cache/pion``."""
    env = os.environ.get("PION_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pion"


def default_log_path() -> Path:
    """The ``[prefix-cache]`` log file when neither a flag nor PI_PREFIX_CACHE_LOG names one."""
    return cache_dir() / "prefix-cache.log"
