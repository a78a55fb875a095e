"""ATTEND.PREFIX.* over real TCP with redis-py: every query form against the float64
reference, fa_window, the reply layouts (LSE trailer for M > 1), and every bad input
answered with its error while the server and the stored slots are unaffected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from pion.server.run import ServerThread
from support.attend import reference, reference_blocks

RNG = np.random.default_rng(5)
ATOL = 2e-5


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def blob(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def store(client: redis.Redis, sid: str, layer: int, k: np.ndarray, v: np.ndarray) -> None:
    h, n, d = k.shape
    assert client.execute_command("ATTEND.PREFIX.STORE", sid, layer, h, n, d, blob(k), blob(v))


def err(client: redis.Redis, *args: Any) -> str:
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return str(info.value)


def fused_args(
    sid: str, q: np.ndarray, ks: np.ndarray, vs: np.ndarray, hm: np.ndarray, *extra: Any
) -> list[Any]:
    h_q, _, d = q.shape
    h_kv, s_suf, _ = ks.shape
    return [
        "ATTEND.PREFIX.QUERY_FUSED",
        sid,
        0,
        h_q,
        d,
        s_suf,
        h_kv,
        blob(q),
        blob(ks),
        blob(vs),
        np.asarray(hm, np.uint8).tobytes(),
        *extra,
    ]


# -- STORE / LOOKUP / QUERY ------------------------------------------------------------


def test_query_m1_and_m_gt_1_with_the_lse_trailer(client: redis.Redis) -> None:
    k, v = rand(4, 120, 32), rand(4, 120, 32)
    store(client, "s", 3, k, v)
    assert client.execute_command("ATTEND.PREFIX.LOOKUP", "s", 3) == b"HIT"
    assert client.execute_command("ATTEND.PREFIX.LOOKUP", "s", 0) == b"MISS"
    q1 = rand(4, 1, 32)
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "s", 3, 4, 32, 1024, blob(q1))
    assert len(raw) == 4 * 32 * 4  # [H, D], no trailer for M = 1
    out, _ = reference(q1, k, v)
    np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(4, 32), out[:, 0], atol=ATOL)
    q = rand(4, 6, 32)
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "s", 3, 4, 32, 1, blob(q))
    assert len(raw) == 4 * 6 * 32 * 4 + 4 * 6 * 4
    body = np.frombuffer(raw, "<f4")
    out, lse = reference(q, k, v)
    np.testing.assert_allclose(body[: out.size].reshape(out.shape), out, atol=ATOL)
    np.testing.assert_allclose(body[out.size :].reshape(4, 6), lse, atol=ATOL)


def test_fa_window_default_override_and_full(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(fa_window=10)
    client = redis.Redis(port=server.port)
    k, v = rand(2, 80, 16), rand(2, 80, 16)
    store(client, "w", 0, k, v)
    q = rand(2, 1, 16)

    def run(*extra: Any) -> np.ndarray:
        raw = client.execute_command("ATTEND.PREFIX.QUERY", "w", 0, 2, 16, 5, blob(q), *extra)
        return np.frombuffer(raw, "<f4").reshape(2, 1, 16)

    for extra, window in [((), 10), ((-1,), 10), ((0,), 0), ((3,), 3), ((500,), 0)]:
        np.testing.assert_allclose(run(*extra), reference(q, k, v, window=window)[0], atol=ATOL)


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
@pytest.mark.parametrize("s_suf", [0, 5])
def test_query_fused_gqa(client: redis.Redis, ratio: int, s_suf: int) -> None:
    h_kv, d = 2, 16
    k, v = rand(h_kv, 64, d), rand(h_kv, 64, d)
    store(client, "f", 0, k, v)
    q, ks, vs = rand(h_kv * ratio, 4, d), rand(h_kv, s_suf, d), rand(h_kv, s_suf, d)
    hm = RNG.permutation(np.arange(h_kv * ratio) // ratio)
    raw = client.execute_command(*fused_args("f", q, ks, vs, hm, 20))
    want = reference(q, k, v, hm, window=20, k_suf=ks, v_suf=vs)[0]
    assert len(raw) == q.nbytes  # [H_q, M, D], no LSE
    np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(q.shape), want, atol=ATOL)


@pytest.mark.parametrize("selector", [0, 1])
@pytest.mark.parametrize("fused", [False, True])
def test_sparse_auto(client: redis.Redis, selector: int, fused: bool) -> None:
    h_kv, h_q, n, d, block, top = 2, 8, 300, 16, 32, 3
    k, v = rand(h_kv, n, d), rand(h_kv, n, d)
    store(client, "sp", 1, k, v)
    q, ks, vs = rand(h_q, d), rand(h_kv, 3, d), rand(h_kv, 3, d)
    hm = np.arange(h_q) // 4
    names = {0: "block_mean", 1: "quest"}
    keys = reference_blocks(q, k, hm, block=block, top=top, selector=names[selector])
    if fused:
        args: list[Any] = ["ATTEND.PREFIX.QUERY_SPARSE_AUTO_FUSED", "sp", 1, h_q, d, block, top]
        args += [h_kv, 3, blob(q), blob(ks), blob(vs), b"", -1, selector]
        want = reference(q[:, None], k, v, hm, keys=keys, k_suf=ks, v_suf=vs)[0]
    else:
        args = ["ATTEND.PREFIX.QUERY_SPARSE_AUTO", "sp", 1, h_q, d, block, top, h_kv, blob(q)]
        args += [hm.astype(np.uint8).tobytes(), -1, selector]
        want = reference(q[:, None], k, v, hm, keys=keys)[0]
    raw = client.execute_command(*args)
    np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(h_q, d), want[:, 0], atol=ATOL)


def test_store_replaces_and_drop_frees(client: redis.Redis) -> None:
    store(client, "r", 0, rand(1, 5, 8), rand(1, 5, 8))
    k, v = rand(2, 9, 4), rand(2, 9, 4)
    store(client, "r", 0, k, v)
    q = rand(2, 1, 4)
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "r", 0, 2, 4, 1, blob(q))
    np.testing.assert_allclose(np.frombuffer(raw, "<f4"), reference(q, k, v)[0].ravel(), atol=ATOL)
    store(client, "r", 1, k, v)
    assert client.execute_command("ATTEND.PREFIX.DROP", "r", 1) == 1
    assert client.execute_command("ATTEND.PREFIX.LOOKUP", "r", 1) == b"MISS"
    assert client.execute_command("ATTEND.PREFIX.DROP", "r") == 1
    assert client.execute_command("ATTEND.PREFIX.DROP", "r") == 0


def test_resp3_replies_are_bulk_strings(client3: redis.Redis) -> None:
    k, v = rand(2, 7, 8), rand(2, 7, 8)
    store(client3, "r3", 0, k, v)
    q = rand(2, 3, 8)
    raw = client3.execute_command("ATTEND.PREFIX.QUERY", "r3", 0, 2, 8, 1, blob(q))
    assert isinstance(raw, bytes) and len(raw) == q.nbytes + 2 * 3 * 4


# -- bad input -------------------------------------------------------------------------

H, N, D = 2, 10, 8
K0, V0 = rand(H, N, D), rand(H, N, D)
Q0 = rand(H, 1, D)
NAN_Q = Q0.copy()
NAN_Q[1, 0, 3] = np.nan
HM0 = np.array([0, 0, 1, 1], np.uint8).tobytes()
KS0 = rand(H, 2, D)

Q4 = blob(rand(4, 1, D))  # H_q = 4 queries for the GQA cases (H_kv = 2)
FUSED = ["ATTEND.PREFIX.QUERY_FUSED", "good", 0]
SPARSE = ["ATTEND.PREFIX.QUERY_SPARSE_AUTO", "good", 0, H, D]
QUERY = ["ATTEND.PREFIX.QUERY", "good", 0]
STORE = ["ATTEND.PREFIX.STORE", "b", 0]

BAD: list[tuple[list[Any], str]] = [
    ([*STORE, H, N, D, blob(K0)[:-4], blob(V0)], "blob size 636/640"),
    ([*STORE, H, N, 0, b"", b""], "invalid H/D"),
    ([*STORE, 0, N, D, b"", b""], "invalid H/D"),
    ([*STORE, H, 0, D, b"", b""], "invalid N"),
    (["ATTEND.PREFIX.STORE", "b", 70000, H, N, D, blob(K0), blob(V0)], "layer_id out of range"),
    ([*STORE, H, N, D, blob(K0 * np.inf), blob(V0)], "non-finite"),
    ([*STORE, "x", N, D, blob(K0), blob(V0)], "not an integer"),
    (["ATTEND.PREFIX.STORE", "", 0, H, N, D, blob(K0), blob(V0)], "session_id length"),
    ([*QUERY, H, D, 1, blob(Q0)[:-1]], "Q blob size 63"),
    ([*QUERY, H, D, 1, b""], "Q blob size 0"),  # M = 0
    ([*QUERY, H, 0, 1, b""], "invalid H/D"),  # D = 0
    ([*QUERY, H, D, 0, blob(Q0)], "invalid top_k"),
    ([*QUERY, H, D, 1, blob(NAN_Q)], "Q holds non-finite"),
    ([*QUERY, H, D, 1, blob(Q0), -2], "fa_window must be >= -1"),
    ([*QUERY, H, D, 1, blob(Q0), 0, "x"], "syntax error"),
    ([*QUERY, 4, 4, 1, blob(Q0)], "do not match the stored layer"),
    (["ATTEND.PREFIX.QUERY", "nope", 0, H, D, 1, blob(Q0)], "session not found"),
    ([*FUSED, 3, D, 0, 2, blob(rand(3, 1, D)), b"", b"", b"\0" * 3], "multiple of H_kv"),
    ([*FUSED, 4, D, 0, 2, Q4, b"", b"", b"\0\0\2\0"], "head_map value 2 out of range"),
    ([*FUSED, 4, D, 0, 2, Q4, b"", b"", b"\0"], "head_map blob size 1"),
    ([*FUSED, 4, D, 2, 2, Q4, blob(KS0), b"", HM0], "K_suf/V_suf blob size 128/0"),
    ([*FUSED, 4, D, 0, 2, b"", b"", b"", HM0], "Q blob size 0"),
    ([*FUSED, 4, D, 2, 2, Q4, blob(KS0 * np.nan), blob(KS0), HM0], "K_suf holds non-finite"),
    ([*FUSED, 4, D, 0, 4, Q4, b"", b"", HM0], "H=4, D=8 do not match"),
    ([*SPARSE, 0, 1, H, blob(Q0), b""], "invalid B/K_top"),
    ([*SPARSE, 4, 1, H, blob(Q0), b"", -1, 7], "selector_id must be 0"),
    ([*SPARSE, 4, 1, H, blob(rand(H, 2, D)), b""], "(M = 1)"),
    ([*SPARSE, 4, 1, H, blob(Q0), b"\0"], "head_map blob size 1 != 0 (identity)"),
    (["ATTEND.PREFIX.LOOKUP", "good", -1], "layer_id out of range"),
    ([*QUERY, H, D], "wrong number of arguments"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_input_is_refused_and_changes_nothing(
    client: redis.Redis, args: list[Any], message: str
) -> None:
    store(client, "good", 0, K0, V0)
    assert message in err(client, *args)
    assert client.execute_command("ATTEND.PREFIX.LOOKUP", "b", 0) == b"MISS"
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "good", 0, H, D, 1, blob(Q0))
    np.testing.assert_allclose(
        np.frombuffer(raw, "<f4"), reference(Q0, K0, V0)[0].ravel(), atol=ATOL
    )
    assert client.ping()


def test_a_missing_slot_is_err_with_pions_text(client: redis.Redis) -> None:
    assert err(client, "ATTEND.PREFIX.QUERY", "x", 0, H, D, 1, blob(Q0)) == (
        "ATTEND.PREFIX.QUERY failed (session not found, or unsupported D)"
    )


@pytest.mark.parametrize(
    "name",
    [
        "ATTEND.PREFIX.STORE",
        "ATTEND.PREFIX.LOOKUP",
        "ATTEND.PREFIX.QUERY",
        "ATTEND.PREFIX.QUERY_FUSED",
        "ATTEND.PREFIX.QUERY_SPARSE_AUTO",
        "ATTEND.PREFIX.QUERY_SPARSE_AUTO_FUSED",
        "ATTEND.PREFIX.DROP",
        "KV.PREFIX.WARM",
        "SSM.PREFIX.STORE",
        "SSM.PREFIX.FETCH",
        "SSM.PREFIX.DROP",
    ],
)
def test_random_arguments_never_reach_the_internal_error_path(
    client: redis.Redis, name: str
) -> None:
    """Hostile argument lists (numbers around every bound, random blobs, float-sized
    blobs full of garbage) get replies or errors, never `-ERR internal error`."""
    rng = np.random.default_rng(len(name))
    store(client, "good", 0, K0, V0)
    client.execute_command("KV.PREFIX.REGISTER", "good", H * D, "fp16")
    numbers = [-1, 0, 1, 2, 3, 4, 8, 16, 255, 256, 257, 65535, 65536, 2**31, 2**63 - 1]
    for _ in range(60):
        args: list[Any] = [rng.choice(["good", "good_attn", "x"]), int(rng.choice([0, 1]))]
        for _ in range(int(rng.integers(0, 13))):
            pick = rng.integers(0, 3)
            if pick == 0:
                args.append(int(rng.choice(numbers)))
            elif pick == 1:
                args.append(rng.bytes(int(rng.choice([0, 1, 4, 64, 128, 640]))))
            else:
                args.append(blob(rng.standard_normal(int(rng.choice([8, 16, 32, 80]))) * 1e30))
        try:
            client.execute_command(name, *args)
        except redis.ResponseError as exc:
            assert "internal error" not in str(exc), (name, args)
    assert client.info("stats")["total_internal_errors"] == 0
