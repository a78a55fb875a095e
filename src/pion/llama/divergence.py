"""Why a request missed: where it left a harness's learned prefix, and a guess at why.

Owns the pure, sans-IO part of "told why a request missed": :func:`find_divergence`
compares the learned prefix of a harness (its tokens and, when known, its text) with a new
request's, and returns a :class:`Divergence`: the token position where they part, the
character position in the text, a short excerpt on each side (``Current date:
2026-12-0`` then ``4`` learned against ``5`` sent) and a :class:`Cause` from a small
fixed set. :class:`DivergenceLog` keeps the last few per harness and a count per cause,
bounded (LRU over harness keys, which a client chooses), for ``/pion/status``, ``pion
llama status`` and the log. With ``excerpts=False`` (privacy) nothing of the prompt text
is kept, only positions and causes.

The cause is a heuristic over the text after the shared part, in this order: the request
ends inside the prefix (``shorter``), a date or time differs at the divergence
(``date-changed``), the same tool names in another order (``tools-reordered``), the learned
text's next block found later in the request (``block-inserted``, or ``block-moved`` when
what came in between also occurs later in the learned text), the request's next block
found later in the learned text (``block-removed``, or ``block-moved``), else
``text-changed``. Without texts only ``shorter`` and ``text-changed`` can be told.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "Cause",
    "Divergence",
    "DivergenceLog",
    "HarnessDivergences",
    "find_divergence",
]

EXCERPT_CHARS = 24
# How far around the divergence a date or time must sit to be the cause.
_DATE_WINDOW = 16
_DATE_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4}|\d{1,2}:\d{2}(?::\d{2})?"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\b"
    r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b",
)
_TOOL_NAME_RE = re.compile(r'"name"\s*:\s*"([^"\\]{1,128})"')
# A block is a line long enough to be found again by itself.
_MIN_BLOCK_CHARS = 12
# Keys beyond this length are cut: a header the client chooses must not grow memory.
_MAX_KEY_CHARS = 200


class Cause(StrEnum):
    """Why a request's prompt left the learned prefix (a heuristic, see the module doc)."""

    SHORTER = "shorter"
    DATE_CHANGED = "date-changed"
    TOOLS_REORDERED = "tools-reordered"
    BLOCK_MOVED = "block-moved"
    BLOCK_INSERTED = "block-inserted"
    BLOCK_REMOVED = "block-removed"
    TEXT_CHANGED = "text-changed"

    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Cause.SHORTER: "the request ends inside the learned prefix",
    Cause.DATE_CHANGED: "a date or time changed",
    Cause.TOOLS_REORDERED: "the tool list was reordered",
    Cause.BLOCK_MOVED: "a block moved",
    Cause.BLOCK_INSERTED: "a block was inserted",
    Cause.BLOCK_REMOVED: "a block was removed",
    Cause.TEXT_CHANGED: "the text changed",
}


@dataclass(frozen=True)
class Divergence:
    """Where one request left the learned prefix.

    ``token`` is the first token position that differs (= the tokens shared), out of
    ``learned_tokens``; ``char`` the same in the text (None without texts). ``shared`` is
    the text just before the divergence, ``learned`` and ``sent`` what follows in the
    learned prefix and in the request (all None without texts or with excerpts off).
    """

    token: int
    learned_tokens: int
    request_tokens: int
    cause: Cause
    char: int | None = None
    shared: str | None = None
    learned: str | None = None
    sent: str | None = None

    def without_excerpts(self) -> Divergence:
        return Divergence(
            self.token, self.learned_tokens, self.request_tokens, self.cause, self.char
        )

    def summary(self) -> str:
        """One line for the log and ``pion llama status``."""
        where = f"token {self.token} of {self.learned_tokens}"
        if self.char is not None:
            where += f" (char {self.char})"
        line = f"{where}: {self.cause.describe()}"
        if self.learned is not None or self.sent is not None:
            line += f": {self.shared or ''}{self.learned or ''!r} -> …{self.sent or ''!r}"
        return line

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "token": self.token,
            "learned_tokens": self.learned_tokens,
            "request_tokens": self.request_tokens,
            "cause": self.cause.value,
            "char": self.char,
        }
        if self.learned is not None or self.sent is not None:
            out.update(shared=self.shared, learned=self.learned, sent=self.sent)
        return out


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _excerpt(text: str, start: int, width: int) -> str:
    """``width`` chars from ``start``, cut at a line end so an excerpt stays one line."""
    piece = text[start : start + width]
    return piece.split("\n", 1)[0] if "\n" in piece[1:] else piece


def _shared_excerpt(text: str, end: int, width: int) -> str:
    piece = text[max(0, end - width) : end]
    return piece.rsplit("\n", 1)[-1]


def _date_at(text: str, pos: int) -> bool:
    lo, hi = max(0, pos - _DATE_WINDOW), pos + _DATE_WINDOW
    return any(m.start() <= pos + 1 and m.end() >= pos for m in _DATE_RE.finditer(text, lo, hi))


def _tools_reordered(learned: str, sent: str) -> bool:
    a = _TOOL_NAME_RE.findall(learned)
    b = _TOOL_NAME_RE.findall(sent)[: len(a)]
    return len(a) > 1 and a != b and sorted(a) == sorted(b)


def _first_block(text: str) -> str | None:
    """The first line of ``text`` that is long enough to be searched for."""
    for line in text.split("\n"):
        if len(line.strip()) >= _MIN_BLOCK_CHARS:
            return line
    return None


def _block_cause(learned_rest: str, sent_rest: str) -> Cause | None:
    block = _first_block(learned_rest)
    if block is not None:
        at = sent_rest.find(block)
        if at > 0:
            between = _first_block(sent_rest[:at])
            moved = between is not None and between in learned_rest
            return Cause.BLOCK_MOVED if moved else Cause.BLOCK_INSERTED
    block = _first_block(sent_rest)
    if block is not None:
        at = learned_rest.find(block)
        if at > 0:
            between = _first_block(learned_rest[:at])
            moved = between is not None and between in sent_rest
            return Cause.BLOCK_MOVED if moved else Cause.BLOCK_REMOVED
    return None


def _classify(learned: str, sent: str, char: int) -> Cause:
    if sent == learned[: len(sent)]:
        return Cause.SHORTER
    if _date_at(learned, char) or _date_at(sent, char):
        return Cause.DATE_CHANGED
    # Tool names from the start of the line: the divergence may fall inside a name.
    line = learned.rfind("\n", 0, char) + 1
    if _tools_reordered(learned[line:], sent[line:]):
        return Cause.TOOLS_REORDERED
    learned_rest, sent_rest = learned[char:], sent[char:]
    return _block_cause(learned_rest, sent_rest) or Cause.TEXT_CHANGED


def find_divergence(
    learned_tokens: Sequence[int],
    request_tokens: Sequence[int],
    learned_text: str | None = None,
    request_text: str | None = None,
    *,
    excerpts: bool = True,
    width: int = EXCERPT_CHARS,
) -> Divergence | None:
    """Where ``request_tokens`` leave ``learned_tokens``; None when the request holds the
    whole learned prefix (no divergence). The texts, when given, are the prompt texts the
    tokens came from (the request's may be longer than its part compared)."""
    token = _common_prefix(learned_tokens, request_tokens)
    if token == len(learned_tokens):
        return None
    n_learned, n_request = len(learned_tokens), len(request_tokens)
    if learned_text is None or request_text is None:
        cause = Cause.SHORTER if token == n_request else Cause.TEXT_CHANGED
        return Divergence(token, n_learned, n_request, cause)
    char = _common_prefix(learned_text, request_text)
    cause = Cause.SHORTER if token == n_request else _classify(learned_text, request_text, char)
    if not excerpts:
        return Divergence(token, n_learned, n_request, cause, char)
    return Divergence(
        token,
        n_learned,
        n_request,
        cause,
        char,
        shared=_shared_excerpt(learned_text, char, width),
        learned=_excerpt(learned_text, char, width),
        sent=_excerpt(request_text, char, width),
    )


@dataclass
class HarnessDivergences:
    """One harness's record: its last divergences and a count per cause since start."""

    recent: deque[Divergence]
    counts: Counter[Cause]

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": {
                c.value: n for c, n in sorted(self.counts.items(), key=lambda x: x[0].value)
            },
            "recent": [d.to_json() for d in self.recent],
        }


class DivergenceLog:
    """The last ``per_harness`` divergences of at most ``max_harnesses`` harnesses (least
    recently seen dropped first). Not thread-safe: one owner (the warmer's loop)."""

    def __init__(self, max_harnesses: int = 64, per_harness: int = 8, excerpts: bool = True):
        if max_harnesses < 1 or per_harness < 1:
            raise ValueError("max_harnesses and per_harness must be >= 1")
        self.max_harnesses = max_harnesses
        self.per_harness = per_harness
        self.excerpts = excerpts
        self._by_harness: OrderedDict[str, HarnessDivergences] = OrderedDict()
        self.total: Counter[Cause] = Counter()

    def record(self, harness: str, divergence: Divergence) -> None:
        key = harness[:_MAX_KEY_CHARS]
        if not self.excerpts:
            divergence = divergence.without_excerpts()
        entry = self._by_harness.get(key)
        if entry is None:
            entry = HarnessDivergences(deque(maxlen=self.per_harness), Counter())
            self._by_harness[key] = entry
            while len(self._by_harness) > self.max_harnesses:
                self._by_harness.popitem(last=False)
        else:
            self._by_harness.move_to_end(key)
        entry.recent.append(divergence)
        entry.counts[divergence.cause] += 1
        self.total[divergence.cause] += 1

    def get(self, harness: str) -> HarnessDivergences | None:
        return self._by_harness.get(harness[:_MAX_KEY_CHARS])

    def harnesses(self) -> list[str]:
        """Harness keys, least recently seen first."""
        return list(self._by_harness)

    def to_json(self) -> dict[str, Any]:
        return {
            "excerpts": self.excerpts,
            "counts": {c.value: n for c, n in sorted(self.total.items(), key=lambda x: x[0].value)},
            "harnesses": {h: e.to_json() for h, e in self._by_harness.items()},
        }
