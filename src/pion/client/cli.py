"""``pion stats``: the value receipt (PION.STATS) and registry state (KV.PREFIX.INFO)
of a running server, as a table or JSON."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from pion.client.cache import PionPromptCache
from pion.client.errors import PionClientError

__all__ = ["fetch_stats", "stats_command"]


def fetch_stats(pc: PionPromptCache) -> dict[str, dict[str, int | float | str]]:
    """``{"receipt": PION.STATS fields, "registry": KV.PREFIX.INFO fields}``."""
    return {"receipt": dict(pc.stats()), "registry": pc.info()}


def _table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in rows:
        table.add_row(key, value)
    return table


@click.command(name="stats")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=1974, show_default=True, type=int)
@click.option("--password", default=None, envvar="PION_PASSWORD", help="AUTH password.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def stats_command(host: str, port: int, password: str | None, as_json: bool) -> None:
    """Show what the cache saved (PION.STATS) and what it holds (KV.PREFIX.INFO)."""
    try:
        with PionPromptCache(host, port, password=password, timeout=10) as pc:
            data = fetch_stats(pc)
    except (PionClientError, OSError) as exc:
        raise click.ClickException(f"{host}:{port}: {exc}") from None
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    rec = data["receipt"]
    hits = int(rec.get("kvprefix_hits", 0))
    measured = int(rec.get("kvprefix_hits_measured", 0))
    saved_us = int(rec.get("kvprefix_prefill_us_saved", 0))
    measured_us = int(rec.get("kvprefix_prefill_us_measured", 0))
    summary = [
        ("worker", str(rec.get("worker_id", 0))),
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
    registry = [(k, str(v)) for k, v in data["registry"].items()]
    console.print(_table("Registry (KV.PREFIX.INFO)", registry))
