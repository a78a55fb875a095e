"""The stable prefix learned from what successive requests share, in llama-server's tokens.

Owns :class:`BoundaryLearner` and :func:`common_prefix`. Where no harness marker applies
(Claude Code, Codex, raw completions, any chat without Pi's markers), the boundary between
what stays and what varies is learned: for one harness key (harness, endpoint, model) the
learner keeps a few *families*, each the token prefix that the requests seen so far share.

- A request whose tokens share at least :attr:`BoundaryLearner.min_tokens` and at least
  :attr:`BoundaryLearner.min_share` of a family's tokens belongs to it, and the family
  shrinks to the shared part: a date, a folder, a prompt after it no longer moves it. The
  next turn of one conversation extends the previous prompt, so it leaves the family as is.
- A request that fits no family starts one: the prefix shared with the nearest saved slot
  file of the same key (``seeds``: what earlier runs learned and saved), or else its whole
  prompt (warming it costs nothing: the real request then reuses all of it; the next
  session with another prompt shrinks it).

Families are few per key (:data:`MAX_FAMILIES`) and least recently used ones go. Thread-
safe. Does not own tokenizing (the proxy asks llama-server) or files.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["MAX_FAMILIES", "BoundaryLearner", "Learned", "common_prefix"]

# Distinct stable prefixes remembered per harness key (a main agent, a title generator,
# a sub-agent...).
MAX_FAMILIES = 8
# Harness keys remembered.
MAX_KEYS = 64


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts of 20k tokens share most of their length.
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Learned:
    """The boundary for one request: ``tokens`` of the request are the stable prefix.
    ``how``: ``learned`` (a family shrank or held), ``seeded`` (from a saved file),
    ``new`` (the whole prompt: nothing to learn from yet)."""

    tokens: int
    how: str


class BoundaryLearner:
    """Learned stable prefixes, per harness key."""

    def __init__(self, min_tokens: int = 32, min_share: float = 0.5) -> None:
        self.min_tokens = min_tokens
        self.min_share = min_share
        self._keys: OrderedDict[str, list[tuple[int, ...]]] = OrderedDict()
        self._lock = threading.Lock()

    def _fits(self, shared: int, family: int) -> bool:
        return shared >= self.min_tokens and shared >= self.min_share * family

    def boundary(
        self,
        key: str,
        tokens: Sequence[int],
        seeds: Callable[[], Iterable[Sequence[int]]] | None = None,
    ) -> Learned:
        """Where ``tokens`` (a request of harness ``key``) stop being stable; updates
        what is learned."""
        toks = tuple(tokens)
        with self._lock:
            families = self._keys.setdefault(key, [])
            self._keys.move_to_end(key)
            while len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)
            best, at = 0, -1
            for i, family in enumerate(families):
                shared = common_prefix(family, toks)
                if self._fits(shared, len(family)) and shared > best:
                    best, at = shared, i
            if at >= 0:
                families.pop(at)
                families.insert(0, toks[:best])
                return Learned(best, "learned")
        # Outside the lock: seeds may read files.
        found = Learned(len(toks), "new")
        best = 0
        for seed in seeds() if seeds is not None else ():
            shared = common_prefix(seed, toks)
            if self._fits(shared, len(toks)) and shared > best:
                best, found = shared, Learned(shared, "seeded")
        with self._lock:
            families = self._keys.setdefault(key, [])
            families.insert(0, toks[: found.tokens])
            del families[MAX_FAMILIES:]
        return found

    def families(self, key: str) -> list[int]:
        """The token counts of ``key``'s families, most recent first (status, tests)."""
        with self._lock:
            return [len(f) for f in self._keys.get(key, [])]
