"""What one :meth:`PrefixWarmer.ensure` call did, in pi-prefix-cache's words.

Owns :class:`Outcome` and its one-line summary (pi-prefix-cache's TUI notification, which we log):

- ``WARM — slot already hot``                         in-process hit, slot checked alive
- ``WARM — restored 2335 tok from disk (1453 ms)``    restore (verified, or verifying);
  ``from the store`` when the file was pulled from the shared store first
- ``COLD — warmed 2335 tok, checkpoint saved``        cold warm-up (+ save when persisting)
- ``WARM — restored 2300 of 2335 tok from pi-prefix-….bin, warmed the rest, checkpoint
  saved``                                             a saved prefix that shares most of
  this one was restored first; the warm-up computed only the rest
- ``disabled this session (fail-open): <error>``      anything failed; the request proceeds
- ``skipped (<reason>)``                              no warmable prefix in the request
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = ["WARM_KINDS", "Outcome", "OutcomeKind"]

OutcomeKind = Literal["hit", "restored", "partial", "cold", "disabled", "skipped"]

# The kinds after which the slot holds the request's prefix.
WARM_KINDS = frozenset({"hit", "restored", "partial", "cold"})

_SOURCES = {"hit": "hit", "restored": "restore", "partial": "restore", "cold": "warm-up"}


@dataclass(frozen=True)
class Outcome:
    """The result of ensuring one prefix in one slot."""

    kind: OutcomeKind
    fingerprint: str = ""
    slot: int = 0
    tokens: int = 0
    ms: float = 0.0
    file: str | None = None
    # Where a restored file came from: "disk", or "store" (pulled first).
    tier: str = "disk"
    saved: bool = False
    # Fast path: the restore is verified by the real request's own timings.
    pending_verify: bool = False
    # "partial": tokens of the restored file the prefix shares.
    shared: int = 0
    detail: str = ""
    at: float = 0.0

    @property
    def source(self) -> str:
        """pi-prefix-cache's ``source=`` word: hit, restore, warm-up, or none."""
        return _SOURCES.get(self.kind, "none")

    def summary(self) -> str:
        if self.kind == "hit":
            return "WARM — slot already hot"
        if self.kind == "restored":
            tail = ", verifying on the real request" if self.pending_verify else ""
            where = "the store" if self.tier == "store" else "disk"
            return f"WARM — restored {self.tokens} tok from {where} ({self.ms:.0f} ms{tail})"
        if self.kind == "partial":
            saved = "checkpoint saved" if self.saved else "not saved"
            return (
                f"WARM — restored {self.shared} of {self.tokens} tok from {self.file}, "
                f"warmed the rest, {saved} ({self.ms:.0f} ms)"
            )
        if self.kind == "cold":
            saved = "checkpoint saved" if self.saved else "not saved"
            return f"COLD — warmed {self.tokens} tok, {saved} ({self.ms:.0f} ms)"
        if self.kind == "disabled":
            return f"disabled this session (fail-open): {self.detail}"
        return f"skipped ({self.detail})"

    def to_json(self) -> dict[str, Any]:
        # Shallow (every field is a scalar): /pion/status renders 50 of these per request.
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "summary": self.summary()}
