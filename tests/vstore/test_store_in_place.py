"""Stores keep the rows they encoded as the layer's buffer (VStore.store,
Layer.write(adopt=True)): a store that starts a run is encoded once, into its
destination rows, and never copied; a view of a request, rows handed in by a caller
(the tier's fill) and rows that extend a run are copied, as before."""

from __future__ import annotations

import numpy as np

from pion.codecs import get_codec
from pion.vstore import encode_for
from support import make_store, rows


def test_a_store_that_starts_a_run_keeps_its_encoded_rows() -> None:
    vs = make_store()
    vs.create(b"s", 64, "turbo3")
    data = rows(30, 64, 1)
    hint = encode_for(get_codec("turbo3"), data, 0, 0)
    vs.store(b"s", 0, 0, data, encoded=hint)
    (run,) = vs._sessions[b"s"].layers[0].runs
    assert run.buf is hint[1]  # the array the worker encoded into, uncopied
    np.testing.assert_array_equal(
        vs.fetch_range(b"s", 0, 0, 30), get_codec("turbo3").decode(hint[1], 64)
    )


def test_rows_that_extend_a_run_are_copied_into_it() -> None:
    vs = make_store()
    vs.create(b"s", 64, "int8")
    vs.store(b"s", 0, 0, rows(30, 64, 1))
    (run,) = vs._sessions[b"s"].layers[0].runs
    hint = encode_for(get_codec("int8"), rows(10, 64, 2), 0, 5)
    vs.store(b"s", 0, 5, rows(10, 64, 2), encoded=hint)  # inside the run: in place
    (after,) = vs._sessions[b"s"].layers[0].runs
    assert after is run and after.buf is not hint[1]
    np.testing.assert_array_equal(after.buf[5:15], hint[1])


def test_verbatim_fp16_and_callers_rows_are_copied() -> None:
    vs = make_store()
    vs.create(b"h", 64, "fp16")
    blob = rows(8, 64, 3).astype("<f2")
    blob.flags.writeable = False  # as a request's bytes are
    vs.store(b"h", 0, 0, blob)
    (run,) = vs._sessions[b"h"].layers[0].runs
    assert run.buf.flags.writeable and not np.shares_memory(run.buf, blob)
    vs.create(b"e", 64, "int8")
    encoded = get_codec("int8").encode(rows(8, 64, 4))
    vs.store_encoded(b"e", 0, 0, encoded)
    (run,) = vs._sessions[b"e"].layers[0].runs
    assert run.buf is not encoded and not np.shares_memory(run.buf, encoded)
