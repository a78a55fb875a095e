"""Frozen bytes: these protect the on-disk formats. Never update a value to make a test pass.

A change here means data written by an earlier Pion would decode differently: that
needs a new format id (see src/pion/codecs/registry.py), not a new golden value.

The small literals for fp16, fp8, int8 and mlx4g32 were checked by hand against the
formulas in each module's docstring (worked through in comments below); the turbo ones
are pinned by the fp64 reference in test_turbo.py.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pion.codecs import FORMAT_NAMES, get_codec

SMALL = np.array([[0.5, -1.25, 3.0, 0.0, -0.001, 7.75, -2.5, 1.0]], np.float32)

SMALL_HEX = {
    # d = fp16(7.75/127) = 0x2bd0; q = roundf(x * 127/7.75) = 8 -20 49 0 0 127 -41 16
    "int8": "d02b08ec3100007fd710" + "00" * 24,
    "turbo4": "7a48"
    "23ccc014ab44c814abccc01c23cc4014abc4c89c23ccc0942bcc4094abc4401c2b44401c2b44481cab44"
    "401423cc489c234c489c2bccc014a34c4094a34cc894",
    "turbo3": "4a48"
    "a528a528a528a528a528a528a528a528a528a528a528a528a528a528a528a528"
    "2c336f0cfbac8d4b415103dcd42d86b6",
    "turbo2": "3647f11c5b1efb3cf114dbbef19cf394db34533453365b14f1b671b6f31c7994799e",
    # IEEE halves, little-endian
    "fp16": "003800bd004200001994c04700c1003c",
    # s = fp16(7.75/448) = 0x246e; 0.5/s = 28.9 -> 0x5e (28), -1.25/s -> 0xe9 (-72),
    # 7.75/s = 448.04 -> clipped to 448 = 0x7e, -0.001/s = -0.0578 -> 0x97
    "fp8": "6e245ee97300977ef166" + "00" * 24,
    # one group (8 values + 24 zero pads): edge 7.75, q0 = rint(7.75 / -(10.25/15)) = -11,
    # scale = 7.75/-11 = fp16 0xb9a3, bias = 7.75 = 0x47c0,
    # codes rint((7.75 - w) / 0.7045) = a d 7 b b 0 f a, then b (w = 0) for the padding
    "mlx4g32": "dab70baf" + "bb" * 12 + "a3b9c047",
}

# sha256 of encode(golden_input()) and, for the formats whose decode is pure element-wise
# IEEE arithmetic, of the decoded fp32 bytes. (Turbo decode goes through BLAS, whose
# summation order may differ by an ulp between machines; test_turbo.py checks it.)
ENCODED_SHA256 = {
    "int8": "7dff73a7f8aa32920f857cc9ada01bdf4e3c7953731eae8d696191d4f0504df7",
    "turbo4": "47444335e3390dff994cd383c220b43a1c77a38a131c28c0e116ede4de68c2ae",
    "turbo3": "bd6595b94c90de6bf1d1bf7e7f5a013fd5a12f2827139b96ae3c5cf489635870",
    "turbo2": "086966ba36d5113752bf645f60b05121a1d24dc49fe2545d2e553e598dcbf0a0",
    "fp16": "1947257fbef67b07c59c49e74ad1e511fcc20a79519748a92c641b66991b3fff",
    "fp8": "f3df5b859a64e771573a2c58f9fc25ad739a20db837fd701af04f22717541545",
    "mlx4g32": "edf65e700c7f1f47fc1b255d0eb2f93446912ccc5dae5b4e2052f1ea22778c9c",
}
DECODED_SHA256 = {
    "int8": "86f453da6407b3761f87399a03111f72f600b9b46214a365803f6b3fe1e2869f",
    "fp16": "5048789569851683e52f0b113064544cc3013f73540efc01e73e6c2a0d3604c3",
    "fp8": "396bdc3e0f16f92a953379edc7787f34de88c03b186725d3b5e92d59a524d390",
    "mlx4g32": "106612b96d5a7a1c57e83713ab9450fd30eeb6701a0bb69069afdd53fec726d0",
}


def golden_input() -> np.ndarray:
    """4 x 200 (padding for every block size): Gaussian, x30, a zero row, small values."""
    rng = np.random.default_rng(0x9107)
    x = rng.standard_normal((4, 200)).astype(np.float32)
    x[1] *= 30.0
    x[2] = 0.0
    x[3, :50] *= 1e-3
    return x


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_small_literal(name: str) -> None:
    codec = get_codec(name)
    assert codec.encode(SMALL).tobytes().hex() == SMALL_HEX[name]
    # and the literal decodes back near the input
    y = codec.decode(bytes.fromhex(SMALL_HEX[name]), 8)
    assert np.abs(y - SMALL).max() < 1.5


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_encoded_bytes_are_frozen(name: str) -> None:
    assert sha256(get_codec(name).encode(golden_input())) == ENCODED_SHA256[name]


@pytest.mark.parametrize("name", sorted(DECODED_SHA256))
def test_decoded_values_are_frozen(name: str) -> None:
    codec = get_codec(name)
    assert sha256(codec.decode(codec.encode(golden_input()), 200)) == DECODED_SHA256[name]
