"""fp16 (src/pion/codecs/fp16.py): numpy's float16 cast, verbatim, range-checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pion.codecs import CodecValueError, get_codec
from pion.codecs.base import FP16_MAX

codec = get_codec("fp16")


@settings(deadline=None)
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=2, max_dims=2, max_side=40),
        elements=st.floats(-FP16_MAX, FP16_MAX, width=32),
    )
)
def test_equals_numpy_cast(x: np.ndarray) -> None:
    data = codec.encode(x)
    assert data.tobytes() == x.astype("<f2").tobytes()
    assert np.array_equal(codec.decode(data, x.shape[1]), x.astype(np.float16).astype(np.float32))


def test_layout_is_little_endian_halves() -> None:
    data = codec.encode(np.array([[1.0, -2.0, 65504.0]], np.float32))
    assert data.tobytes() == bytes.fromhex("003c00c0ff7b")


def test_fp16_max_is_stored() -> None:
    x = np.array([[FP16_MAX, -FP16_MAX]], np.float32)
    assert np.array_equal(codec.decode(codec.encode(x), 2), x)


@pytest.mark.parametrize("v", [np.nextafter(np.float32(FP16_MAX), np.float32(np.inf)), 1e6, -7e4])
def test_beyond_fp16_is_refused(v: float) -> None:
    # Even 65504.004, which numpy would round down to 65504, is refused: one rule.
    x = np.zeros((4, 10), np.float32)
    x[2, 3] = v
    with pytest.raises(CodecValueError) as err:
        codec.encode(x)
    assert err.value.row == 2
    assert err.value.message == f"value {abs(float(np.float32(v))):g} at row 2 overflows fp16"


def test_message_matches_the_documented_example() -> None:
    x = np.zeros((3, 4), np.float32)
    x[2, 0] = 1e6
    with pytest.raises(CodecValueError, match=r"^value 1e\+06 at row 2 overflows fp16$"):
        codec.encode(x)


# -- the compiled casts (pion/codecs/_speedups.c) -----------------------------------


def test_compiled_casts_equal_numpy_on_a_dense_sample() -> None:
    """Every 97th fp32 bit pattern within +-65504 (24.7 million values, every exponent,
    subnormals included) casts to the same half as numpy's; every half widens to the
    same fp32. (Checked on all 2**32 patterns when written.) Without the compiled twin
    the codec casts with numpy, and this holds the codec to numpy the same way."""
    from pion.codecs import fp16

    x = np.arange(0, 2**32, 97, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) <= FP16_MAX)]
    halves = np.arange(65536, dtype="<u2")
    wide = halves.view("<f2").astype(np.float32)
    if fp16._to_f16 is not None and fp16._from_f16 is not None:
        out = np.empty(x.shape, "<u2")
        assert fp16._to_f16(x, out)  # this machine has F16C
        assert np.array_equal(out, x.astype("<f2").view("<u2"))
        back = np.empty(65536, np.float32)
        assert fp16._from_f16(halves, back)
        # Bit for bit, NaN payloads included (stored fp16 may be any bits).
        assert np.array_equal(back.view(np.uint32), wide.view(np.uint32))
    rows = x[: (x.size // 1000) * 1000].reshape(-1, 1000)
    assert np.array_equal(codec.encode(rows), rows.astype("<f2").view(np.uint8))
    decoded = codec.decode(halves.view(np.uint8), 65536 // 8)  # 8 rows
    assert np.array_equal(decoded.reshape(-1).view(np.uint32), wide.view(np.uint32))


def test_compiled_casts_refuse_mismatched_buffers() -> None:
    from pion.codecs import fp16

    if fp16._to_f16 is None or fp16._from_f16 is None:
        assert not fp16.COMPILED
        return
    with pytest.raises(ValueError, match="different lengths"):
        fp16._to_f16(np.zeros(4, np.float32), np.zeros(3, "<u2"))
    with pytest.raises(ValueError, match="different lengths"):
        fp16._from_f16(np.zeros(4, "<u2"), np.zeros(5, np.float32))
    # Odd lengths (a tail shorter than one 8-value block) are whole results.
    x = np.arange(13, dtype=np.float32) / 7
    out = np.empty(13, "<u2")
    assert fp16._to_f16(x, out)
    assert np.array_equal(out, x.astype("<f2").view("<u2"))


def test_compiled_twin_is_built_where_required() -> None:
    """`make test` builds the compiled twins and sets PION_REQUIRE_SPEEDUPS."""
    import os

    from pion.codecs import fp16

    if os.environ.get("PION_REQUIRE_SPEEDUPS") == "1":
        assert fp16.COMPILED, "pion.codecs._speedups is not built: run scripts/build-speedups"
