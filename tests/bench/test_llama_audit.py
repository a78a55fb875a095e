"""bench/_llama_audit.py and bench/_harness_shapes.py: the reuse read from each endpoint's
answer, the audit that finds a slot file saved under another prefix's name, and the
replayed sessions' shape (each turn extends the last; the side request beside the first)."""

from __future__ import annotations

import itertools
import json
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402, F401  (puts scripts/ on sys.path)
from _harness_shapes import SHAPES, session  # noqa: E402
from _llama_audit import audit, read_reuse  # noqa: E402
from pion.llama.slotfile import SEQ_MAGIC, SEQ_VERSION  # noqa: E402

CAP = 8


def _slot_file(path: Path, tokens: list[int]) -> None:
    """The header of a sequence-state file: magic, version, the tokens (no K/V after:
    the audit reads only the tokens)."""
    path.write_bytes(
        struct.pack(f"<III{len(tokens)}i", SEQ_MAGIC, SEQ_VERSION, len(tokens), *tokens)
    )


def _index(slot_dir: Path, entries: dict[str, tuple[int, str]]) -> None:
    files = {
        name: {"fingerprint": name, "tokens": tokens, "bytes": 1, "created": 1.0,
               "last_used": 1.0, "harness": harness}
        for name, (tokens, harness) in entries.items()
    }  # fmt: skip
    (slot_dir / "index.json").write_text(json.dumps({"version": 1, "files": files}))


def test_a_file_must_hold_the_prefix_its_name_stands_for(tmp_path: Path) -> None:
    main = list(range(1, 121))  # a main request of harness "a": 120 tokens
    side = [1, 2, 3, *range(900, 940)]  # its title request: shares 3 tokens
    # The race: the side's prefix file holds the main request's state (its
    # prompt and answer), with an index entry that counts what the file holds.
    _slot_file(tmp_path / "side.bin", [*main, 7, 7])
    _slot_file(tmp_path / "main.bin", [*main[:100], 5])  # the main prefix, and more: ok
    _slot_file(tmp_path / "short.bin", main[:50])  # fewer tokens than its prefix
    _index(tmp_path, {"side.bin": (122, "a"), "main.bin": (101, "a"), "short.bin": (100, "a")})
    names = {"side.bin": side, "main.bin": main[:100], "short.bin": main[:100]}
    rows = {r["file"]: r for r in audit(tmp_path, names, {"a": [main, side]}, CAP)}
    assert {n: r["verdict"] for n, r in rows.items()} == {
        "side.bin": "misnamed",
        "main.bin": "ok",
        "short.bin": "misnamed",
    }
    assert {r["named_by"] for r in rows.values()} == {"fingerprint"}
    assert (rows["side.bin"]["prefix"], rows["side.bin"]["held"]) == (43, 122)


def test_a_file_with_a_name_not_derived_is_checked_against_its_index_entry(
    tmp_path: Path,
) -> None:
    main = list(range(1, 121))
    side = [1, 2, 3, *range(900, 940)]
    other = list(range(500, 600))  # harness "b"
    _slot_file(tmp_path / "prefix.bin", main[:100])  # the learned prefix: ok
    _slot_file(tmp_path / "longer.bin", main)  # holds more than its prefix: ok
    _slot_file(tmp_path / "swapped.bin", side)  # fewer tokens than its entry counts
    _slot_file(tmp_path / "foreign.bin", other)  # b's state under a's prefix
    _slot_file(tmp_path / "checkpoint.bin", [*main, 7, 7, 7])  # conversation + its answer
    _slot_file(tmp_path / "too-long-claim.bin", [*main, *range(CAP + 2)])
    _slot_file(tmp_path / "stray.bin", main[:10])
    (tmp_path / "junk.bin").write_bytes(b"not a slot file")
    _index(tmp_path, {
        "prefix.bin": (100, "a"), "longer.bin": (100, "a"), "swapped.bin": (100, "a"),
        "foreign.bin": (80, "a"), "checkpoint.bin": (123, "a"),
        "too-long-claim.bin": (120 + CAP + 2, "a"), "junk.bin": (5, "a"),
    })  # fmt: skip
    rows = {r["file"]: r for r in audit(tmp_path, {}, {"a": [main, side], "b": [other]}, CAP)}
    verdicts = {name: r["verdict"] for name, r in rows.items()}
    assert verdicts == {
        "prefix.bin": "ok",
        "longer.bin": "ok",
        "swapped.bin": "misnamed",
        "foreign.bin": "misnamed",
        "checkpoint.bin": "ok",
        # More answer tokens than any answer can have (the cap): not this conversation.
        "too-long-claim.bin": "misnamed",
        "stray.bin": "unindexed",
        "junk.bin": "unreadable",
    }
    assert (rows["swapped.bin"]["held"], rows["swapped.bin"]["matched"]) == (43, 43)
    assert rows["foreign.bin"]["matched"] == 0
    assert rows["prefix.bin"]["named_by"] == "index"


def test_a_file_named_after_the_tokens_it_holds_is_ok(tmp_path: Path) -> None:
    conversation = [*range(1, 121), 7, 7, 7]  # a prompt, then the answer's tokens
    _slot_file(tmp_path / "own-123.bin", conversation)
    _slot_file(tmp_path / "own-999.bin", conversation)  # named after other tokens
    _index(tmp_path, {"own-123.bin": (123, "a"), "own-999.bin": (123, "a")})

    def own_name(harness: str, model: str, tokens: Sequence[int]) -> str:
        assert harness == "a"
        return f"own-{len(tokens)}.bin" if tuple(tokens[:3]) == (1, 2, 3) else "other.bin"

    rows = audit(tmp_path, {}, {"a": [list(range(1, 100))]}, CAP, own_name)
    verdicts = {r["file"]: (r["named_by"], r["verdict"]) for r in rows}
    assert verdicts == {"own-123.bin": ("own tokens", "ok"), "own-999.bin": ("index", "misnamed")}


def test_audit_of_an_unknown_harness_checks_every_request(tmp_path: Path) -> None:
    _slot_file(tmp_path / "f.bin", list(range(500, 560)))
    _index(tmp_path, {"f.bin": (60, "somebody else")})
    (row,) = audit(tmp_path, {}, {"a": [[1, 2, 3]], "b": [list(range(500, 600))]}, CAP)
    assert row["verdict"] == "ok"


def test_read_reuse_from_each_endpoint() -> None:
    timings = {"cache_n": 90, "prompt_n": 10}
    chat = [{"choices": [{"delta": {"content": "x"}}]}, {"choices": [], "timings": timings}]
    assert read_reuse(chat) == (90, 100)
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}}
    responses = [
        {"type": "response.output_text.delta", "delta": "x"},
        {"type": "response.completed", "response": {"usage": usage}},
    ]
    assert read_reuse(responses) == (64, 100)
    start = {"usage": {"input_tokens": 30, "cache_read_input_tokens": 70}}
    messages = [
        {"type": "message_start", "message": start},
        {"type": "message_delta", "usage": {"output_tokens": 8}},
    ]
    assert read_reuse(messages) == (70, 100)
    assert read_reuse([{"error": {"message": "boom"}}]) == (None, None)


def _bodies(turns: list[list[Any]]) -> list[str]:
    return [json.dumps(r.body, sort_keys=True) for turn in turns for r in turn if r.kind == "main"]


def test_sessions_extend_turn_by_turn_with_a_side_request_first() -> None:
    for shape in SHAPES.values():
        turns = session(shape, "s1", 3, CAP)
        assert [[r.kind for r in t] for t in turns] == [["main", "side"], ["main"], ["main"]]
        mains = [t[0].body for t in turns]
        key = "input" if shape.name == "codex" else "messages"
        for before, after in itertools.pairwise(mains):
            assert after[key][: len(before[key])] == before[key]
            assert len(after[key]) == len(before[key]) + 2
        # The same bytes in every run; another session differs.
        assert _bodies(session(shape, "s1", 3, CAP)) == _bodies(turns)
        assert _bodies(session(shape, "s2", 3, CAP)) != _bodies(turns)
    claude = session(SHAPES["claude"], "s1", 1, CAP)[0][0].body
    assert claude["system"][0]["text"].startswith("x-anthropic-billing-header: cc_version=")
    pi = session(SHAPES["pi"], "s1", 1, CAP)[0][0].body
    assert "\nCurrent date: 2026-12-05\nCurrent working directory:" in pi["messages"][0]["content"]
