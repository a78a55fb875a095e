"""``pion stats``: the value receipt (PION.STATS) and registry state (KV.PREFIX.INFO)
of a running server, as a table or JSON.

Under ``-w N`` each worker keeps its own receipt and store, and a connection to the
main port reaches one of them at random. So the command asks the server how many
workers it runs (``workers`` in ``INFO server``), reads each one on its affinity port
(``port + 2 + i``) and shows their sum; ``--per-worker`` adds a row per worker.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import click
import redis
from rich.console import Console
from rich.table import Table

from pion.client.cache import PionPromptCache
from pion.client.errors import PionClientError
from pion.wire import affinity_port

__all__ = ["fetch_stats", "merge_stats", "stats_command"]

Fields = dict[str, int | float | str]
Stats = dict[str, Fields]

# Fields that describe the server rather than count something: every worker reports
# the same value (or its own id, dropped from the sum).
_SAME_ON_EVERY_WORKER = frozenset({"wal_enabled", "directory_enabled", "directory_entries"})
_PER_WORKER_ONLY = frozenset({"worker_id", "my_worker_id"})


def fetch_stats(pc: PionPromptCache) -> Stats:
    """``{"receipt": PION.STATS fields, "registry": KV.PREFIX.INFO fields}``."""
    return {"receipt": dict(pc.stats()), "registry": pc.info()}


def _merge(parts: Sequence[Mapping[str, int | float | str]]) -> Fields:
    out: Fields = {}
    for part in parts:
        for key, value in part.items():
            if key in _PER_WORKER_ONLY:
                continue
            if key not in out:
                out[key] = value
            elif key == "uptime_in_seconds":
                out[key] = max(out[key], value)
            elif key in _SAME_ON_EVERY_WORKER or isinstance(value, str):
                continue
            else:
                previous = out[key]
                assert not isinstance(previous, str)
                out[key] = previous + value
    # Recomputed from the summed microseconds, not summed (rounding).
    for seconds, us in (
        ("prefill_seconds_avoided", "kvprefix_prefill_us_saved"),
        ("prefill_seconds_avoided_measured", "kvprefix_prefill_us_measured"),
    ):
        if seconds in out and isinstance(out.get(us), int):
            out[seconds] = round(int(out[us]) / 1e6, 3)
    return out


def merge_stats(workers: Sequence[Stats]) -> Stats:
    """The server's figures from each worker's: counters summed, the uptime the
    longest, fields every worker shares taken once, worker ids left out."""
    return {
        "receipt": _merge([w["receipt"] for w in workers]),
        "registry": _merge([w["registry"] for w in workers]),
    }


def _worker_count(host: str, port: int, password: str | None) -> int:
    """``workers`` from ``INFO server`` (1 for a server that does not report it)."""
    r = redis.Redis(host=host, port=port, password=password, socket_timeout=10)
    try:
        return int(r.info("server").get("workers", 1))
    finally:
        r.close()


def _read(host: str, port: int, password: str | None) -> Stats:
    with PionPromptCache(host, port, password=password, timeout=10) as pc:
        return fetch_stats(pc)


def _table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _per_worker_table(workers: Sequence[Stats]) -> Table:
    table = Table(title="Per worker", title_justify="left")
    columns = (
        ("worker", "receipt", "worker_id"),
        ("hits", "receipt", "kvprefix_hits"),
        ("misses", "receipt", "kvprefix_misses"),
        ("tokens served", "receipt", "kvprefix_tokens_served"),
        ("prefill saved (s)", "receipt", "prefill_seconds_avoided"),
        ("prefixes", "registry", "registered_prefixes"),
        ("sessions", "registry", "vstore_sessions"),
        ("V-store bytes", "registry", "vstore_bytes"),
    )
    for name, _, _ in columns:
        table.add_column(name, justify="right")
    for w in workers:
        table.add_row(*(str(w[part].get(key, "")) for _, part, key in columns))
    return table


@click.command(name="stats")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=1974, show_default=True, type=int)
@click.option("--password", default=None, envvar="PION_PASSWORD", help="AUTH password.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--per-worker", is_flag=True, help="Under -w N, show each worker's figures too.")
def stats_command(
    host: str, port: int, password: str | None, as_json: bool, per_worker: bool
) -> None:
    """Show what the cache saved (PION.STATS) and what it holds (KV.PREFIX.INFO),
    summed over every worker of the server."""
    try:
        count = _worker_count(host, port, password)
        if count <= 1:
            workers = [_read(host, port, password)]
        else:
            workers = [_read(host, affinity_port(port, i), password) for i in range(count)]
    except (PionClientError, redis.RedisError, OSError) as exc:
        raise click.ClickException(f"{host}:{port}: {exc}") from None
    data: dict[str, object] = {"workers": count, **merge_stats(workers)}
    if per_worker:
        data["per_worker"] = workers
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rec = merge_stats(workers)["receipt"]
    hits = int(rec.get("kvprefix_hits", 0))
    measured = int(rec.get("kvprefix_hits_measured", 0))
    saved_us = int(rec.get("kvprefix_prefill_us_saved", 0))
    measured_us = int(rec.get("kvprefix_prefill_us_measured", 0))
    summary = [
        ("workers", str(count)),
        ("uptime (s)", str(rec.get("uptime_in_seconds", 0))),
        ("hits / misses", f"{hits} / {rec.get('kvprefix_misses', 0)}"),
        ("tokens served", str(rec.get("kvprefix_tokens_served", 0))),
        ("prefill saved, measured", f"{measured_us / 1e6:.3f} s over {measured} hits"),
        (
            "prefill saved, estimated",
            f"{(saved_us - measured_us) / 1e6:.3f} s over {hits - measured} hits",
        ),
        ("prefill saved, total", f"{saved_us / 1e6:.3f} s"),
    ]
    console = Console()
    console.print(_table("Value receipt (PION.STATS)", summary))
    registry = [(k, str(v)) for k, v in merge_stats(workers)["registry"].items()]
    console.print(_table("Registry (KV.PREFIX.INFO)", registry))
    if per_worker:
        console.print(_per_worker_table(workers))
