"""Pion: a prompt-prefix K/V cache for LLM serving.

The server (``pion-server``) speaks the Redis protocol and stores per-layer K/V rows in
eight quantized formats; the client (:mod:`pion.client`) pushes and pulls numpy arrays;
:mod:`pion.llama` keeps an agent's stable prefix warm in a llama.cpp ``llama-server``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
