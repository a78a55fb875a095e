"""What a large V.STOREBATCH allocates while it is quantized, per format, measured with
tracemalloc (numpy reports its buffers to it): the encode temporaries of a store stay
within ENCODE_TEMPORARIES slices beyond the stored rows, however large the batch (it is
encoded in slices), which is the part of the documented in-flight bound
(``store_in_flight_bound``) that depends on the format. Allocation sizes do not depend
on the machine's load, so these figures are exact, unlike RSS (bench/)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from pion.codecs import FORMAT_NAMES, get_codec
from pion.commands.vstore import ENCODE_TEMPORARIES, store_in_flight_bound
from pion.vstore import ENCODE_CHUNK_BYTES, encode_for


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("rows", [512, 4096])  # 2 MiB and 16 MiB of fp32 at dim 1024
def test_encode_temporaries_are_bounded_by_slices(fmt: str, rows: int) -> None:
    data = np.random.default_rng(0).standard_normal((rows, 1024)).astype("<f4")
    codec = get_codec(fmt)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _, encoded = encode_for(codec, data, 0, 0)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    beyond_output = peak - encoded.nbytes
    assert beyond_output <= ENCODE_TEMPORARIES * ENCODE_CHUNK_BYTES
    # Never a whole fp32-sized copy of a big batch (the batch is 16 MiB).
    if rows == 4096:
        assert beyond_output < data.nbytes


def test_in_flight_bound_formula() -> None:
    """Two blobs, twice the stored rows, the slice temporaries, two receive buffers."""
    blob, stored = 8 << 20, 4 << 20
    bound = store_in_flight_bound(blob, stored)
    assert bound == 2 * blob + 2 * stored + ENCODE_TEMPORARIES * ENCODE_CHUNK_BYTES + (512 << 10)
