"""turbo4/3/2 (src/pion/codecs/turbo.py) against a plain fp64 reference of the format
in docs/protocol.md ("Storage formats")."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from pion.codecs import CodecValueError, get_codec
from pion.codecs.turbo import CENTROIDS, GROUP, S1, S2, SIGN_SEED, hadamard

TURBO = ("turbo4", "turbo3", "turbo2")
BITS = {"turbo4": 4, "turbo3": 3, "turbo2": 2}


def sylvester(n: int) -> np.ndarray:
    return np.array(
        [[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], np.float64
    )


H = sylvester(GROUP)
ROTATION = np.diag(S2.astype(np.float64)) @ (H / math.sqrt(GROUP)) @ np.diag(S1.astype(np.float64))


def pack_ref(bits: int, codes: list[int]) -> bytes:
    """The byte layout of the module docstring, written out one field at a time."""
    if bits == 4:
        return bytes(codes[i] | codes[i + 1] << 4 for i in range(0, GROUP, 2))
    if bits == 2:
        return bytes(
            codes[i] | codes[i + 1] << 2 | codes[i + 2] << 4 | codes[i + 3] << 6
            for i in range(0, GROUP, 4)
        )
    mags = [c & 3 for c in codes]
    signs = [c >> 2 for c in codes]
    plane = bytes(
        mags[i] | mags[i + 1] << 2 | mags[i + 2] << 4 | mags[i + 3] << 6 for i in range(0, GROUP, 4)
    )
    sign_plane = bytes(sum(signs[i + k] << k for k in range(8)) for i in range(0, GROUP, 8))
    return plane + sign_plane


def encode_ref(x: np.ndarray, bits: int) -> tuple[bytes, list[float], float]:
    """(payload bytes, stored norms, smallest distance of any |y_j| to a midpoint)."""
    c = np.array(CENTROIDS[bits], np.float64)
    values = np.concatenate([c, -c])  # code k < K: +c_k; code K + k: -c_k
    mids = (c[:-1] + c[1:]) / 2
    n, dim = x.shape
    g = -(-dim // GROUP)
    padded = np.zeros((n, g * GROUP))
    padded[:, :dim] = x
    payload, norms, margin = b"", [], np.inf
    for group in padded.reshape(n * g, GROUP):
        nrm = float(np.linalg.norm(group))
        y = ROTATION @ (group / nrm if nrm else group)
        codes = [int(np.argmin(np.abs(values - v))) for v in y]
        codes = [k if k < len(c) else (1 << (bits - 1)) | (k - len(c)) for k in codes]
        chosen = np.array([values[k % len(c)] for k in codes])
        norms.append(nrm / float(np.linalg.norm(chosen)))
        payload += pack_ref(bits, codes)
        margin = min(margin, float(np.abs(np.abs(y)[:, None] - mids[None, :]).min()))
    return payload, norms, margin


def decode_ref(norms: list[float], x_codes: np.ndarray, bits: int) -> np.ndarray:
    c = np.array(CENTROIDS[bits], np.float64)
    k = len(c)
    vals = np.where(x_codes >> (bits - 1), -c[x_codes % k], c[x_codes % k])
    return np.array([ROTATION.T @ (nrm * v) for nrm, v in zip(norms, vals, strict=True)])


def test_sign_vectors_come_from_the_documented_seed() -> None:
    bits = np.random.default_rng(SIGN_SEED).integers(0, 2, size=(2, 128), dtype=np.uint8)
    assert np.array_equal(S1, 1 - 2 * bits[0].astype(np.float32))
    assert np.array_equal(S2, 1 - 2 * bits[1].astype(np.float32))


def test_sign_vectors_are_frozen() -> None:
    # The hex constants are the definition; this pins them independently of numpy.
    as_int = [sum(1 << j for j in range(128) if s[j] < 0) for s in (S1, S2)]
    assert as_int == [0xDC6A0FB00947153911846B361CF6317D, 0x0333986169B6E4F4FE38194EB9DA8699]


def test_hadamard_is_sylvester() -> None:
    x = np.random.default_rng(0).standard_normal((300, GROUP)).astype(np.float32)
    np.testing.assert_allclose(hadamard(x), x.astype(np.float64) @ H.T, rtol=0, atol=1e-4)
    assert np.array_equal(hadamard(np.eye(GROUP, dtype=np.float32)), H.astype(np.float32))


def test_rotation_is_orthonormal() -> None:
    np.testing.assert_allclose(ROTATION @ ROTATION.T, np.eye(GROUP), atol=1e-12)


@pytest.mark.parametrize("name", TURBO)
@pytest.mark.parametrize("dim", [128, 300])
def test_matches_fp64_reference(name: str, dim: int) -> None:
    bits = BITS[name]
    codec = get_codec(name)
    x = np.random.default_rng(dim + bits).standard_normal((5, dim)).astype(np.float32)
    x[1, :7] *= 40  # outliers
    x[2] = 0.0
    payload, norms, margin = encode_ref(x, bits)
    # Exact code equality is only meaningful away from centroid midpoints, where fp32
    # and fp64 rotations cannot disagree: this data was chosen to keep a clear margin.
    assert margin > 1e-6  # fp32 rotation error is ~1e-8 here
    data = codec.encode(x)
    g = -(-dim // GROUP)
    blocks = data.reshape(5 * g, -1)
    assert blocks[:, 2:].tobytes() == payload
    stored = blocks[:, :2].copy().view("<f2").astype(np.float64)[:, 0]
    np.testing.assert_allclose(stored, norms, rtol=2**-11)
    # Decode: inverse rotation of stored_norm * C[idx], padding dropped.
    codes_ref = codec_codes(blocks[:, 2:], bits)
    want = decode_ref(list(stored), codes_ref, bits).reshape(5, g * GROUP)[:, :dim]
    np.testing.assert_allclose(codec.decode(data, dim), want, rtol=1e-6, atol=1e-5)


def codec_codes(payload: np.ndarray, bits: int) -> np.ndarray:
    """Unpack codes from payload bytes, straight from the documented layout."""
    out = np.zeros((payload.shape[0], GROUP), np.int64)
    for r, row in enumerate(payload):
        for j in range(GROUP):
            if bits == 4:
                out[r, j] = row[j // 2] >> (4 * (j % 2)) & 15
            elif bits == 2:
                out[r, j] = row[j // 4] >> (2 * (j % 4)) & 3
            else:
                mag = row[j // 4] >> (2 * (j % 4)) & 3
                sign = row[32 + j // 8] >> (j % 8) & 1
                out[r, j] = sign << 2 | mag
    return out


@pytest.mark.parametrize("name", TURBO)
def test_decoded_groups_keep_their_norm(name: str) -> None:
    codec = get_codec(name)
    x = np.random.default_rng(3).standard_normal((50, 256)).astype(np.float32) * 7
    y = codec.decode(codec.encode(x), 256)
    nx = np.linalg.norm(x.reshape(100, GROUP), axis=1)
    ny = np.linalg.norm(y.reshape(100, GROUP), axis=1)
    np.testing.assert_allclose(ny, nx, rtol=1e-3)  # fp16 rounding of the stored norm


@pytest.mark.parametrize("name", TURBO)
def test_one_hot_input_is_exact(name: str) -> None:
    # A one-hot group rotates to +-1/sqrt(128) everywhere: one centroid fits all.
    codec = get_codec(name)
    x = np.zeros((1, GROUP), np.float32)
    x[0, 17] = 3.0
    np.testing.assert_allclose(codec.decode(codec.encode(x), GROUP), x, atol=3e-3)


@pytest.mark.parametrize("name", TURBO)
def test_group_norm_overflow_is_refused(name: str) -> None:
    codec = get_codec(name)
    x = np.ones((3, 256), np.float32)
    # Group norm 20000 * sqrt(128) = 226274; the stored norm n / ||C[idx]|| exceeds 65504
    # whatever the codes, since ||C[idx]|| <= sqrt(128) * (largest centroid) < 2.8.
    x[1, 128:] = 20000.0
    with pytest.raises(CodecValueError) as err:
        codec.encode(x)
    assert err.value.row == 1
    # The message names what overflows: the stored norm n / ||C[idx]|| of group 1,
    # not the input's group norm (which alone says nothing about fp16's range).
    m = re.fullmatch(
        rf"stored norm (\S+) of group 1 at row 1 overflows the fp16 norm of {name}",
        err.value.message,
    )
    assert m is not None, err.value.message
    stored = float(m.group(1))
    # n / ||C[idx]||, where ||C[idx]|| is the quantized unit vector's norm (near 1).
    assert stored > 65504
    assert 0.8 < 226274 / stored < 1.25


@pytest.mark.parametrize("name", TURBO)
def test_huge_finite_values_are_an_overflow_not_a_crash(name: str) -> None:
    codec = get_codec(name)
    x = np.zeros((2, 128), np.float32)
    x[1, 0] = 3e38  # squares overflow fp32; the error still names a finite norm
    with pytest.raises(CodecValueError, match=r"stored norm \S+ of group 0 at row 1") as err:
        codec.encode(x)
    stored = float(err.value.message.split()[2])
    assert 65504 < stored < float("inf")


@pytest.mark.parametrize("name", TURBO)
def test_zero_padding_groups(name: str) -> None:
    # dim 129: the second group holds one value and 127 zeros.
    codec = get_codec(name)
    x = np.random.default_rng(5).standard_normal((4, 129)).astype(np.float32)
    data = codec.encode(x)
    assert data.shape == (4, 2 * codec.row_bytes(128))
    y = codec.decode(data, 129)
    np.testing.assert_allclose(np.abs(y[:, 128]), np.abs(x[:, 128]), rtol=2e-3)
