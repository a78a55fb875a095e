"""``pion stats``: the value receipt (PION.STATS) and registry state (KV.PREFIX.INFO)
of a running server, as a table or JSON."""

from __future__ import annotations

import json
from typing import Any

import click
import redis
from rich.console import Console
from rich.table import Table

__all__ = ["fetch_stats", "stats_command"]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _number(text: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def fetch_stats(r: redis.Redis) -> dict[str, dict[str, int | float | str]]:
    """``{"receipt": PION.STATS fields, "registry": KV.PREFIX.INFO fields}``."""
    raw = r.execute_command("PION.STATS")  # type: ignore[no-untyped-call]
    if isinstance(raw, dict):
        items = list(raw.items())
    else:
        items = list(zip(raw[::2], raw[1::2], strict=True))
    receipt = {_text(k): _number(_text(v)) for k, v in items}
    info = _text(r.execute_command("KV.PREFIX.INFO"))  # type: ignore[no-untyped-call]
    registry: dict[str, int | float | str] = {}
    for line in info.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            registry[key] = _number(value)
    return {"receipt": receipt, "registry": registry}


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
    r = redis.Redis(host=host, port=port, password=password, socket_timeout=10)
    try:
        data = fetch_stats(r)
    except redis.RedisError as exc:
        raise click.ClickException(f"{host}:{port}: {exc}") from None
    finally:
        r.close()
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
