"""Copy-on-write of a layer's buffer: a view handed to a reader never changes under it,
and once no reader holds one, writes go in place again."""

from __future__ import annotations

import gc

import numpy as np

from pion.codecs import get_codec
from pion.vstore.layer import Layer


def _rows(n: int, dim: int, value: float) -> np.ndarray:
    codec = get_codec("fp16")
    return codec.encode(np.full((n, dim), value, dtype=np.float32))


def test_a_lent_view_keeps_its_bytes_and_a_released_one_lets_writes_go_in_place() -> None:
    layer = Layer(get_codec("fp16"), 8)
    layer.write(0, _rows(4, 8, 1.0), 100)
    view = layer.read(0, 4, native=True)
    before = view.copy()
    buf = layer.buf
    layer.write(0, _rows(4, 8, 2.0), 100)
    assert layer.buf is not buf  # moved to a fresh copy: the reader was alive
    np.testing.assert_array_equal(view, before)
    assert layer.read(0, 4, native=False)[0, 0] == 2.0

    del view
    gc.collect()
    buf = layer.buf
    layer.write(0, _rows(4, 8, 3.0), 100)
    assert layer.buf is buf  # nobody holds a view: written in place


def test_a_reply_memoryview_keeps_the_lease() -> None:
    layer = Layer(get_codec("fp16"), 8)
    layer.write(0, _rows(2, 8, 1.0), 100)
    wire = np.ascontiguousarray(layer.read(0, 2, native=True)).data.cast("B")  # as V.FETCH
    before = bytes(wire)
    layer.write(0, _rows(2, 8, 5.0), 100)
    assert bytes(wire) == before
