"""The format table: names, frozen on-disk ids, lookups (src/pion/codecs/registry.py)."""

from __future__ import annotations

import pytest

import pion.codecs
from pion.codecs import FORMAT_NAMES, Codec, codec_by_id, get_codec

# Frozen: these bytes are on disk. Never renumber; never reuse a retired id.
FROZEN_IDS = {"int8": 1, "turbo4": 2, "turbo3": 3, "turbo2": 4, "fp16": 5, "fp8": 6, "mlx4g32": 7}


def test_format_names_order_is_the_error_text_order() -> None:
    assert FORMAT_NAMES == ("int8", "turbo4", "turbo3", "turbo2", "fp16", "fp8", "mlx4g32")
    assert "|".join(FORMAT_NAMES) == "int8|turbo4|turbo3|turbo2|fp16|fp8|mlx4g32"


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_ids_are_frozen(name: str) -> None:
    codec = get_codec(name)
    assert isinstance(codec, Codec)
    assert codec.name == name
    assert codec.format_id == FROZEN_IDS[name]
    assert codec_by_id(codec.format_id) is codec
    assert 0 < codec.format_id < 256


@pytest.mark.parametrize("name", ["", "INT8", "q8_0", "fp32", "turbo", " int8"])
def test_unknown_name_is_a_key_error(name: str) -> None:
    with pytest.raises(KeyError):
        get_codec(name)


@pytest.mark.parametrize("format_id", [0, 8, 255, -1])
def test_unknown_id_is_a_key_error(format_id: int) -> None:
    with pytest.raises(KeyError):
        codec_by_id(format_id)


def test_public_api() -> None:
    assert set(pion.codecs.__all__) >= {
        "FORMAT_NAMES",
        "Codec",
        "CodecValueError",
        "codec_by_id",
        "get_codec",
    }
