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
