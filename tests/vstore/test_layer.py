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


def _buf(layer: Layer) -> np.ndarray:
    """The buffer of a layer written as one run."""
    assert len(layer.runs) == 1
    return layer.runs[0].buf


def test_a_lent_view_keeps_its_bytes_and_a_released_one_lets_writes_go_in_place() -> None:
    layer = Layer(get_codec("fp16"), 8)
    layer.write(0, _rows(4, 8, 1.0), 100)
    view = layer.read(0, 4, native=True)
    before = view.copy()
    buf = _buf(layer)
    layer.write(0, _rows(4, 8, 2.0), 100)
    assert _buf(layer) is not buf  # moved to a fresh copy: the reader was alive
    np.testing.assert_array_equal(view, before)
    assert layer.read(0, 4, native=False)[0, 0] == 2.0

    del view
    gc.collect()
    buf = _buf(layer)
    layer.write(0, _rows(4, 8, 3.0), 100)
    assert _buf(layer) is buf  # nobody holds a view: written in place


def test_a_reply_memoryview_keeps_the_lease() -> None:
    layer = Layer(get_codec("fp16"), 8)
    layer.write(0, _rows(2, 8, 1.0), 100)
    wire = np.ascontiguousarray(layer.read(0, 2, native=True)).data.cast("B")  # as V.FETCH
    before = bytes(wire)
    layer.write(0, _rows(2, 8, 5.0), 100)
    assert bytes(wire) == before


def _spans(layer: Layer) -> list[tuple[int, int, int, int]]:
    return [(r.base, r.lo, r.hi, r.top) for r in layer.runs]


def _sparse() -> Layer:
    """Runs holding rows 0..10, 50..60 and 100..110 (each exactly its rows)."""
    layer = Layer(get_codec("fp16"), 8)
    for start in (0, 50, 100):
        layer.write(start, _rows(10, 8, float(start + 1)), 1000)
    assert _spans(layer) == [(0, 0, 10, 10), (50, 50, 60, 60), (100, 100, 110, 110)]
    return layer


def test_truncate_drops_runs_above_cuts_the_one_across_and_keeps_the_ones_below() -> None:
    layer = _sparse()
    assert layer.truncate(110) == 0 and layer.truncate(500) == 0  # never grows
    assert layer.truncate(55) == 5 + 10
    assert _spans(layer) == [(0, 0, 10, 10), (50, 50, 55, 60)]
    assert (layer.tpl, layer.held) == (55, 15)
    assert not layer.runs[1].buf[5:].any()  # cut rows are zero bytes again
    got = layer.read(0, 60, native=False)
    assert (got[:10] == 1.0).all() and not got[10:50].any()
    assert (got[50:55] == 51.0).all() and not got[55:].any()


def test_truncate_inside_a_hole_leaves_the_rows_below_it() -> None:
    layer = _sparse()
    assert layer.truncate(30) == 20
    assert _spans(layer) == [(0, 0, 10, 10)]
    assert (layer.tpl, layer.held) == (10, 10)  # tpl is the last held row, not the cut
    assert layer.truncate(0) == 10
    assert (layer.runs, layer.tpl, layer.held, layer.allocated) == ([], 0, 0, 0)


def test_truncate_of_more_than_half_a_run_moves_it_to_a_small_buffer() -> None:
    layer = Layer(get_codec("fp16"), 8)
    layer.write(0, _rows(100, 8, 1.0), 1000)
    layer.write(100, _rows(100, 8, 2.0), 1000)  # one run of 200 live rows + 50 slack
    assert _spans(layer) == [(0, 0, 200, 250)]
    assert layer.truncate(40) == 160
    assert _spans(layer) == [(0, 0, 40, 50)]  # GROWTH x the 40 rows left
    assert (layer.read(0, 40, native=False) == 1.0).all()


def test_truncate_never_writes_a_buffer_a_reader_holds() -> None:
    layer = Layer(get_codec("fp16"), 8)
    layer.write(0, _rows(100, 8, 1.0), 1000)
    layer.write(100, _rows(20, 8, 2.0), 1000)  # 120 live rows in a 150-row run
    run = layer.runs[0]
    view = layer.read(90, 120, native=True)  # a view of the run's buffer
    before = view.copy()
    assert layer.truncate(100) == 20  # a small cut, in place but for the reader
    assert layer.runs[0] is not run and layer.runs[0].buf is not run.buf
    np.testing.assert_array_equal(view, before)
    assert _spans(layer) == [(0, 0, 100, 150)]
    assert not layer.runs[0].buf[100:].any()

    del view
    gc.collect()
    run = layer.runs[0]
    layer.write(100, _rows(20, 8, 3.0), 1000)
    assert layer.truncate(100) == 20
    assert layer.runs == [run] and not run.buf[100:].any()  # nobody reads: in place
