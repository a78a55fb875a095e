"""`pion llama`: keep agents' stable prefixes warm in llama.cpp's llama-server, on disk and
in a store shared by several machines.

The pi-prefix-cache behaviour in Python (docs/llama.md). Reading order:

- :mod:`~pion.llama.config`      WarmerConfig, ``PI_PREFIX_CACHE_*`` env vars
- :mod:`~pion.llama.prefix`      the stable prefix of a chat request (boundary markers)
- :mod:`~pion.llama.endpoints`   generation endpoints; Messages/Responses → chat, as llama-server
- :mod:`~pion.llama.learn`       the boundary learned from what a harness's requests share
- :mod:`~pion.llama.divergence`  where a request left the learned prefix, and why
- :mod:`~pion.llama.watch`       each harness's last divergences, for the log and status
- :mod:`~pion.llama.tokencache`  tokens of prefixes rendered before: a hit is not tokenized
- :mod:`~pion.llama.prompt`      the warmable prefix of a request to any endpoint
- :mod:`~pion.llama.fingerprint` SHA-256 fingerprint, slot file names, model identity
- :mod:`~pion.llama.client`      httpx client for llama-server's HTTP API
- :mod:`~pion.llama.timings`     ``timings`` from JSON or SSE responses (sans-IO)
- :mod:`~pion.llama.index`       ``index.json`` and slot-file cleanup
- :mod:`~pion.llama.serverinfo`  what /props says; the (build, model) key
- :mod:`~pion.llama.modelkind`   sliding-window, recurrent and hybrid models (GGUF header)
- :mod:`~pion.llama.slotfile`    the cache layout a slot file was written with
- :mod:`~pion.llama.compat`      will a file load into the running server (before restore)
- :mod:`~pion.llama.slots`       one prefix per slot: LRU routing
- :mod:`~pion.llama.manifest`    the shared store's key layout and manifest
- :mod:`~pion.llama.store`       the store: chunked push, verified pull, the receipt
- :mod:`~pion.llama.background`  store work no request waits for
- :mod:`~pion.llama.eventlog`    the ``[prefix-cache]`` log file
- :mod:`~pion.llama.outcome`     what one warm did, in pi-prefix-cache's words
- :mod:`~pion.llama.identity`    which local llama-server process serves: a hit trusts it
- :mod:`~pion.llama.context`     state the warmer's steps share
- :mod:`~pion.llama.lease`       a request owns its slot until its answer is done
- :mod:`~pion.llama.restore`     restore from disk or store, then verify
- :mod:`~pion.llama.partial`     restore a saved prefix sharing most of a new one's tokens
- :mod:`~pion.llama.coldbuild`   cold warm-up, save, push; saving an evicted prefix
- :mod:`~pion.llama.checkpoint`  a conversation saved after its answer, rate-limited
- :mod:`~pion.llama.steps`       the state machine in a slot: hit / restore / cold, answers
- :mod:`~pion.llama.leasing`     which slot a request takes, and its lease there
- :mod:`~pion.llama.warmer`      the public API: claim, finish, ensure, status
- :mod:`~pion.llama.route`       which llama-server of a fleet a request goes to (pure)
- :mod:`~pion.llama.registry`    where prefixes are, shared by several proxies via the store
- :mod:`~pion.llama.upstream`    one llama-server of a fleet, as routing sees it
- :mod:`~pion.llama.fleet`       several llama-servers: health, load, routing
- :mod:`~pion.llama.status`      ``/pion/status`` data
- :mod:`~pion.llama.metrics`     ``/pion/metrics``: routing for Prometheus
- :mod:`~pion.llama.storelist`   ``pion llama status --store``: what a store holds
- :mod:`~pion.llama.frontdoor`   ``/pion/status`` answered in a thread of its own, off the loop
- :mod:`~pion.llama.httpserver`  uvicorn, with limits on slow and idle clients
- :mod:`~pion.llama.proxy`       the OpenAI-compatible reverse proxy
- :mod:`~pion.llama.cli`         ``pion llama proxy|warm|status|gc``
- :mod:`~pion.llama.configfile`  ``pion llama proxy --config FILE``: its flags in TOML
- :mod:`~pion.llama.serve`       ``pion llama serve``: llama-server and the proxy as one command
- :mod:`~pion.llama.serve_cli`   its command-line face
- :mod:`~pion.llama.agents`      the configuration that points each harness at the proxy
- :mod:`~pion.llama.paths`       the cache root and the default log file

A real llama-server and tiny GGUF models for tests and benchmarks are development
scaffolding, in ``scripts/pion_testing`` (not installed).

A harness that is not Pi uses the warmer directly::

    warmer = PrefixWarmer(WarmerConfig(base_url="http://127.0.0.1:8080"))  # in a coroutine
    outcome = await warmer.ensure(WarmRequest(prefix=system_prompt, render={"tools": tools}))
    ...  # send the real request, then optionally:
    await warmer.observe(outcome, Timings.from_json(response_json))
    await warmer.aclose()

This package never imports ``pion.server``: the store is reached over RESP like any client.
"""

from __future__ import annotations

from pion.llama.client import LlamaClient, LlamaServerError
from pion.llama.config import DEFAULT_MARKERS, WarmerConfig
from pion.llama.fingerprint import FingerprintInputs, file_name, fingerprint
from pion.llama.index import IndexEntry, SlotIndex
from pion.llama.outcome import Outcome
from pion.llama.prefix import PrefixSkip, WarmRequest, split_prefix, warm_request_from_chat
from pion.llama.slotfile import SlotLayout, read_layout
from pion.llama.slots import parse_slots
from pion.llama.store import SlotStore, StoreConfig, StoreCorrupt, StoreError
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
    "SlotLayout",
    "SlotStore",
    "StoreConfig",
    "StoreCorrupt",
    "StoreError",
    "Timings",
    "TimingsScanner",
    "WarmRequest",
    "WarmerConfig",
    "file_name",
    "fingerprint",
    "parse_slots",
    "read_layout",
    "split_prefix",
    "warm_request_from_chat",
]
