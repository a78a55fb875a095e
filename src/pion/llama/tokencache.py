"""What llama-server's tokenizer gave for a rendered prefix: a request whose rendering
starts with that prefix again is not tokenized again on its way.

Owns :class:`TokenCache`, :class:`LazyConversation` and :func:`prefix_chars`. A request
whose boundary is learned (:mod:`pion.llama.prompt`) costs ``/apply-template`` and then
``/tokenize`` of its whole rendering, every turn, before its slot is even chosen. The
stable prefix is the same text every turn: once its tokens are known, a rendering that
starts with that text is a hit without ``/tokenize``. The request's whole tokens (what a
restore picks a checkpoint by, what a checkpoint is checked against) are then asked for
only when that happens (:class:`LazyConversation`), off the hit path.

- **Keys**: SHA-256 of the upstream's identity (build, model path and file identity,
  :meth:`~pion.llama.serverinfo.ServerInfo.restore_key`: a restarted llama-server with
  another build or model never matches), the harness key (harness, endpoint, model) and
  the prefix text. Per (identity, harness key) the cache keeps the character lengths of
  the prefixes it holds (at most :data:`MAX_PREFIXES`, the learner's families), so a
  lookup hashes at most that many slices of the rendering, longest first.
- **Bounded**: least recently used first out, by bytes (:data:`MAX_BYTES`; 4 bytes a
  token plus :data:`ENTRY_OVERHEAD`), and by (identity, harness key) pairs
  (:data:`MAX_SCOPES`): the harness key comes from a header the client chooses.
- **Exactness**: a tokenizer may merge the last piece of the prefix with what follows it
  in another rendering. When the request's whole tokens are asked for later and do not
  start with the cached ones, the entry is dropped (:meth:`TokenCache.forget`); the
  request meanwhile reuses the slot up to where they part, as llama-server reuses any
  common prefix.

Runs on the warmer's event loop (not thread-safe). Imports nothing else of ``pion``; does
not own HTTP (:meth:`LazyConversation.tokens` asks the client it is given), nor learning
the boundary (:mod:`pion.llama.learn`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ENTRY_OVERHEAD",
    "MAX_BYTES",
    "MAX_PREFIXES",
    "MAX_SCOPES",
    "CachedPrefix",
    "LazyConversation",
    "TokenCache",
    "Tokenizer",
    "prefix_chars",
]

# Bytes of cached tokens, all entries together (4 bytes a token: 4M tokens).
MAX_BYTES = 16 * 1024 * 1024
# What an entry costs beside its tokens (its key, its length, the dict's slots): counted
# so that many tiny prefixes cannot grow the cache past its budget.
ENTRY_OVERHEAD = 256
# Prefixes remembered per (identity, harness key): the learner keeps as many families
# (pion.llama.learn.MAX_FAMILIES).
MAX_PREFIXES = 8
# (identity, harness key) pairs remembered.
MAX_SCOPES = 64
_TOKEN_BYTES = 4


class Tokenizer(Protocol):
    """What :class:`LazyConversation` asks (:class:`~pion.llama.client.AsyncLlamaClient`;
    a protocol, so that :mod:`pion.llama.prefix` may name this module without a cycle)."""

    async def tokenize(self, content: str, add_special: bool = False) -> list[int]: ...

    async def apply_template(self, body: Mapping[str, Any]) -> str: ...


@dataclass(frozen=True)
class CachedPrefix:
    """A rendering's first ``chars`` characters are the prefix of ``tokens``."""

    chars: int
    tokens: tuple[int, ...]


def _scope(identity: str, key: str) -> str:
    return hashlib.sha256(f"{identity}\0{key}".encode()).hexdigest()


def _digest(scope: str, text: str) -> str:
    return hashlib.sha256(
        scope.encode() + b"\0" + text.encode("utf-8", "surrogatepass")
    ).hexdigest()


class TokenCache:
    """Token prefixes of renderings, by (identity, harness key, prefix text)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        if max_bytes < ENTRY_OVERHEAD:
            raise ValueError(f"max_bytes must be >= {ENTRY_OVERHEAD}")
        self.max_bytes = max_bytes
        # digest → (scope, chars, tokens), least recently used first.
        self._entries: OrderedDict[str, tuple[str, int, array[int]]] = OrderedDict()
        # scope → the character lengths of its entries, least recently used first.
        self._lengths: OrderedDict[str, list[int]] = OrderedDict()
        self._bytes = 0

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, identity: str, key: str, text: str) -> CachedPrefix | None:
        """The longest cached prefix ``text`` starts with, for ``key`` on ``identity``."""
        scope = _scope(identity, key)
        lengths = self._lengths.get(scope)
        if not lengths:
            return None
        for chars in sorted(set(lengths), reverse=True):
            if chars > len(text):
                continue
            digest = _digest(scope, text[:chars])
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
                self._lengths.move_to_end(scope)
                return CachedPrefix(chars, tuple(entry[2]))
        return None

    def put(self, identity: str, key: str, text: str, tokens: Sequence[int]) -> None:
        """Remember that ``text`` (a rendering's start) tokenizes to ``tokens`` on
        ``identity``."""
        scope = _scope(identity, key)
        digest = _digest(scope, text)
        self._drop(digest)
        try:
            toks = array("i", tokens)
        except OverflowError:  # ids beyond int32 do not occur in real vocabularies
            return
        cost = len(toks) * _TOKEN_BYTES + ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return
        lengths = self._lengths.setdefault(scope, [])
        self._lengths.move_to_end(scope)
        lengths.append(len(text))
        self._entries[digest] = (scope, len(text), toks)
        self._bytes += cost
        while len(lengths) > MAX_PREFIXES:
            self._drop(_digest_for(self._entries, scope, lengths[0]))
        while len(self._lengths) > MAX_SCOPES:
            oldest = next(iter(self._lengths))
            for digest_old in [d for d, e in self._entries.items() if e[0] == oldest]:
                self._drop(digest_old)
            self._lengths.pop(oldest, None)
        while self._bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def forget(self, identity: str, key: str, text: str) -> None:
        """Drop the entry of prefix ``text`` (its tokens proved not to be the rendering's)."""
        self._drop(_digest(_scope(identity, key), text))

    def _drop(self, digest: str | None) -> None:
        entry = self._entries.pop(digest, None) if digest is not None else None
        if entry is None:
            return
        scope, chars, toks = entry
        self._bytes -= len(toks) * _TOKEN_BYTES + ENTRY_OVERHEAD
        lengths = self._lengths.get(scope)
        if lengths is not None:
            if chars in lengths:
                lengths.remove(chars)
            if not lengths:
                del self._lengths[scope]


def _digest_for(
    entries: OrderedDict[str, tuple[str, int, array[int]]], scope: str, chars: int
) -> str | None:
    """The digest of ``scope``'s entry of ``chars`` characters (None: not held)."""
    return next((d for d, e in entries.items() if e[0] == scope and e[1] == chars), None)


def prefix_chars(text: str, pieces: Sequence[bytes], n: int) -> int | None:
    """The characters of ``text`` that its first ``n`` tokens stand for, from the pieces
    ``/tokenize`` gave for it (``with_pieces``); None when the pieces do not spell
    ``text`` or the ``n``-th token ends inside a character. A BOS token first is not in
    the text, nor is the space a SentencePiece tokenizer puts before its first piece
    (llama's ``add_space_prefix``)."""
    data = text.encode("utf-8", "surrogatepass")
    for skip, space in ((0, 0), (1, 0), (0, 1), (1, 1)):
        spelled = b"".join(pieces[skip:])
        if n > skip and spelled[:space] == b" " * space and spelled[space:] == data:
            break
    else:
        return 0 if n == 0 else None
    end = sum(len(p) for p in pieces[skip:n]) - space
    try:
        return len(data[:end].decode("utf-8"))
    except UnicodeDecodeError:
        return None


@dataclass(eq=False)
class LazyConversation:
    """A request's whole tokens, asked for once, when something needs them (a restore
    looks for a checkpoint, a checkpoint is checked against them): the rendering
    ``text`` of a request whose prefix came from the :class:`TokenCache`, or the ``chat``
    body of a Pi-marker request (text mode: its prefix is text, nothing was rendered).
    ``identity``: the server the prefix was cached for (None: not from the cache).
    ``mismatch`` is called when they do not start with the cached ``prefix`` (the entry is
    then dropped)."""

    text: str | None
    prefix: tuple[int, ...] = ()
    identity: str | None = None
    mismatch: Callable[[], None] | None = None
    chat: Mapping[str, Any] | None = None
    _tokens: tuple[int, ...] | None = None

    async def tokens(self, client: Tokenizer) -> tuple[int, ...]:
        """The rendering's tokens, as ``/tokenize`` gives them (asked once; the chat body
        rendered by ``/apply-template`` first). Raises
        :class:`~pion.llama.client.LlamaServerError`."""
        if self._tokens is None:
            text = self.text
            if text is None:
                text = await client.apply_template(self.chat or {})
            tokens = tuple(await client.tokenize(text, True))
            if tokens[: len(self.prefix)] != self.prefix and self.mismatch is not None:
                self.mismatch()
            self._tokens = tokens
        return self._tokens
