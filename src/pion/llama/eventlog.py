"""The ``[prefix-cache]`` log: one line per event, in pi-prefix-cache's vocabulary.

Owns writing lines to the log file (pi-prefix-cache writes there, never to stdout: a harness's
fullscreen TUI would paint console output over its input area), keeping the last lines in
memory for the status endpoint, and mirroring them to the ``pion.llama`` stdlib logger.
Lines look like ``2026-10-09T14:03:00.123Z [prefix-cache] cache=MISS → warming slot=0 (cold)``.

Does not own what is logged (the warmer and proxy decide). Writing never raises: a log that
cannot be written must not break a request (fail-open). The file is written by a daemon
thread, never by the caller: the warmer logs from the proxy's event loop, which must not
wait on a disk; :meth:`EventLog.flush` waits for the lines logged so far.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from pathlib import Path

__all__ = ["TAG", "EventLog"]

TAG = "[prefix-cache]"

_logger = logging.getLogger("pion.llama")


# Lines written per open of the log file, at most.
_BATCH = 512


class EventLog:
    """Appends ``[prefix-cache]`` lines to a file (or nowhere) and remembers the last ones."""

    def __init__(self, path: Path | None, keep: int = 200) -> None:
        self.path = path
        self._recent: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._broken = False
        self._lines: queue.SimpleQueue[str | threading.Event] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None

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
            self._start()
        self._lines.put(line)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the lines logged so far are written (or given up on)."""
        with self._lock:
            if self._writer is None:
                return True
        done = threading.Event()
        self._lines.put(done)
        return done.wait(timeout)

    def _start(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="pion-llama-log", daemon=True)
            self._writer.start()

    def _write(self) -> None:
        while True:
            batch = [self._lines.get()]
            # What queued meanwhile goes in the same open: a burst of requests logs
            # thousands of lines, and each open holds the GIL from the event loop.
            with contextlib.suppress(queue.Empty):
                while len(batch) < _BATCH:
                    batch.append(self._lines.get_nowait())
            lines = [item for item in batch if isinstance(item, str)]
            if lines and not self._broken and self.path is not None:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    with self.path.open("a", encoding="utf-8") as f:
                        f.write("".join(line + "\n" for line in lines))
                except OSError as exc:
                    # Say it once through stdlib logging, then stop trying.
                    self._broken = True
                    _logger.warning("%s cannot write log file %s: %s", TAG, self.path, exc)
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()

    def recent(self) -> list[str]:
        """The last lines, oldest first."""
        with self._lock:
            return list(self._recent)
