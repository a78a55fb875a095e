"""The sections of BENCHMARKS.md: one renderer per question a user asks, each reading
the JSON result(s) of the benchmark(s) that answer it (see ``report.py``).

A renderer returns a :class:`report.Section`: a table, a matplotlib figure, and a
``losses`` paragraph computed from the figures themselves (a ratio below the baseline
is named with its value, never hidden). Add one with ``@renderer("<result name>")`` in
the module its question belongs to; the report follows the order of registration:
the server against redis-server first, then durability and memory, then what the
cache buys.
"""

from __future__ import annotations

from sections import durability, fairness, features, real, server

__all__ = ["durability", "fairness", "features", "real", "server"]
