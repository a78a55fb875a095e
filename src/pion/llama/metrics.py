"""``GET /pion/metrics``: the proxy's routing in Prometheus's text format
(``prometheus_client``), beside ``/pion/status``'s JSON.

- ``pion_llama_routing_decisions_total{decision}``: where the fleet sent each warmed
  request, as it turned out (``hit``, ``restore``, ``pull``, ``cold``) and the requests
  routed again off a server taken out (``failover``);
- per llama-server (``server`` = its URL): ``pion_llama_server_up`` (1 while its probes
  answer), ``pion_llama_server_busy_slots``, ``pion_llama_server_queued_requests``,
  ``pion_llama_server_routed_total{decision}``, ``pion_llama_server_tokens_reused_total``
  (prompt tokens its slots already held or restored), ``pion_llama_server_downs_total``;
- ``pion_llama_upstream_errors_total{kind}``: forwarded requests that got no answer
  (``timeout``, ``unreachable``).

Read on the proxy's loop, from the same counters as the status page.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from pion.llama.fleet import Fleet

__all__ = ["CONTENT_TYPE_LATEST", "render"]


class _Families:
    """What generate_latest needs: something with collect()."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _servers(fleet: Fleet) -> list[Metric]:
    up = GaugeMetricFamily(
        "pion_llama_server_up", "1 while the server's probes answer", labels=["server"]
    )
    busy = GaugeMetricFamily("pion_llama_server_busy_slots", "Slots leased now", labels=["server"])
    queued = GaugeMetricFamily(
        "pion_llama_server_queued_requests", "Requests waiting for a slot", labels=["server"]
    )
    routed = CounterMetricFamily(
        "pion_llama_server_routed", "Warmed requests the server took", labels=["server", "decision"]
    )
    reused = CounterMetricFamily(
        "pion_llama_server_tokens_reused",
        "Prompt tokens the server's slots held or restored",
        labels=["server"],
    )
    downs = CounterMetricFamily(
        "pion_llama_server_downs", "Times the server was taken out", labels=["server"]
    )
    for server in fleet.servers:
        leases = server.warmer.leases
        n_busy, n_queued = leases.load() if leases is not None else (0, 0)
        up.add_metric([server.url], 1.0 if server.healthy else 0.0)
        busy.add_metric([server.url], n_busy)
        queued.add_metric([server.url], n_queued + server.warmer.unpinned_inflight)
        for decision, count in sorted(server.routed.items()):
            routed.add_metric([server.url, decision], count)
        reused.add_metric([server.url], server.tokens_reused)
        downs.add_metric([server.url], server.downs)
    return [up, busy, queued, routed, reused, downs]


def render(fleet: Fleet, upstream_errors: dict[str, Any]) -> bytes:
    """The exposition text for ``fleet`` and the proxy's upstream error counts."""
    decisions = CounterMetricFamily(
        "pion_llama_routing_decisions",
        "Where warmed requests were routed, and failovers",
        labels=["decision"],
    )
    for decision in ("hit", "restore", "pull", "cold", "failover"):
        decisions.add_metric([decision], fleet.decisions.get(decision, 0))
    errors = CounterMetricFamily(
        "pion_llama_upstream_errors", "Forwarded requests with no answer", labels=["kind"]
    )
    errors.add_metric(["timeout"], int(upstream_errors.get("timeouts", 0)))
    errors.add_metric(["unreachable"], int(upstream_errors.get("unreachable", 0)))
    families: list[Metric] = [decisions, *_servers(fleet), errors]
    return generate_latest(_Families(families))  # type: ignore[arg-type,unused-ignore]
