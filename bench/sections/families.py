"""The sections on issue 32's Redis families against redis-server, one small request at
a time: streams (``bench/streams.py``), lists and sets (``bench/lists_sets.py``), a Lua
script (``bench/scripting.py``) and pub/sub (``bench/pubsub.py``). Each compares
pion-server's rate with redis-server's on the same machine in the same run, against the
issue's target (0.5x redis-server unpipelined)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sections._base import Result, Section, bars, figure, parity, ratio
from sections._text import join

TARGET = 0.5
# Why a small request costs pion-server more than redis-server: said once, for every
# section below that falls short.
_PER_COMMAND = (
    "Each of these commands is one small request, so the server's per-command cost in "
    "Python (decoding, dispatch, the change itself, its log record) is what separates it "
    "from redis-server."
)


def _versus_redis(
    *,
    title: str,
    intro: str,
    plot_title: str,
    cases: Sequence[tuple[str, str, float, float]],
    command: str,
    why: str = _PER_COMMAND,
    target: float = TARGET,
    judged: Any = lambda case: True,
) -> Section:
    """A table of (case, unit, pion, redis) with pion's ratio, a bar plot against the
    target, and the cases below it (those ``judged`` says the target is for) named."""
    rows, labels, vs_redis, losses = [], [], [], []
    for case, unit, pion, redis in cases:
        x = pion / redis if redis else 0.0
        labels.append(case)
        vs_redis.append(x)
        rows.append([case, unit, pion, redis, ratio(x)])
        if judged(case) and x < target:
            losses.append(f"{case} {ratio(x)}")
    fig, (ax,) = figure(width=max(6.4, 0.8 * len(labels)))
    bars(ax, labels, {"x redis (no persistence)": vs_redis})
    parity(ax)
    ax.axhline(target, color="red", linewidth=0.8, linestyle=":", label=f"target {target}x")
    ax.legend(fontsize=8)
    ax.set_ylabel("pion-server x redis-server")
    ax.set_title(plot_title)
    return Section(
        title=title,
        intro=f"{intro} Target: {target}x redis-server.",
        headers=["case", "unit", "pion", "redis", "pion x redis"],
        rows=rows,
        losses=f"Below the {target}x target: {join(losses)}. {why}" if losses else "",
        command=command,
        figure=fig,
    )


def _medians(data: Result) -> list[tuple[str, str, float, float]]:
    return [
        (r["case"], r["unit"], r["median"]["pion"], r["median"]["redis"])
        for r in data.get("results", [])
    ]


def _unpipelined(case: str) -> bool:
    return "P16" not in case


def streams(results: Mapping[str, Result]) -> Section:
    data = results["streams"]
    return _versus_redis(
        title="How fast are streams (XADD, a consumer group's read and ack) against redis-server?",
        intro=(
            "XADD with `*` ids from redis-benchmark (50 clients, unpipelined), and one "
            "consumer taking a stream's entries one XREADGROUP `>` COUNT 1 at a time and "
            "acknowledging each with XACK (two round trips per entry, as a job worker "
            "does); pion-server with one worker and its log (`everysec`: each XADD, "
            "delivery and XACK is a record) against redis-server without persistence, "
            f"medians of {data.get('rounds', '?')} rounds."
        ),
        plot_title="Streams: XADD, XREADGROUP + XACK",
        cases=_medians(data),
        command="python bench/streams.py",
        target=float(data.get("target", TARGET)),
    )


def lists_sets(results: Mapping[str, Result]) -> Section:
    data = results["lists_sets"]
    nowal = [
        [
            r["case"],
            r["median"]["pion-nowal"],
            ratio(r["median"]["pion-nowal"] / r["median"]["redis"]),
        ]
        for r in data.get("results", [])
    ]
    section = _versus_redis(
        title="How fast are lists and sets (LPUSH, RPOP, SADD, SISMEMBER) against redis-server?",
        intro=(
            "redis-benchmark's own LPUSH, RPOP and SADD tests and SISMEMBER of random "
            "members (half of them present), 50 clients, unpipelined (P1) and `-P 16`; "
            "pion-server with one worker and its log (`everysec`) against redis-server "
            f"without persistence, medians of {data.get('rounds', '?')} rounds. The target "
            "is for the unpipelined rows; the second table is pion-server without its log."
        ),
        plot_title="Lists and sets, small elements",
        cases=_medians(data),
        command="python bench/lists_sets.py",
        judged=_unpipelined,
    )
    section.extra_tables.append(
        ("Without the log (`--no-wal`):", ["case", "req/s", "x redis"], nowal)
    )
    return section


def scripting(results: Mapping[str, Result]) -> Section:
    data = results["scripting"]
    return _versus_redis(
        title="How fast is a small Lua script (EVALSHA) against redis-server?",
        intro=(
            "EVALSHA of `return redis.call('incr', KEYS[1])` over random keys from "
            "redis-benchmark (50 clients), unpipelined and `-P 16`; pion-server with one "
            "worker and its log against redis-server without persistence, medians of "
            f"{data.get('rounds', '?')} rounds. The target is for the unpipelined row."
        ),
        plot_title="EVALSHA of a one-call script",
        cases=_medians(data),
        command="python bench/scripting.py",
        why=(
            "A script pays what a command pays, and more: the call into the Lua runtime "
            "(lupa), its `redis.call` dispatched as a command of its own, and the hand-off "
            "to the one thread scripts run on and back (which is what lets other clients "
            "get `-BUSY` from a script that runs past `busy-reply-threshold`)."
        ),
        judged=_unpipelined,
    )


def pubsub(results: Mapping[str, Result]) -> Section:
    data = results["pubsub"]
    cases = [
        (c["case"], "publishes/s", c["pion_per_s"], c["redis_per_s"]) for c in data.get("cases", [])
    ]
    rounds = data["cases"][0].get("rounds", "?") if data.get("cases") else "?"
    return _versus_redis(
        title="How fast is PUBLISH to N subscribers against redis-server?",
        intro=(
            f"One publisher's PUBLISH of {data.get('payload_bytes', '?')}-byte messages to a "
            "channel with 1, 10 or 100 subscribers (raw sockets that only count bytes; the "
            "run checks every subscriber got every message), unpipelined and 16 to a round "
            "trip (P16); pion-server with its log (PUBLISH is not logged) against "
            f"redis-server without persistence, medians of {rounds} rounds. The target is "
            "for the unpipelined rows."
        ),
        plot_title="PUBLISH to N subscribers (publishes/s)",
        cases=cases,
        command="python bench/pubsub.py",
        why=(
            "A PUBLISH writes the message to every subscriber's connection from Python; "
            "redis-server does it in C, so the gap narrows as N grows."
        ),
        judged=_unpipelined,
    )
