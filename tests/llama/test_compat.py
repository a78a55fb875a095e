"""Compatibility of a slot file with the running server, checked before any restore."""

from __future__ import annotations

import dataclasses

from pion.llama.compat import FileFacts, ServerFacts, mismatch
from pion.llama.slotfile import SlotLayout

MODEL = {"id": "tiny.gguf", "size": 10, "sample_sha256": "a" * 64}
LAYOUT = SlotLayout(1, 2, False, 0, 0, ("f16", "f16"), ("f16", "f16"), (64, 64), (64, 64))
SERVER = ServerFacts("b1", MODEL, 4096, LAYOUT)
FILE = FileFacts("b1", MODEL, 4096, LAYOUT)


def test_same_everything_matches() -> None:
    assert mismatch(FILE, SERVER) is None


def test_each_fact_that_differs_is_named() -> None:
    q8 = dataclasses.replace(LAYOUT, k_types=("q8_0", "q8_0"), k_row_bytes=(34, 34))
    streams = dataclasses.replace(LAYOUT, n_stream=3)
    rows = dataclasses.replace(LAYOUT, v_row_bytes=(128, 128))
    cases = {
        "built by llama-server b0, this one is b1": dataclasses.replace(FILE, build="b0"),
        "model tiny.gguf (11 bytes": dataclasses.replace(FILE, model={**MODEL, "size": 11}),
        "slot context 8192 != 4096 tokens": dataclasses.replace(FILE, n_ctx=8192),
        "cache type K q8_0 / V f16 != K f16 / V f16": dataclasses.replace(FILE, layout=q8),
        "3 K/V stream(s) != 1": dataclasses.replace(FILE, layout=streams),
        "cache layout differs": dataclasses.replace(FILE, layout=rows),
    }
    for why, facts in cases.items():
        got = mismatch(facts, SERVER)
        assert got is not None and why in got, (why, got)


def test_unknown_facts_are_not_compared() -> None:
    unknown = FileFacts("", None, 0, None)
    assert mismatch(unknown, SERVER) is None
    assert mismatch(FILE, dataclasses.replace(SERVER, layout=None, n_ctx=0)) is None
