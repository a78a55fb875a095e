"""Attention scores past fp32's range, against the real server over TCP: finite K rows
and queries of +-1e20 make ``q . k`` about 4e40 (and ``inf - inf`` inside an fp32 dot
product). Every query form and the binary lane must answer the float64 result, and the
one reply that carries the LSE in fp32 refuses with a reason when it cannot hold it;
none of them may answer ``internal error``."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from pion.attend.kernel import attend, select_blocks
from pion.server.binary_wire import HEADER, MAGIC, OP_QUERY_FUSED, STATUS_OK
from pion.server.run import ServerThread
from support.attend import reference, reference_blocks

RNG = np.random.default_rng(21)
BIG = 1e20
H_KV, H_Q, N, D = 1, 2, 8, 4


def _blob(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def _keys() -> np.ndarray:
    """Rows of +1e20, -1e20, alternating +-1e20 (whose dot with a query of 1e20s is 0
    exactly, but NaN in fp32: inf + -inf) and ordinary ones."""
    k = RNG.standard_normal((H_KV, N, D)).astype(np.float32)
    k[0, 0] = BIG
    k[0, 1] = -BIG
    k[0, 2] = [BIG, -BIG, BIG, -BIG]
    k[0, 5] = [BIG, -BIG, BIG, -BIG]
    return k


def _close(raw: bytes, want: np.ndarray) -> None:
    got = np.frombuffer(raw, "<f4").reshape(want.shape)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _internal_errors(client: redis.Redis) -> int:
    return int(client.info("stats")["total_internal_errors"])


@pytest.fixture
def stored(server_factory: Callable[..., ServerThread]) -> tuple[Any, ...]:
    server = server_factory()
    client = redis.Redis(port=server.port, socket_timeout=30)
    k, v = _keys(), RNG.standard_normal((H_KV, N, D)).astype(np.float32)
    assert client.execute_command("ATTEND.PREFIX.STORE", "x", 0, H_KV, N, D, _blob(k), _blob(v))
    return server, client, k, v


def test_every_resp_query_form_answers_the_float64_result(stored: tuple[Any, ...]) -> None:
    _, client, k, v = stored
    hm = np.zeros(H_Q, np.uint8)
    q_pos = np.full((H_KV, 1, D), BIG, np.float32)  # scores +-2e40 and NaN in fp32
    _close(
        client.execute_command("ATTEND.PREFIX.QUERY", "x", 0, H_KV, D, 1, _blob(q_pos)),
        reference(q_pos, k, v)[0],
    )
    q = np.full((H_Q, 2, D), BIG, np.float32)
    q[1] *= -1
    ks = np.full((H_KV, 3, D), BIG, np.float32)
    vs = RNG.standard_normal((H_KV, 3, D)).astype(np.float32)
    fused = ["ATTEND.PREFIX.QUERY_FUSED", "x", 0, H_Q, D, 3, H_KV]
    _close(
        client.execute_command(*fused, _blob(q), _blob(ks), _blob(vs), hm.tobytes()),
        reference(q, k, v, hm, k_suf=ks, v_suf=vs)[0],
    )
    q1 = q[:, 0]
    for selector, name in ((0, "block_mean"), (1, "quest")):
        keys = reference_blocks(q1, k, hm, block=2, top=1, selector=name)
        sparse = ["ATTEND.PREFIX.QUERY_SPARSE_AUTO", "x", 0, H_Q, D, 2, 1, H_KV, _blob(q1)]
        _close(
            client.execute_command(*sparse, hm.tobytes(), -1, selector),
            reference(q1[:, None], k, v, hm, keys=keys)[0][:, 0],
        )
        sparse_fused = ["ATTEND.PREFIX.QUERY_SPARSE_AUTO_FUSED", "x", 0, H_Q, D, 2, 1, H_KV, 3]
        _close(
            client.execute_command(
                *sparse_fused, _blob(q1), _blob(ks), _blob(vs), b"", -1, selector
            ),
            reference(q1[:, None], k, v, hm, keys=keys, k_suf=ks, v_suf=vs)[0][:, 0],
        )
    assert _internal_errors(client) == 0


def test_query_with_an_lse_trailer(stored: tuple[Any, ...]) -> None:
    _, client, k, v = stored
    # Scores that are NaN in fp32 but 0 (or ordinary) in float64: the LSE fits fp32 and
    # comes back with the output.
    q = np.tile(np.array([BIG, BIG, BIG, BIG], np.float32), (H_KV, 2, 1))
    k_mid = k.copy()
    k_mid[0, :2] = [BIG, -BIG, BIG, -BIG]
    assert client.execute_command(
        "ATTEND.PREFIX.STORE", "mid", 0, H_KV, N, D, _blob(k_mid), _blob(v)
    )
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "mid", 0, H_KV, D, 1, _blob(q))
    out, lse = reference(q, k_mid, v)
    got = np.frombuffer(raw, "<f4")
    np.testing.assert_allclose(got[: out.size].reshape(out.shape), out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[out.size :].reshape(lse.shape), lse, rtol=1e-5)
    # An LSE of 2e40 has no fp32 form: refused, saying why.
    with pytest.raises(redis.ResponseError, match="log-sum-exp of the attention scores overflows"):
        client.execute_command("ATTEND.PREFIX.QUERY", "x", 0, H_KV, D, 1, _blob(q))
    assert client.execute_command("ATTEND.PREFIX.LOOKUP", "x", 0) == b"HIT"
    assert _internal_errors(client) == 0


def test_the_binary_lane(stored: tuple[Any, ...]) -> None:
    server, client, k, v = stored
    q = np.full((H_Q, 2, D), -BIG, np.float32)
    empty = np.zeros((H_KV, 0, D), np.float32)
    hm = np.zeros(H_Q, np.uint8)
    body = struct.pack("<H", 1) + b"x" + struct.pack("<HHHHII", 0, H_Q, D, H_KV, 2, 0)
    body += _blob(q) + _blob(empty) + _blob(empty) + hm.tobytes()
    with socket.create_connection(("127.0.0.1", server.binary_port), timeout=30) as sock:
        sock.sendall(HEADER.pack(MAGIC, OP_QUERY_FUSED, len(body)) + body)
        reader = sock.makefile("rb")
        magic, status, size = HEADER.unpack(reader.read(HEADER.size))
        reply = reader.read(size)
    assert (magic, status) == (MAGIC, STATUS_OK), reply
    _close(reply, reference(q, k, v, hm)[0])
    assert _internal_errors(client) == 0


def test_kernel_huge_values_across_blocks_and_gqa_orders() -> None:
    """The float64 pass in the kernel itself: several key blocks, a non-uniform head
    map, V rows near fp32's largest value (whose unnormalised sum overflows fp32)."""
    k = RNG.standard_normal((2, 40, D)).astype(np.float32)
    k[:, ::7] = BIG
    v = RNG.standard_normal((2, 40, D)).astype(np.float32)
    v[:, ::3] = 3e38
    q = RNG.standard_normal((4, 3, D)).astype(np.float32) * np.float32(BIG)
    hm = np.array([1, 0, 0, 0])
    for score_bytes in (64, 1 << 20):
        got = attend(q, k, v, head_map=hm, score_bytes=score_bytes)
        out, _ = reference(q, k, v, hm)
        assert np.isfinite(got.out).all()
        np.testing.assert_allclose(got.out, out, rtol=1e-5, atol=1e-5)
    small = RNG.standard_normal((4, 3, D)).astype(np.float32)
    got = attend(small, k, v, head_map=hm)
    np.testing.assert_allclose(got.lse, reference(small, k, v, hm)[1], rtol=1e-5)
    q1 = q[:, 0]
    for name in ("block_mean", "quest"):
        want = reference_blocks(q1, k, hm, block=5, top=2, selector=name)
        got_keys = select_blocks(q1, k, head_map=hm, block=5, top=2, selector=name)  # type: ignore[arg-type]
        np.testing.assert_array_equal(got_keys, want)
