"""``pion llama serve``: the command-line face of :mod:`pion.llama.serve` (thin).

``pion llama serve -m MODEL.gguf [--slots N] [--servers N] [-- llama-server flags]``
parses its flags into a :class:`~pion.llama.serve.ServeOptions`, finds llama-server and
runs them until Ctrl-C. :mod:`pion.llama.cli` registers the command in its group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pion.llama.paths import cache_dir, default_log_path
from pion.llama.serve import LlamaServerNotFoundError, ServeOptions, find_llama_server, run

__all__ = ["serve_command"]


def _echo(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


@click.command(
    name="serve",
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
)
@click.option(
    "-m",
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="the GGUF model llama-server loads",
)
@click.option("--slots", type=int, default=1, show_default=True, help="prefixes kept hot")
@click.option(
    "--servers",
    type=int,
    default=1,
    show_default=True,
    help="llama-servers of the model behind the proxy (a port and slot dir each)",
)
@click.option(
    "--devices",
    default="",
    help="one llama-server --device per server, comma-separated (e.g. CUDA0,CUDA1)",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="where the proxy listens")
@click.option("--port", type=int, default=8089, show_default=True, help="proxy port (0: free)")
@click.option(
    "--llama-port",
    type=int,
    default=0,
    help="llama-server's port; several: from it on [free ones]",
)
@click.option(
    "--ctx",
    type=int,
    default=32768,
    show_default=True,
    help="context tokens per slot (a -c among the llama-server flags wins)",
)
@click.option(
    "--slot-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"slot files [{cache_dir() / 'slots'}]",
)
@click.option("--log", "log_path", type=click.Path(path_type=Path), help="[prefix-cache] log")
@click.option(
    "--llama-server",
    "binary",
    type=click.Path(dir_okay=False, path_type=Path),
    help="the binary [PATH, else the build cache, else built]",
)
@click.option(
    "--swa-full/--no-swa-full",
    "swa_full",
    default=None,
    help="keep the whole K/V cache of a sliding-window model, so its slot files restore "
    "(more memory) [on when the GGUF has a sliding window]",
)
@click.argument("llama_args", nargs=-1, type=click.UNPROCESSED)
def serve_command(
    *,
    model: Path,
    slots: int,
    servers: int,
    devices: str,
    host: str,
    port: int,
    llama_port: int,
    ctx: int,
    slot_dir: Path | None,
    log_path: Path | None,
    binary: Path | None,
    swa_full: bool | None,
    llama_args: tuple[str, ...],
) -> None:
    """Run llama-server (restarted if it dies; --servers N: N of them) and the proxy in
    front of it; print the base URL and each agent's configuration. Flags after `--` go
    to llama-server."""
    try:
        options = ServeOptions(
            model=model.resolve(),
            slots=slots,
            servers=servers,
            devices=tuple(d.strip() for d in devices.split(",") if d.strip()),
            host=host,
            port=port,
            llama_port=llama_port,
            slot_dir=(slot_dir or cache_dir() / "slots").expanduser().resolve(),
            log_path=log_path or default_log_path(),
            context=ctx,
            llama_args=llama_args,
            swa_full=swa_full,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        found = find_llama_server(binary, echo=_echo)
    except LlamaServerNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        status = run(options, found, echo=_echo)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    sys.exit(status)
