"""`pion llama ...`: the command-line face of :mod:`pion.llama` (a click group).

Thin by design: each command parses flags, builds a
:class:`~pion.llama.config.WarmerConfig` (flags win over ``PI_PREFIX_CACHE_*`` env vars) and
calls library code.

- ``proxy``  run the OpenAI-compatible proxy (:mod:`pion.llama.proxy`)
- ``warm``   pre-warm a system prompt into the slot (and disk), e.g. from a boot script
- ``status`` slots, fingerprints, slot files and last outcomes
- ``gc``     apply the slot-file budget (count and bytes) to a slot dir
- ``serve``  llama-server and the proxy as one command (:mod:`pion.llama.serve_cli`)

The top-level ``pion`` CLI registers :func:`llama_group`; ``python -m pion.llama.cli`` runs it
standalone.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console
from rich.table import Table

from pion.llama.client import LlamaClient, LlamaServerError
from pion.llama.config import WarmerConfig
from pion.llama.configfile import config_option
from pion.llama.index import SlotIndex
from pion.llama.outcome import Outcome
from pion.llama.prefix import WarmRequest, split_prefix
from pion.llama.proxy import STATUS_PATH, serve
from pion.llama.serve_cli import serve_command
from pion.llama.slots import parse_slots
from pion.llama.storelist import print_store_listing, store_listing
from pion.llama.warmer import PrefixWarmer

__all__ = ["llama_group", "main"]

F = TypeVar("F", bound=Callable[..., Any])


# Flags shared by proxy and warm; each defaults to its PI_PREFIX_CACHE_* env var.
_WARMER_OPTIONS = [
    click.option(
        "--upstream",
        multiple=True,
        help="llama-server URL [env PI_PREFIX_CACHE_BASE_URL]; proxy: repeat it for "
        "several llama-servers",
    ),
    click.option("--slot", type=int, help="slot holding the prefix [PI_PREFIX_CACHE_SLOT]"),
    click.option("--persist/--no-persist", default=None, help="save/restore on disk [..._PERSIST]"),
    click.option(
        "--slot-dir",
        multiple=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="llama-server's --slot-save-path [..._SLOT_DIR]; proxy: one per --upstream",
    ),
    click.option("--log", "log_path", type=click.Path(path_type=Path), help="[..._LOG]"),
    click.option("--server-id", help="bump to force a clean rebuild [..._SERVER_ID]"),
    click.option("--verify", type=click.Choice(["fast", "probe"]), help="[PI_PREFIX_CACHE_VERIFY]"),
    click.option("--max-files", type=int, help="slot files kept [..._MAX_FILES]"),
    click.option("--max-bytes", type=int, help="bytes of slot files kept [..._MAX_BYTES]"),
    click.option("--harness", help="harness id in the fingerprint [..._HARNESS]"),
    click.option("--api-key", help="llama-server --api-key for warm-ups [..._API_KEY]"),
    click.option(
        "--keep-billing-header/--strip-billing-header",
        default=None,
        help="leave Claude Code's x-anthropic-billing-header system block in /v1/messages "
        "requests (default: removed) [..._KEEP_BILLING_HEADER]",
    ),
    click.option(
        "--slots",
        "slots_spec",
        help="several prefixes, one per slot: ids like 0,1,2 or 'all' [..._SLOTS]",
    ),
    click.option(
        "--store",
        help="redis://HOST:PORT (rediss:// for TLS) of pion-server: shared slot files "
        "and the receipt [..._STORE]",
    ),
    click.option(
        "--store-password", help="store AUTH password [..._STORE_PASSWORD, PION_PASSWORD]"
    ),
    click.option("--store-username", help="store AUTH user [..._STORE_USERNAME]"),
    click.option(
        "--store-tls-ca",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="CA bundle for a rediss:// store [..._STORE_TLS_CA]",
    ),
    click.option(
        "--store-timeout", type=float, help="seconds per store operation [..._STORE_TIMEOUT]"
    ),
    click.option(
        "--store-ttl", type=int, help="seconds slot files live in the store [..._STORE_TTL]"
    ),
    click.option(
        "--registry-ttl",
        type=float,
        help="seconds this proxy's prefix places live in the store's registry unless "
        "refreshed; 0: none [..._REGISTRY_TTL]",
    ),
    click.option(
        "--divergence-excerpts/--no-divergence-excerpts",
        default=None,
        help="show excerpts of the prompt where a request left the learned prefix "
        "(default: on) [..._DIVERGENCE_EXCERPTS]",
    ),
    click.option(
        "--lease-wait",
        type=click.FloatRange(min=0),
        help="seconds a request waits for a slot another request holds, then it is "
        "forwarded unwarmed [..._LEASE_WAIT]",
    ),
    click.option(
        "--slot-trust",
        type=click.FloatRange(min=0),
        help="seconds a slot confirmed to hold its prefix is trusted without asking "
        "GET /slots, whatever the llama-server process (default 0: only while the local "
        "process that confirmed it still serves) [..._SLOT_TRUST]",
    ),
    click.option(
        "--check-every-hit/--trust-local-server",
        default=None,
        help="ask GET /slots on every hit even while the local llama-server process that "
        "confirmed the slot still serves (for a llama-server other clients use directly; "
        "default: trusted) [..._CHECK_EVERY_HIT]",
    ),
    click.option(
        "--checkpoint-tokens",
        type=click.IntRange(min=0),
        help="save a checkpoint of a conversation once it grew by this many tokens "
        "(0: none; default 1024) [..._CHECKPOINT_TOKENS]",
    ),
    click.option(
        "--upstream-timeout",
        type=click.FloatRange(min=0, min_open=True),
        help="seconds without a byte from llama-server before a request gets 504 "
        "[..._UPSTREAM_TIMEOUT]",
    ),
]


def _warmer_options(func: F) -> F:
    """Add :data:`_WARMER_OPTIONS` to ``func``, in their listed order."""
    for option in reversed(_WARMER_OPTIONS):
        func = option(func)
    return func


def _first(values: tuple[Any, ...] | None) -> Any:
    """A repeatable flag's first value (None when not given): one server's setting."""
    return values[0] if values else None


def _config(**flags: Any) -> WarmerConfig:
    slots: tuple[int, ...] | None = None
    all_slots: bool | None = None
    if flags.get("slots_spec") is not None:
        try:
            parsed = parse_slots(flags["slots_spec"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--slots") from None
        slots, all_slots = (parsed or ()), parsed is None
    return WarmerConfig.from_env(
        slots=slots,
        all_slots=all_slots,
        store=flags.get("store"),
        store_password=flags.get("store_password"),
        store_username=flags.get("store_username"),
        store_tls_ca=flags.get("store_tls_ca"),
        store_timeout=flags.get("store_timeout"),
        store_ttl=flags.get("store_ttl"),
        registry_ttl=flags.get("registry_ttl"),
        base_url=_first(flags.get("upstream")),
        slot=flags.get("slot"),
        persist=flags.get("persist"),
        slot_dir=_first(flags.get("slot_dir")),
        log_path=flags.get("log_path"),
        server_id=flags.get("server_id"),
        verify=flags.get("verify"),
        max_files=flags.get("max_files"),
        max_bytes=flags.get("max_bytes"),
        harness=flags.get("harness"),
        api_key=flags.get("api_key"),
        keep_billing_header=flags.get("keep_billing_header"),
        lease_wait=flags.get("lease_wait"),
        upstream_timeout=flags.get("upstream_timeout"),
        divergence_excerpts=flags.get("divergence_excerpts"),
        checkpoint_tokens=flags.get("checkpoint_tokens"),
        slot_trust=flags.get("slot_trust"),
        check_every_hit=flags.get("check_every_hit"),
    )


@click.group(name="llama")
def llama_group() -> None:
    """Keep an agent's stable prefix warm in llama-server and on disk."""


@llama_group.command()
@_warmer_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8089, show_default=True)
@config_option
def proxy(host: str, port: int, **flags: Any) -> None:
    """Run the OpenAI-compatible proxy; point the harness's baseUrl at it. With several
    --upstream, each request goes to the llama-server that holds its prefix, else to the
    one that restores it cheapest, else to the least loaded (docs/llama.md)."""
    upstreams: tuple[str, ...] = flags["upstream"]
    slot_dirs: tuple[Path, ...] = flags["slot_dir"]
    config = _config(**flags)
    several = len(upstreams) > 1
    # llama-server names a save's scratch file by slot: two servers would share it.
    dirs_ok = len(set(slot_dirs)) == len(upstreams)
    if several and (config.persist or slot_dirs) and not dirs_ok:
        raise click.BadParameter("one per --upstream, each its own", param_hint="--slot-dir")
    serve(
        config,
        host=host,
        port=port,
        upstreams=upstreams if several else (),
        slot_dirs=slot_dirs if several else (),
    )


@llama_group.command()
@_warmer_options
@click.option(
    "--system-prompt-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="the system prompt; cut at the first boundary marker if it has one",
)
@click.option("--tools-file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--chat-template-kwargs", help="JSON object, as the harness sends it")
@click.option("--model", help="the model id the harness sends (part of the fingerprint)")
@click.option("--role", type=click.Choice(["system", "developer"]), default="system")
def warm(
    system_prompt_file: Path,
    tools_file: Path | None,
    chat_template_kwargs: str | None,
    model: str | None,
    role: str,
    **flags: Any,
) -> None:
    """Pre-warm a system prompt (for boot scripts). Exit 1 when warming failed."""
    for name in ("upstream", "slot_dir"):
        if len(flags[name]) > 1:
            raise click.BadParameter("warm takes one", param_hint="--" + name.replace("_", "-"))
    config = _config(**flags)
    text = system_prompt_file.read_text(encoding="utf-8")
    prefix = split_prefix(text, config.markers) or text
    render: dict[str, Any] = {}
    if tools_file is not None:
        render["tools"] = json.loads(tools_file.read_text(encoding="utf-8"))
    if chat_template_kwargs:
        render["chat_template_kwargs"] = json.loads(chat_template_kwargs)
    request = WarmRequest(prefix=prefix, role=role, render=render, model=model)

    async def run() -> Outcome:
        warmer = PrefixWarmer(config)
        try:
            outcome = await warmer.ensure(request)
            # A boot script exits right after: let the push to the store finish first.
            await warmer.flush(timeout=config.store_deadline)
        finally:
            await warmer.aclose()
        return outcome

    outcome = asyncio.run(run())
    click.echo(f"{outcome.summary()}  fingerprint={outcome.fingerprint[:16]}")
    if outcome.kind == "disabled":
        sys.exit(1)


def _age(ts: float) -> str:
    seconds = max(0, int(time.time() - ts))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds}s"


@llama_group.command()
@click.option("--upstream", help="llama-server URL [env PI_PREFIX_CACHE_BASE_URL]")
@click.option("--slot-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--proxy", "proxy_url", help="a running proxy: show its state and outcomes")
@click.option(
    "--store",
    "store_url",
    is_flag=False,
    flag_value="",
    default=None,
    help="list the prefixes a store holds (URL, or PI_PREFIX_CACHE_STORE when bare)",
)
@click.option("--store-password", help="store AUTH password [..._STORE_PASSWORD, PION_PASSWORD]")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status(
    upstream: str | None,
    slot_dir: Path | None,
    proxy_url: str | None,
    *,
    store_url: str | None,
    store_password: str | None,
    as_json: bool,
) -> None:
    """Slots, fingerprints, slot files and last outcomes; with --store, the store's
    prefixes."""
    config = WarmerConfig.from_env(
        base_url=upstream, slot_dir=slot_dir, store=store_url or None, store_password=store_password
    )
    data: dict[str, Any] = {"upstream": config.base_url}
    if store_url is not None:
        data["store"] = store_listing(config)
    with LlamaClient(config.base_url, timeout=10.0, api_key=config.api_key) as client:
        try:
            data["slots"] = client.slots()
        except LlamaServerError as exc:
            data["slots_error"] = exc.short()
    if config.slot_dir is not None:
        index = SlotIndex(config.slot_dir).load()
        data["files"] = {k: vars(v) for k, v in index.files.items()}
        data["orphans"] = index.orphans()
        data["no_restore"] = index.no_restore
    if proxy_url:
        try:
            data["proxy"] = httpx.get(proxy_url.rstrip("/") + STATUS_PATH, timeout=10.0).json()
        except (httpx.HTTPError, ValueError) as exc:
            data["proxy_error"] = str(exc)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        return
    _print_status(data)


def _print_status(data: dict[str, Any]) -> None:
    console = Console()
    slots = Table(title=f"llama-server slots ({data['upstream']})")
    for col in ("id", "n_ctx", "processing", "n_prompt_tokens"):
        slots.add_column(col)
    for s in data.get("slots", []):
        slots.add_row(
            str(s.get("id")),
            str(s.get("n_ctx")),
            str(s.get("is_processing")),
            str(s.get("n_prompt_tokens", "-")),
        )
    console.print(slots)
    if "slots_error" in data:
        console.print(f"[red]slots: {data['slots_error']}[/red]")
    if "files" in data:
        files = Table(title="slot files (index.json)")
        files.add_column("file", no_wrap=True)
        for col in ("tokens", "bytes", "last used", "model", "harness"):
            files.add_column(col, overflow="fold")
        for name, e in sorted(data["files"].items(), key=lambda kv: -kv[1]["last_used"]):
            files.add_row(
                name,
                str(e["tokens"]),
                str(e["bytes"]),
                _age(e["last_used"]) + " ago",
                Path(e["model"]).name,
                e["harness"],
            )
        console.print(files)
        for name in data.get("orphans", []):
            console.print(f"not in index: {name}")
        for key, why in data.get("no_restore", {}).items():
            console.print(f"[yellow]restores disabled for {key}: {why.get('reason')}[/yellow]")
    if "store" in data:
        print_store_listing(console, data["store"])
    proxy = data.get("proxy")
    if proxy:
        _print_proxy(console, proxy)
    if "proxy_error" in data:
        console.print(f"[red]proxy: {data['proxy_error']}[/red]")


def _print_divergence(console: Console, divergence: dict[str, Any]) -> None:
    """Where each harness's last request left its learned prefix, and the causes."""
    if not divergence.get("counts"):
        return
    console.print(f"requests that left the learned prefix, by cause: {divergence['counts']}")
    for harness, entry in divergence.get("harnesses", {}).items():
        last = (entry.get("recent") or [None])[-1]
        if not last:
            continue
        text = f"  {harness}: token {last['token']} of {last['learned_tokens']}, {last['cause']}"
        if last.get("learned") is not None or last.get("sent") is not None:
            shared, learned, sent = last.get("shared") or "", last.get("learned"), last.get("sent")
            text += f": {shared}{learned!r} → {sent!r}"
        console.print(text, markup=False)


def _print_fleet(console: Console, fleet: dict[str, Any]) -> None:
    """Several llama-servers: each one's health, model, load, prefixes and routing."""
    table = Table(title=f"llama-servers (routing: {fleet.get('decisions') or 'none yet'})")
    for col in ("server", "health", "model", "busy/queued", "prefixes", "routed", "reused"):
        table.add_column(col, overflow="fold")
    for s in fleet["servers"]:
        health = "up" if s["healthy"] else f"[red]down[/red] ({s.get('last_error') or '?'})"
        prefixes = ", ".join(
            f"{slot}: {entry.get('label') or entry.get('fingerprint', '')[:16]}"
            for slot, entry in (s.get("slots") or {}).items()
            if entry
        )
        table.add_row(
            s["url"],
            health,
            str(s.get("model") or "?"),
            f"{s.get('busy', 0)}/{s.get('queued', 0)}",
            prefixes or "-",
            ", ".join(f"{k} {v}" for k, v in sorted((s.get("routed") or {}).items())) or "-",
            str(s.get("tokens_reused", 0)),
        )
    console.print(table)


def _print_proxy(console: Console, proxy: dict[str, Any]) -> None:
    console.print(
        f"proxy: counts {proxy.get('counts')}, events {proxy.get('events')}, "
        f"verify {proxy.get('verify')}"
    )
    if proxy.get("failures"):
        console.print(f"[yellow]failures swallowed (fail-open): {proxy['failures']}[/yellow]")
    if proxy.get("errors"):
        console.print(f"[red]unexpected errors (fail-open, see the log): {proxy['errors']}[/red]")
    upstream = proxy.get("upstream_errors") or {}
    if upstream.get("timeouts") or upstream.get("unreachable"):
        last = upstream.get("last") or {}
        console.print(
            f"[red]upstream: {upstream.get('timeouts', 0)} timeout(s) (504), "
            f"{upstream.get('unreachable', 0)} unreachable (502); last: "
            f"{last.get('detail', '?')}[/red]"
        )
    _print_divergence(console, proxy.get("divergence") or {})
    fleet = proxy.get("fleet") or {}
    if len(fleet.get("servers") or ()) > 1:
        _print_fleet(console, fleet)
    leases = proxy.get("leases")
    if leases:
        held = ", ".join(f"slot {k} ({v['held_s']:.1f} s)" for k, v in leases["held"].items())
        console.print(
            f"leases: {held or 'none held'}; {leases['waiting']} waiting, "
            f"{leases['timeouts']} timed out"
        )
    table = Table(title="which prefix is in which slot (proxy)")
    for col in ("slot", "fingerprint", "prefix", "tokens", "from", "on disk", "last used"):
        table.add_column(col, overflow="fold")
    lru = proxy.get("lru") or []
    for slot, s in proxy.get("slots", {}).items():
        if not s:
            table.add_row(slot, "-", "(free)", "", "", "", "")
            continue
        rank = f" (LRU #{lru.index(int(slot)) + 1})" if int(slot) in lru else ""
        last = s.get("last_used")
        table.add_row(
            slot,
            str(s.get("fingerprint", ""))[:16],
            str(s.get("label", "")),
            str(s.get("tokens", "-")),
            str(s.get("source", "warming" if not s.get("warm") else "")),
            "yes" if s.get("saved") else "no",
            (_age(last) + " ago" if isinstance(last, int | float) else "-") + rank,
        )
    console.print(table)
    store = proxy.get("store")
    if store:
        state = "up" if store.get("usable") else "[red]skipped after a failure[/red]"
        console.print(f"store {store.get('url')}: {state}, {store.get('counts')}")
    for outcome in proxy.get("outcomes", [])[-10:]:
        console.print(f"  {outcome['summary']}")


@llama_group.command()
@click.option("--slot-dir", type=click.Path(file_okay=False, path_type=Path), help="[..._SLOT_DIR]")
@click.option("--max-files", type=int, help="[PI_PREFIX_CACHE_MAX_FILES]")
@click.option("--max-bytes", type=int, help="[PI_PREFIX_CACHE_MAX_BYTES]")
def gc(slot_dir: Path | None, max_files: int | None, max_bytes: int | None) -> None:
    """Delete least recently used slot files beyond the budget."""
    config = WarmerConfig.from_env(slot_dir=slot_dir, max_files=max_files, max_bytes=max_bytes)
    if config.slot_dir is None:
        raise click.UsageError("--slot-dir (or PI_PREFIX_CACHE_SLOT_DIR) is required")
    index = SlotIndex(config.slot_dir, log=click.echo)
    removed = index.cleanup(config.max_files, config.max_bytes)
    click.echo(f"removed {len(removed)} file(s); {len(index.files)} kept")


llama_group.add_command(serve_command)


def main() -> None:
    """Entry point of ``python -m pion.llama.cli``."""
    llama_group()


if __name__ == "__main__":
    main()
