"""The section on `pion llama` beyond one machine and one slot (``bench/llama_store.py``):
a session's first request on a second machine, its prefix pulled from a pion-server, beside
a cold prefill and a restore from the local disk; and several prefixes sharing one
llama-server (one slot restored per switch, one slot per prefix, llama-server alone)."""

from __future__ import annotations

from collections.abc import Mapping

from sections._base import Result, Section, bars, figure, ratio

_MACHINE = {
    "a": "(a) cold, no pion",
    "b": "(b) local disk",
    "c": "(c) pulled from the store",
}


def llama_store(results: Mapping[str, Result]) -> Section:
    data = results["llama_store"]
    peer = data.get("second_machine", {})
    several = {k: s for k, s in data.get("several_prefixes", {}).items() if isinstance(s, dict)}
    shape = data.get("several_prefixes", {})
    medians = peer.get("median_s", {})
    cache_n = peer.get("cache_n", {})
    rows: list[list[object]] = [
        [label, f"{medians[key]:.2f}", ratio(medians[key] / medians["a"]), cache_n[key][-1]]
        for key, label in _MACHINE.items()
        if key in medians and "a" in medians
    ]
    losses = []
    over_disk, over_cold = peer.get("store_over_disk"), peer.get("store_over_cold")
    if over_disk is not None and over_disk > 1.5:
        losses.append(f"a pull from the store took {ratio(over_disk)} of a local restore")
    if over_cold is not None and over_cold > 0.1:
        losses.append(f"a pull from the store took {ratio(over_cold)} of a cold prefill")
    later = {k: s["median_later_s"] for k, s in several.items()}
    totals = {k: s["total_s"] for k, s in several.items()}
    for key in ("i", "ii"):
        if key in later and "iii" in later and later[key] > later["iii"]:
            losses.append(
                f"{several[key]['label']}: the later sessions' median TTFT was "
                f"{later[key]:.2f} s against llama-server alone's {later['iii']:.2f} s"
                + (" (every switch of prefix is a restore)" if key == "i" else "")
            )
    if "ii" in totals and "iii" in totals and totals["ii"] > totals["iii"]:
        firsts = several["ii"]["ttft_s"][:3]
        losses.append(
            f"the whole workload took {totals['ii']:.1f} s through the proxy against "
            f"{totals['iii']:.1f} s without it: each prefix's first session is warmed and "
            f"saved before it is answered ({min(firsts):.1f}-{max(firsts):.1f} s)"
        )
    fig, (ax, ax2) = figure(ncols=2, width=5.2)
    bars(ax, [label.split(" ", 1)[0] for label in _MACHINE], {"median s": list(medians.values())})
    ax.set_yscale("log")
    ax.set_ylabel("seconds to first token (log)")
    ax.set_title("A session's first request on a second machine")
    bars(ax2, list(later), {"median TTFT after the first (s)": list(later.values())})
    ax2.set_title("Three prefixes on one llama-server")
    model = data.get("model", {})
    return Section(
        title="Does pion llama carry a prefix to another machine and share one server?",
        intro=(
            f"A {peer.get('prefix_tokens', '?'):,}-token Pi-shaped prefix on a generated "
            f"model ({model.get('layers', '?')} layers, width {model.get('width', '?')}; "
            f"slot file {peer.get('slot_file_bytes', 0) / 1e6:.0f} MB). Machine B is a "
            "llama-server restarted before every measurement: (a) its cold prefill; (b) "
            "through the proxy, the slot file on B's disk; (c) through the proxy, B's slot "
            "dir empty, the file pulled from a pion-server (pushed there by machine A), "
            "checked and restored. Time to first token as the client sees it, medians of "
            f"{data.get('reps', '?')} cold and {data.get('restore_reps', '?')} restore runs. "
            "Targets: (c) <= 1.5x (b) and (c) <= 0.1x (a). Second table: three prefixes "
            f"of about {shape.get('prefix_tokens_about', '?')} tokens, sessions "
            f"interleaved for {shape.get('rounds', '?')} rounds."
        ),
        headers=["machine B", "median s", "x cold", "cache_n"],
        rows=rows,
        losses=(f"{'; '.join(losses)}." if losses else ""),
        command="python bench/llama_store.py",
        figure=fig,
        extra_tables=[
            (
                "Three prefixes, interleaved:",
                ["run", "total s", "median TTFT after each first (s)"],
                [
                    [s["label"], f"{s['total_s']:.1f}", f"{s['median_later_s']:.2f}"]
                    for s in several.values()
                ],
            )
        ],
    )
