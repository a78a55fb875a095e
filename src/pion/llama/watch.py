"""Why a request missed, per harness: each request compared with the prefix the same
harness key learned last (:mod:`pion.llama.divergence` says where and why).

Owns :class:`DivergenceWatch`: for each harness key (harness, endpoint, model) it keeps
the last learned prefix's tokens and the prompt text they came from, bounded (at most
:data:`MAX_KEYS` keys, least recently seen dropped; at most :data:`MAX_TOKENS` tokens and
:data:`MAX_TEXT` characters each: a client chooses its User-Agent and its body). A request
that does not hold the whole of it is recorded in a
:class:`~pion.llama.divergence.DivergenceLog` (counted per cause), logged, and shown in
``/pion/status`` (``divergence``) and ``pion llama status``; with excerpts off
(``--no-divergence-excerpts``) no prompt text is shown or logged (it is still compared, in
memory, to tell the cause). Runs on the warmer's loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from pion.llama.divergence import DivergenceLog, find_divergence

__all__ = ["MAX_KEYS", "MAX_TEXT", "MAX_TOKENS", "DivergenceWatch"]

MAX_KEYS = 16
# A learned prefix longer than this is compared on its first part only.
MAX_TOKENS = 65536
MAX_TEXT = 512 * 1024


class DivergenceWatch:
    """The last learned prefix per harness key, and where requests left it."""

    def __init__(self, log: Callable[[str], None], *, excerpts: bool = True) -> None:
        self._log = log
        self.excerpts = excerpts
        self.record = DivergenceLog(excerpts=excerpts)
        self._last: OrderedDict[str, tuple[tuple[int, ...], str | None]] = OrderedDict()

    def __call__(self, key: str, tokens: Sequence[int], text: str | None, learned: int) -> None:
        """A request of ``key`` with prompt ``tokens`` (rendered from ``text``) whose
        stable prefix is its first ``learned`` tokens."""
        previous = self._last.get(key)
        if previous is not None:
            held, held_text = previous
            found = find_divergence(
                held, tokens[: len(held) + 1], held_text, text, excerpts=self.excerpts
            )
            if found is not None:
                self.record.record(key, found)
                self._log(f"DIVERGED from the learned prefix ({key}): {found.summary()}")
        kept = tuple(tokens[: min(learned, MAX_TOKENS)])
        self._last[key] = (kept, text[:MAX_TEXT] if text is not None else None)
        self._last.move_to_end(key)
        while len(self._last) > MAX_KEYS:
            self._last.popitem(last=False)

    def holds(self, key: str, tokens: Sequence[int]) -> bool:
        """Whether ``key``'s last learned prefix is ``tokens``: a request that starts with
        them left nothing (the token cache skips the comparison then)."""
        previous = self._last.get(key)
        return previous is not None and previous[0] == tuple(tokens)

    def to_json(self) -> dict[str, Any]:
        return self.record.to_json()
