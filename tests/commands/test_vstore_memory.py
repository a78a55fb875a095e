"""What a large V.STOREBATCH allocates while it is quantized, per format, measured with
tracemalloc (numpy reports its buffers to it): the compiled codecs encode in place into
the stored rows and allocate nothing else of any size; the numpy references' encode
temporaries stay within ENCODE_TEMPORARIES slices beyond the stored rows, however large
the batch (it is encoded in slices). That is the part of the documented in-flight
bound (``store_in_flight_bound``) that depends on the format. Allocation sizes do not
depend on the machine's load, so these figures are exact, unlike RSS (bench/)."""

from __future__ import annotations

import copy
import tracemalloc
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest

from pion.codecs import FORMAT_NAMES, get_codec
from pion.commands.vstore import ENCODE_TEMPORARIES, _encode_work, store_in_flight_bound
from pion.resp.decoder import SCRATCH_BYTES
from pion.vstore import ENCODE_CHUNK_BYTES, encode_for

T = TypeVar("T")
# numpy's per-call bookkeeping (row maxima and the like), far below one row block.
SMALL = 256 << 10


def _traced(work: Callable[[], T]) -> tuple[int, T]:
    """``work()``'s result and the most it had allocated at once."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = work()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, result


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("rows", [512, 4096])  # 2 MiB and 16 MiB of fp32 at dim 1024
def test_numpy_encode_temporaries_are_bounded_by_slices(fmt: str, rows: int) -> None:
    data = np.random.default_rng(0).standard_normal((rows, 1024)).astype("<f4")
    codec = copy.copy(get_codec(fmt))
    codec.compiled = False  # type: ignore[misc]  # the numpy reference
    peak, (_, encoded) = _traced(lambda: encode_for(codec, data, 0, 0))
    beyond_output = peak - encoded.nbytes
    assert beyond_output <= ENCODE_TEMPORARIES * ENCODE_CHUNK_BYTES
    # Never a whole fp32-sized copy of a big batch (the batch is 16 MiB).
    if rows == 4096:
        assert beyond_output < data.nbytes


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_compiled_store_encodes_in_place(fmt: str) -> None:
    """An offloaded store's work (all its row blocks) allocates the stored rows and
    nothing else of any size: they are encoded into the array the layer keeps."""
    codec = get_codec(fmt)
    assert codec.compiled  # make test builds the twins (test_compiled.py requires them)
    data = np.random.default_rng(1).standard_normal((4096, 1024)).astype("<f4")
    work = _encode_work(codec, data, 0, 0)
    assert len(work.parts) == 8  # 16 MiB in blocks of 2 MiB, for the pool to spread
    peak, (tagged, encoded) = _traced(work)
    assert tagged is codec
    assert peak - encoded.nbytes <= SMALL
    assert encoded.tobytes() == codec.encode(data).tobytes()


def test_in_flight_bound_formula() -> None:
    """Two blobs, one command's stored rows, two receive buffers; the numpy
    references add the rows' second copy and one slice's temporaries."""
    blob, stored = 8 << 20, 4 << 20
    bound = store_in_flight_bound(blob, stored)
    assert bound == 2 * blob + stored + 2 * SCRATCH_BYTES
    assert store_in_flight_bound(blob, stored, compiled=False) == (
        bound + stored + ENCODE_TEMPORARIES * ENCODE_CHUNK_BYTES
    )
