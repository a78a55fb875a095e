"""A background thread for store work that no request should wait for (and, a second
one, for slot saves after a request).

Owns :class:`Background`: pushes of freshly saved slot files and receipt reports run here,
one at a time, in submission order, so a slow or dead store never delays a session start
(only a pull, which a request waits for by nature, runs in the request's thread). The
queue is bounded (:data:`MAX_PENDING`); when it is full a job is dropped, logged and
counted rather than held in memory. A job that raises is logged and reported to
:attr:`Background.on_failure` (its traceback at debug level, a count in the status); the
thread goes on.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_PENDING", "Background"]

# Jobs waiting at most: a store that is down for minutes while sessions keep starting
# must not grow the proxy's memory.
MAX_PENDING = 256

_Job = tuple[str, Callable[[], object]]


class Background:
    """One daemon worker thread; :meth:`flush` waits for the jobs submitted so far."""

    def __init__(
        self, log: Callable[[str], None], name: str = "pion-llama-store", word: str = "STORE"
    ) -> None:
        self._log = log
        self._word = word  # what the log lines of its jobs start with
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=MAX_PENDING)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.dropped = 0
        # Told about every job that raised (the warmer counts it; see context.failure).
        self.on_failure: Callable[[str, BaseException], None] | None = None
        self._thread.start()

    def submit(self, what: str, job: Callable[[], object]) -> bool:
        """Queue ``job``; False (logged) when the queue is full."""
        try:
            self._jobs.put_nowait((what, job))
        except queue.Full:
            self.dropped += 1
            self._log(f"{self._word} {what} dropped: {MAX_PENDING} jobs already waiting")
            return False
        return True

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every job submitted before this call has run; False on timeout."""
        done = threading.Event()
        deadline = time.monotonic() + timeout
        try:
            self._jobs.put(("flush", done.set), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued jobs (within ``timeout``) and stop the thread."""
        try:
            self._jobs.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            what, job = item
            try:
                job()
            except Exception as exc:
                # Fail-open: a failed push or report is logged, counted and forgotten.
                self._log(f"{self._word} {what} failed (fail-open): {exc}")
                if self.on_failure is not None:
                    self.on_failure(f"background {what.split()[0]}", exc)
