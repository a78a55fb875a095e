"""The ``[prefix-cache]`` log: one line per event, in pi-prefix-cache's vocabulary.

Owns writing lines to the log file (pi-prefix-cache writes there, never to stdout: a harness's
fullscreen TUI would paint console output over its input area), keeping the last lines in
memory for the status endpoint, and mirroring them to the ``pion.llama`` stdlib logger.
Lines look like ``2026-10-09T14:03:00.123Z [prefix-cache] cache=MISS → warming slot=0 (cold)``.

Does not own what is logged (the warmer and proxy decide). Writing never raises: a log that
cannot be written must not break a request (fail-open).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path

__all__ = ["TAG", "EventLog"]

TAG = "[prefix-cache]"

_logger = logging.getLogger("pion.llama")


class EventLog:
    """Appends ``[prefix-cache]`` lines to a file (or nowhere) and remembers the last ones."""

    def __init__(self, path: Path | None, keep: int = 200) -> None:
        self.path = path
        self._recent: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._broken = False

    def __call__(self, message: str) -> None:
        """Log one event."""
        now = time.time()
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        )
        line = f"{stamp} {TAG} {message}"
        _logger.info("%s %s", TAG, message)
        with self._lock:
            self._recent.append(line)
            if self.path is None or self._broken:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
            except OSError as exc:
                # Say it once through stdlib logging, then stop trying.
                self._broken = True
                _logger.warning("%s cannot write log file %s: %s", TAG, self.path, exc)

    def recent(self) -> list[str]:
        """The last lines, oldest first."""
        with self._lock:
            return list(self._recent)
