"""``pion check-wal [--fix] FILE``: inspect a write-ahead log (or a snapshot) and cut a
damaged log at its first bad record. Thin: the work is :mod:`pion.persistence.check`.

Exit status: 0 the file is sound (or was repaired), 1 damage found and not repaired,
2 the file cannot be read as a Pion file or cannot be repaired (a bad header, a damaged
snapshot).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pion.persistence.check import CheckReport, check_file, fix_file

__all__ = ["check_wal_command"]


def _describe(rep: CheckReport) -> list[str]:
    kind = {"log": "write-ahead log", "snapshot": "snapshot"}.get(rep.kind, "unknown file")
    lines = [f"{rep.path}: {kind}, {rep.size} bytes"]
    if rep.kind == "log" and rep.worker >= 0:
        span = f"records {rep.first_seq}..{rep.last_seq}" if rep.records else "no records"
        lines.append(f"  worker {rep.worker}, {span} (numbering starts at {rep.first_seq})")
    elif rep.kind == "snapshot" and rep.worker >= 0:
        lines.append(f"  worker {rep.worker}, covers the log up to record {rep.first_seq}")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(rep.counts.items()))
    lines.append(f"  {rep.records} good records" + (f": {counts}" if counts else ""))
    lines.append(f"  last good offset: {rep.good_end}")
    if rep.fatal is not None:
        lines.append(f"  problem: {rep.fatal}")
    elif rep.damage is not None:
        d = rep.damage
        if d.torn:
            kind = "torn write (an incomplete last record; startup cuts it by itself)"
        elif d.next_valid >= 0:
            kind = "corruption before the end of the log"
        else:
            kind = "corruption (a complete last record that fails its checksum)"
        lines.append(f"  problem: {kind} at offset {d.offset}: {d.reason}")
        if rep.after_damage:
            lines.append(
                f"  {rep.after_damage} valid records follow the damage (from offset "
                f"{d.next_valid}); --fix discards them too"
            )
    else:
        lines.append("  no problems found")
    return lines


@click.command(name="check-wal")
@click.option("--fix", is_flag=True, help="Cut the log at its first bad record (no prompt).")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check_wal_command(fix: bool, file: Path) -> None:
    """Check a Pion write-ahead log (or snapshot) FILE; --fix repairs a damaged log."""
    rep = check_file(file)
    for line in _describe(rep):
        click.echo(line)
    if rep.ok:
        sys.exit(0)
    if rep.fatal is not None or rep.kind != "log":
        if fix:
            click.echo("  not repairable by --fix", err=True)
        sys.exit(2)
    if not fix:
        click.echo(f"  repair with: pion check-wal --fix {file}")
        sys.exit(1)
    cut = fix_file(rep)
    offset = rep.damage.offset if rep.damage is not None else rep.size
    click.echo(f"  fixed: cut {cut} bytes at offset {offset}; {rep.records} records kept")
    sys.exit(0)
