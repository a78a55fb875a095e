"""Test helpers for pion-server's workers, TLS and metrics
(``from support.workers import ...``).

- :func:`stats`, :func:`info_fields`, :func:`gone`: what a test reads of workers (the
  processes themselves are :class:`support.ServerProcess`).
- :func:`make_certs`: a CA, a server certificate for 127.0.0.1/localhost and a client
  certificate, generated with the ``openssl`` command line.
- :func:`scrape`: the metrics endpoint parsed by prometheus_client's own parser.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis
from prometheus_client.parser import text_string_to_metric_families


def stats(r: redis.Redis) -> dict[str, Any]:
    """PION.STATS of the worker ``r`` is connected to (a RESP3 map or RESP2 pairs)."""
    raw = r.execute_command("PION.STATS")
    pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
    return {k.decode(): v for k, v in pairs}


def info_fields(raw: bytes) -> dict[str, str]:
    """``name:value`` lines (KV.PREFIX.INFO, V.INFO) as a dict."""
    out = {}
    for line in raw.decode().split("\r\n"):
        if ":" in line:
            key, _, value = line.partition(":")
            out[key] = value
    return out


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie of a dead parent counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- certificates --------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing of ours


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, cert = d / f"{name}.key", d / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
             "-days", "2", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
    return key, cert


def _signed(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, cert, extfile = (d / f"{name}{s}" for s in (".key", ".csr", ".pem", ".ext"))
    extfile.write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", f"/CN={name}", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", ca[1], "-CAkey", ca[0], "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", extfile, cwd=d)  # fmt: skip
    return cert, key


def make_certs(d: Path) -> Certs:
    """A CA, a server certificate it signed for 127.0.0.1 and localhost, a client
    certificate it signed, and an unrelated CA."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "pion-test-ca")
    server = _signed(
        d,
        "server",
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    client = _signed(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    _, other = _ca(d, "other-ca")
    for path in d.iterdir():
        if path.suffix == ".key":
            os.chmod(path, 0o600)
    return Certs(ca[1], server[0], server[1], client[0], client[1], other)


# -- metrics -------------------------------------------------------------------------


def scrape(port: int, context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """The endpoint's families by name (the parser's names: counters without
    ``_total``), each family appearing once."""
    scheme = "https" if context is not None else "http"
    with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/metrics", context=context) as r:
        text = r.read().decode()
    families: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"{family.name} exposed twice"
        families[family.name] = family
    return families


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    """The value of the one sample ``name`` with exactly these labels."""
    family_name = name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    family = families.get(family_name) or families[name]
    found = [s.value for s in family.samples if s.name == name and s.labels == labels]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return float(found[0])
