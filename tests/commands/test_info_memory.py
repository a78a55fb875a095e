"""INFO's Memory section as operators' Redis tools read it: the Redis field names with
true values for this process (``used_memory`` is the computed number ``--maxmemory``
bounds: startup + dataset + client buffers), a peak never below the current value,
the budget and its policy; and pion_version in Server."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import redis

import pion
from pion.commands.info import bytes_to_human
from pion.server.run import ServerThread

FIELDS = (
    "used_memory",
    "used_memory_human",
    "used_memory_rss",
    "used_memory_peak",
    "maxmemory",
    "maxmemory_policy",
)
HUMAN = re.compile(r"^(\d+B|\d+\.\d\d[KMGTP])$")


def _proc_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0B"),
        (1023, "1023B"),
        (1024, "1.00K"),
        (1536, "1.50K"),
        (1024**2 - 1, "1024.00K"),
        (1024**2, "1.00M"),
        (5 * 1024**3, "5.00G"),
        (3 * 1024**4, "3.00T"),
        (2 * 1024**5, "2.00P"),
        (4096 * 1024**5, "4096.00P"),
    ],
)
def test_bytes_to_human_is_redis_format(n: int, text: str) -> None:
    assert bytes_to_human(n) == text


def test_fields_are_present_and_true(client: redis.Redis) -> None:
    mem = client.info("memory")
    for name in FIELDS:
        assert name in mem, name
    used, rss, peak = mem["used_memory"], mem["used_memory_rss"], mem["used_memory_peak"]
    assert all(isinstance(v, int) for v in (used, rss, peak))
    # The in-process server shares this process: compare with the kernel's own figures.
    anon, resident = _proc_kb("RssAnon"), _proc_kb("VmRSS")
    assert 0.5 * anon < used < 2 * anon
    assert 0.5 * resident < rss < 2 * resident
    assert 0 < used <= rss
    assert peak >= used
    assert mem["used_memory_human"] == bytes_to_human(used)
    assert HUMAN.match(mem["used_memory_human"])
    assert HUMAN.match(mem["used_memory_peak_human"])
    assert mem["maxmemory"] == 0
    assert mem["maxmemory_human"] == "0B"
    assert mem["maxmemory_policy"] == "volatile-lru"
    # The parts add up: startup, the stores' data, the clients' buffers.
    assert (
        used == mem["used_memory_startup"] + mem["used_memory_dataset"] + mem["mem_clients_normal"]
    )
    assert mem["used_memory_dataset"] == (
        mem["vstore_bytes"] + mem["keyspace_bytes"] + mem["sdpa_warm_bytes"] + mem["ssm_bytes"]
    )


def test_used_memory_follows_the_store_and_peak_stays_above(client: redis.Redis) -> None:
    before = client.info("memory")["used_memory"]
    client.execute_command("V.CREATE", "big", 4096, "VQUANT", "fp16")
    blob = np.random.default_rng(0).standard_normal((4096, 4096)).astype("<f2").tobytes()
    client.execute_command("V.STOREBATCH", "big", 0, 0, 4096, blob, "FMT", "F16")  # 32 MiB
    grown = client.info("memory")
    assert grown["used_memory"] - before > 16 << 20
    assert grown["used_memory_peak"] >= grown["used_memory"]
    for _ in range(3):
        mem = client.info("memory")
        assert mem["used_memory_peak"] >= mem["used_memory"]
        assert mem["used_memory_peak"] >= grown["used_memory"]  # a peak never goes down


def test_maxmemory_reflects_config_set(client: redis.Redis) -> None:
    client.config_set("maxmemory", 3 * 1024**2)
    mem = client.info("memory")
    assert mem["maxmemory"] == 3 * 1024**2
    assert mem["maxmemory_human"] == "3.00M"
    client.config_set("maxmemory-policy", "allkeys-lru")
    assert client.info("memory")["maxmemory_policy"] == "allkeys-lru"
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "allkeys-lru"}


def test_peak_is_monotonic(client: redis.Redis) -> None:
    peaks = []
    for i in range(5):
        client.set(f"k{i}", b"x" * (100 << 10))
        mem = client.info("memory")
        assert mem["used_memory_peak"] >= mem["used_memory"] > 0
        peaks.append(mem["used_memory_peak"])
    client.delete(*(f"k{i}" for i in range(5)))
    assert client.info("memory")["used_memory_peak"] >= peaks[-1]
    assert peaks == sorted(peaks)


def test_pion_version_in_server_section(client: redis.Redis) -> None:
    server = client.info("server")
    assert server["pion_version"] == pion.__version__
    assert "redis_version" in server


def test_redis_cli_reads_them(server: ServerThread) -> None:
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli is not installed (Debian redis-tools)")
    out = subprocess.run(
        [cli, "-p", str(server.port), "INFO", "memory"],
        capture_output=True,
        timeout=30,
        check=True,
    ).stdout.decode()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    for name in FIELDS:
        assert name in fields, name
    assert int(fields["used_memory_peak"]) >= int(fields["used_memory"]) > 0
