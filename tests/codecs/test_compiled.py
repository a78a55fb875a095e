"""The compiled twins of the block codecs (src/pion/codecs/_quant.c) against their
numpy references: the same bytes from encode, the same fp32 bits from decode, the same
error (type and text) for a value a format refuses, on random, adversarial and
hypothesis-drawn input. The reference is the codec with its twin switched off."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pion.codecs import Codec, get_codec
from pion.codecs import compiled as compiled_module
from pion.errors import CodecError

FORMATS = ("int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2", "bf16_rope_fp8_body")
# Around every block size (32, 128) and the odd tails.
DIMS = (1, 7, 31, 32, 33, 100, 127, 128, 129, 200, 1024)
SPECIAL = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -2.5,
    1e-45,  # the smallest fp32 subnormal
    -1e-40,
    1e-38,
    6e-8,  # fp16 subnormal range
    3e-5,
    65504.0,
    -65504.0,
    65520.0,
    8.3e6,
    1e20,
    3.4e38,
    -3.4e38,
)


def codec_of(name: str) -> Codec:
    """The codec; bf16_rope_fp8_body with rope 1 (its rope part in bf16, every dim
    from 2 up; dim 1 has no body and is left out for it)."""
    return get_codec(name, 1 if name == "bf16_rope_fp8_body" else 0)


def dims_of(name: str) -> tuple[int, ...]:
    return tuple(d for d in DIMS if d > 1) if name == "bf16_rope_fp8_body" else DIMS


def reference(codec: Codec) -> Codec:
    """The same codec with its compiled twin switched off: the numpy reference."""
    ref = copy.copy(codec)
    ref.compiled = False  # type: ignore[misc]
    return ref


def outcome(codec: Codec, x: np.ndarray) -> tuple[str, str | bytes]:
    try:
        with np.errstate(all="ignore"):  # the references' overflow warnings
            return "ok", codec.encode(x).tobytes()
    except CodecError as exc:
        return type(exc).__name__, exc.message


def decoded(codec: Codec, data: np.ndarray, dim: int) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN and inf in corrupt rows
        return codec.decode(data, dim)


def same_decode(name: str, got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, except turbo: it decodes through H128, a matrix product whose
    summation order is the BLAS kernel's (OpenBLAS picks one per processor, and
    ``OPENBLAS_CORETYPE`` overrides it), so the reference's last bits depend on the
    machine; there NaN at the same places and every other value within 2**-12 of the
    largest value decoded (the product cancels, so relative to the batch, not the value); a
    wrong centroid or scale is off by far more."""
    g, w = got.view(np.uint32), want.view(np.uint32)
    if not name.startswith("turbo"):
        return bool(np.array_equal(g, w))
    nan = np.isnan(want)
    if not np.array_equal(np.isnan(got), nan):
        return False
    same = (g == w) | nan
    a, b = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(b)
    scale = np.abs(np.where(finite, b, 0)).max(initial=0.0)
    with np.errstate(invalid="ignore"):
        close = finite & (np.abs(a - b) <= np.maximum(scale, np.abs(b)) * 2.0**-12)
    return bool(np.all(same | close))


def test_compiled_twin_is_built_where_required() -> None:
    """`make test` builds the compiled twins and sets PION_REQUIRE_SPEEDUPS."""
    if os.environ.get("PION_REQUIRE_SPEEDUPS") == "1":
        assert compiled_module.COMPILED, "pion.codecs._quant is not built: scripts/build-speedups"
        for name in FORMATS:
            assert codec_of(name).compiled


@pytest.mark.parametrize("name", FORMATS)
def test_random_rows_encode_and_decode_the_same(name: str) -> None:
    codec = codec_of(name)
    ref = reference(codec)
    rng = np.random.default_rng(20260424)
    for dim in dims_of(name):
        n = 40
        cases = [
            rng.standard_normal((n, dim)),
            # scales from 1e-30 to 1e+6 per row: tiny, huge and everything between
            rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-30, 6, (n, 1)),
            # exact halves and quarters: rounding ties everywhere
            rng.integers(-64, 64, (n, dim)) / 4,
            # subnormal fp32 values, and rows of all zeros (and of -0.0)
            rng.standard_normal((n, dim)) * 1e-39,
            np.zeros((n, dim)),
            np.full((n, dim), -0.0),
            rng.choice(np.array(SPECIAL), (n, dim)),
        ]
        for case in cases:
            x = case.astype(np.float32)
            for row in range(n):  # row by row: a refused row must not hide the others
                one = x[row : row + 1]
                got, want = outcome(codec, one), outcome(ref, one)
                assert got == want, (dim, row, one)
                if got[0] == "ok":
                    data = codec.encode(one)
                    assert same_decode(name, decoded(codec, data, dim), decoded(ref, data, dim))


@pytest.mark.parametrize("name", FORMATS)
def test_any_stored_bytes_decode_the_same(name: str) -> None:
    """Stored rows may hold any bits (the tier fills them verbatim): NaN and inf
    scales, norms and codes decode as the numpy reference decodes them."""
    codec = codec_of(name)
    ref = reference(codec)
    rng = np.random.default_rng(7)
    for dim in dims_of(name):
        data = rng.integers(0, 256, (64, codec.row_bytes(dim)), dtype=np.uint8)
        assert same_decode(name, decoded(codec, data, dim), decoded(ref, data, dim))


@settings(deadline=None, max_examples=150)
@given(
    st.sampled_from(FORMATS),
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.sampled_from(DIMS[1:])),
        elements=st.one_of(
            st.floats(-1e3, 1e3, width=32),
            st.floats(width=32),  # NaN, inf, subnormals, the whole range
            st.sampled_from(SPECIAL).map(np.float32),
        ),
    ),
)
def test_hypothesis_same_bytes_or_same_error(name: str, x: np.ndarray) -> None:
    codec = codec_of(name)
    got, want = outcome(codec, x), outcome(reference(codec), x)
    assert got == want


@pytest.mark.parametrize("name", FORMATS)
def test_encode_and_decode_into_given_rows(name: str) -> None:
    codec = codec_of(name)
    x = np.random.default_rng(3).standard_normal((9, 200)).astype(np.float32)
    out = np.full((9, codec.row_bytes(200)), 0xAA, np.uint8)
    assert codec.encode(x, out=out) is out
    assert out.tobytes() == reference(codec).encode(x).tobytes()
    back = np.empty((9, 200), np.float32)
    assert codec.decode(out, 200, out=back) is back
    assert same_decode(name, back, reference(codec).decode(out, 200))
    with pytest.raises(CodecError, match="out must be C-contiguous uint8"):
        codec.encode(x, out=np.empty((8, codec.row_bytes(200)), np.uint8))
    with pytest.raises(CodecError, match="out must be C-contiguous float32"):
        codec.decode(out, 200, out=np.empty((9, 201), np.float32))


def test_the_twin_checks_its_buffers() -> None:
    quant = compiled_module.quant
    if quant is None:  # nothing to check; under PION_REQUIRE_SPEEDUPS the test above fails
        return
    with pytest.raises(ValueError, match="different row counts"):
        quant.int8_encode(np.zeros(64, np.float32), np.zeros(33, np.uint8), 32)
    with pytest.raises(ValueError, match="dim out of range"):
        quant.fp8_encode(np.zeros(64, np.float32), np.zeros(68, np.uint8), 0)
    with pytest.raises(ValueError, match="wrong size"):
        quant.turbo_decode(np.zeros(34, np.uint8), np.zeros(128, np.float32), 128, b"x")


def test_bf16_rope_body_in_slices() -> None:
    """Many rows (the body goes through fp8's twin in slices of 256 KiB of input) at
    rope 64, the layout of the benchmark: the reference's bytes and values."""
    codec = get_codec("bf16_rope_fp8_body", 64)
    assert codec.compiled == compiled_module.COMPILED
    x = np.random.default_rng(11).standard_normal((700, 1000)).astype(np.float32)
    x[3, :64] *= 1e30  # the rope part has the range of fp32
    data = codec.encode(x)
    assert data.tobytes() == reference(codec).encode(x).tobytes()
    assert same_decode("bf16", codec.decode(data, 1000), reference(codec).decode(data, 1000))
    x[650, 700] = np.nan
    with pytest.raises(CodecError, match="non-finite value at row 650"):
        codec.encode(x)
