"""Random store/fetch sequences against a plain numpy model of the V-store (fp16 layers,
exact values): growth, overwrites, zero fill, views held across writes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.config import VStoreLimits
from pion.vstore import GROWTH
from support import make_store

MAX_ROWS, DIM, LAYERS = 300, 4, 3

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("store"),
            st.integers(0, LAYERS - 1),
            st.integers(0, MAX_ROWS - 1),
            st.integers(1, 80),
        ),
        st.tuples(
            st.just("fetch"),
            st.integers(0, LAYERS - 1),
            st.integers(0, MAX_ROWS - 1),
            st.integers(1, 120),
        ),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_store_matches_a_numpy_model(seq: list[tuple[str, int, int, int]]) -> None:
    vs = make_store(limits=VStoreLimits(max_rows=MAX_ROWS))
    vs.create(b"s", DIM, "fp16")
    model = np.zeros((LAYERS, MAX_ROWS, DIM), dtype=np.float32)
    tpl = [0] * LAYERS
    held: list[tuple[np.ndarray, np.ndarray]] = []  # (view, its value when fetched)
    counter = 0
    for op, layer, start, n in seq:
        end = min(MAX_ROWS, start + n)
        if op == "store":
            counter += 1
            values = np.full((end - start, DIM), counter, dtype=np.float32)
            vs.store(b"s", layer, start, values)
            model[layer, start:end] = counter
            tpl[layer] = max(tpl[layer], end)
        else:
            got = vs.fetch_range(b"s", layer, start, end, native=True)
            if tpl[layer] == 0 or start >= tpl[layer]:
                assert got is None
            else:
                assert got is not None
                np.testing.assert_array_equal(got.astype(np.float32), model[layer, start:end])
                held.append((got, got.copy()))
    for view, value in held:  # copy-on-write kept every reply as it was sent
        np.testing.assert_array_equal(view, value)
    assert vs.vstore_bytes == sum(tpl) * DIM * 2
    assert vs.total_tokens == sum(tpl)
    assert vs.bytes_allocated <= GROWTH * vs.vstore_bytes
