"""`pion llama`: keep an agent's stable prefix warm in llama.cpp's llama-server and on disk.

The pi-prefix-cache behaviour (docs/llama.md) in Python. Reading order:

- :mod:`~pion.llama.config`      WarmerConfig, ``PI_PREFIX_CACHE_*`` env vars
- :mod:`~pion.llama.prefix`      the stable prefix of a chat request (boundary markers)
- :mod:`~pion.llama.fingerprint` SHA-256 fingerprint, slot file names
- :mod:`~pion.llama.client`      httpx client for llama-server's HTTP API
- :mod:`~pion.llama.timings`     ``timings`` from JSON or SSE responses (sans-IO)
- :mod:`~pion.llama.index`       ``index.json`` and slot-file cleanup
- :mod:`~pion.llama.serverinfo`  what /props says; the (build, model) key
- :mod:`~pion.llama.warmer`      the state machine: hit / restore + verify / cold + save
- :mod:`~pion.llama.proxy`       the OpenAI-compatible reverse proxy
- :mod:`~pion.llama.cli`         ``pion llama proxy|warm|status|gc``
- :mod:`~pion.llama.paths`       the cache root and the default log file

A real llama-server and tiny GGUF models for tests and benchmarks are development
scaffolding, in ``scripts/pion_testing`` (not installed).

A harness that is not Pi uses the warmer directly::

    warmer = PrefixWarmer(WarmerConfig(base_url="http://127.0.0.1:8080"))
    outcome = warmer.ensure(WarmRequest(prefix=system_prompt, render={"tools": tools}))
    ...  # send the real request, then optionally:
    warmer.observe(outcome, Timings.from_json(response_json))

This package never imports ``pion.server`` (README.md, "Source tour").
"""

from __future__ import annotations

from pion.llama.client import LlamaClient, LlamaServerError
from pion.llama.config import DEFAULT_MARKERS, WarmerConfig
from pion.llama.fingerprint import FingerprintInputs, file_name, fingerprint
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.outcome import Outcome
from pion.llama.prefix import PrefixSkip, WarmRequest, split_prefix, warm_request_from_chat
from pion.llama.timings import Timings, TimingsScanner
from pion.llama.warmer import PrefixWarmer

__all__ = [
    "DEFAULT_MARKERS",
    "FingerprintInputs",
    "IndexEntry",
    "LlamaClient",
    "LlamaServerError",
    "Outcome",
    "PrefixSkip",
    "PrefixWarmer",
    "SlotIndex",
    "Timings",
    "TimingsScanner",
    "WarmRequest",
    "WarmerConfig",
    "file_name",
    "fingerprint",
    "split_prefix",
    "warm_request_from_chat",
]
