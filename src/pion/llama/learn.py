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

Memory is bounded whatever clients send (the harness key comes from a header the client
chooses): families are few per key (:data:`MAX_FAMILIES`), keys are few
(:data:`MAX_KEYS`, least recently used first out), and all families together hold at most
``max_bytes`` of tokens (4 bytes each, in ``array("i")``): over it, the oldest families
of the least recently used keys go first, and a single prompt larger than the whole
budget is kept only up to a quarter of it (its head is what a prefix is). Thread-safe.
Does not own tokenizing (the proxy asks llama-server) or files.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "MAX_BYTES",
    "MAX_FAMILIES",
    "MAX_KEYS",
    "BoundaryLearner",
    "Learned",
    "common_prefix",
]

# Distinct stable prefixes remembered per harness key (a main agent, a title generator,
# a sub-agent...).
MAX_FAMILIES = 8
# Harness keys remembered.
MAX_KEYS = 64
# Bytes of learned tokens, all keys together (4 bytes a token: 8M tokens).
MAX_BYTES = 32 * 1024 * 1024
_TOKEN_BYTES = 4

# array("i") of token ids (a string: array is generic for type checkers only before 3.12).
Family: TypeAlias = "array[int]"


def _block(seq: Sequence[int], i: int, j: int) -> Sequence[int]:
    part = seq[i:j]
    # Only like compares with like: an array slice never equals a list or tuple slice.
    return part if isinstance(part, list | array) else list(part)


def _as_family(tokens: Sequence[int]) -> Family:
    if isinstance(tokens, array) and tokens.typecode == "i":
        return array("i", tokens.tobytes())  # a copy without an int object per token
    try:
        return array("i", tokens)
    except OverflowError:  # ids beyond int32 do not occur in real vocabularies
        return array("q", tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts of 20k tokens share most of their length.
    step = 256
    same_kind = type(a) is type(b) and (
        not isinstance(a, array) or a.typecode == b.typecode  # type: ignore[attr-defined]
    )
    if same_kind:
        while i + step <= n and a[i : i + step] == b[i : i + step]:
            i += step
    else:
        while i + step <= n and list(_block(a, i, i + step)) == list(_block(b, i, i + step)):
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
    """Learned stable prefixes, per harness key, within a memory budget."""

    def __init__(
        self,
        min_tokens: int = 32,
        min_share: float = 0.5,
        *,
        max_keys: int = MAX_KEYS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        if max_keys < 1 or max_bytes < _TOKEN_BYTES * 4:
            raise ValueError("max_keys must be >= 1 and max_bytes >= 16")
        self.min_tokens = min_tokens
        self.min_share = min_share
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._keys: OrderedDict[str, list[Family]] = OrderedDict()
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
        toks = _as_family(tokens)
        with self._lock:
            families = self._families(key)
            best, at = 0, -1
            for i, family in enumerate(families):
                shared = common_prefix(family, toks)
                if self._fits(shared, len(family)) and shared > best:
                    best, at = shared, i
            if at >= 0:
                families.pop(at)
                families.insert(0, toks[:best])
                self._trim()
                return Learned(best, "learned")
        # Outside the lock: seeds may read files.
        found = Learned(len(toks), "new")
        best = 0
        for seed in seeds() if seeds is not None else ():
            shared = common_prefix(seed, toks)
            if self._fits(shared, len(toks)) and shared > best:
                best, found = shared, Learned(shared, "seeded")
        with self._lock:
            families = self._families(key)
            families.insert(0, toks[: found.tokens])
            del families[MAX_FAMILIES:]
            self._trim()
        return found

    def reuse(self, key: str, tokens: Sequence[int]) -> bool:
        """Whether ``tokens`` are one of ``key``'s families and none of the others starts
        with them: then a request that starts with them gets exactly them as its boundary
        (what :meth:`boundary` would say with the request's whole tokens), and the family
        becomes the most recent without them (the token cache, :mod:`pion.llama.tokencache`)."""
        toks = _as_family(tokens)
        with self._lock:
            families = self._keys.get(key)
            if not families:
                return False
            at = next((i for i, f in enumerate(families) if f == toks), -1)
            if at < 0:
                return False
            n = len(toks)
            if any(len(f) > n and f[:n] == toks for f in families):
                return False
            families.insert(0, families.pop(at))
            self._keys.move_to_end(key)
            return True

    def _families(self, key: str) -> list[Family]:
        """``key``'s families, the key now the most recently used (lock held)."""
        families = self._keys.setdefault(key, [])
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return families

    def _trim(self) -> None:
        """Drop families until the budget holds: the least recently used key's oldest
        first; the one family left cut to a quarter of the budget (lock held)."""
        total = self.bytes_used_locked()
        while total > self.max_bytes and self._keys:
            key, families = next(iter(self._keys.items()))
            if len(self._keys) == 1 and len(families) == 1:
                keep = self.max_bytes // (4 * _TOKEN_BYTES)
                total -= (len(families[0]) - keep) * families[0].itemsize
                families[0] = families[0][:keep]
                break
            total -= len(families[-1]) * families[-1].itemsize
            families.pop()
            if not families:
                del self._keys[key]

    def bytes_used_locked(self) -> int:
        return sum(len(f) * f.itemsize for fams in self._keys.values() for f in fams)

    def bytes_used(self) -> int:
        """Bytes of tokens held (status, tests)."""
        with self._lock:
            return self.bytes_used_locked()

    def keys(self) -> list[str]:
        """Harness keys held, least recently used first."""
        with self._lock:
            return list(self._keys)

    def families(self, key: str) -> list[int]:
        """The token counts of ``key``'s families, most recent first (status, tests)."""
        with self._lock:
            return [len(f) for f in self._keys.get(key, [])]
