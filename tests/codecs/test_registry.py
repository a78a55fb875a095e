"""The format table: names, frozen on-disk ids, lookups (src/pion/codecs/registry.py)."""

from __future__ import annotations

import pytest

import pion.codecs
from pion.codecs import (
    ALL_FORMAT_NAMES,
    FORMAT_NAMES,
    SCHEMA_ONLY_FORMATS,
    Codec,
    codec_by_id,
    format_id_of,
    format_name,
    get_codec,
)
from pion.errors import CodecError

# Frozen: these bytes are on disk. Never renumber; never reuse a retired id.
FROZEN_IDS = {
    "int8": 1,
    "turbo4": 2,
    "turbo3": 3,
    "turbo2": 4,
    "fp16": 5,
    "fp8": 6,
    "mlx4g32": 7,
    "bf16_rope_fp8_body": 8,
}


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


@pytest.mark.parametrize("format_id", [0, 9, 255, -1])
def test_unknown_id_is_a_key_error(format_id: int) -> None:
    with pytest.raises(KeyError):
        codec_by_id(format_id)
    with pytest.raises(KeyError):
        format_name(format_id)


def test_schema_only_formats_are_not_uniform_formats() -> None:
    # The uniform list is Pion's error text; the eighth format lives in SCHEMA only.
    assert SCHEMA_ONLY_FORMATS == ("bf16_rope_fp8_body",)
    assert ALL_FORMAT_NAMES == FORMAT_NAMES + SCHEMA_ONLY_FORMATS
    assert not set(SCHEMA_ONLY_FORMATS) & set(FORMAT_NAMES)


@pytest.mark.parametrize("name", ALL_FORMAT_NAMES)
def test_every_name_has_its_frozen_id(name: str) -> None:
    assert format_id_of(name) == FROZEN_IDS[name]
    assert format_name(FROZEN_IDS[name]) == name


def test_parametrized_codec_needs_its_rope() -> None:
    codec = get_codec("bf16_rope_fp8_body", 64)
    assert codec.name == "bf16_rope_fp8_body"
    assert codec.format_id == 8
    assert codec.rope == 64
    assert get_codec("bf16_rope_fp8_body", 64) is codec  # one instance per rope
    assert codec_by_id(8, 64) is codec
    assert get_codec("bf16_rope_fp8_body", 65) is not codec
    for bad in (0, -1, 8192):
        with pytest.raises(CodecError, match="rope"):
            get_codec("bf16_rope_fp8_body", bad)
    with pytest.raises(CodecError, match="takes no rope"):
        get_codec("int8", 16)
    assert get_codec("int8").rope == 0


def test_public_api() -> None:
    assert set(pion.codecs.__all__) >= {
        "FORMAT_NAMES",
        "Codec",
        "CodecValueError",
        "codec_by_id",
        "get_codec",
    }
