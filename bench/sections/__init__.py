"""The sections of BENCHMARKS.md: one renderer per question a user asks, each reading
the JSON result(s) of the benchmark(s) that answer it (see ``report.py``).

A renderer is a function ``(results) -> Section`` (:mod:`sections._base`): a table, a
matplotlib figure, and a ``losses`` paragraph computed from the figures themselves (a
ratio below the baseline is named with its value, never hidden). Put it in the module
its question belongs to (or a new one here), importing only :mod:`sections._base` and
:mod:`sections._text`, and add one line for it to ``SECTIONS`` in ``report.py``: the
report follows that list (the server against redis-server first, then durability and
memory, then what the cache buys). Importing this package registers nothing.
"""
