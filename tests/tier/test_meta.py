"""A session's meta hash read back from the tier: checked field by field, because
anything in the cluster may have written it."""

from __future__ import annotations

from typing import Any

import pytest

from pion.config import VStoreLimits
from pion.tier.meta import Layout, TierFormatError, parse_meta

LIMITS = VStoreLimits()


def _fields(**over: Any) -> dict[bytes, bytes]:
    base = {"ver": "1", "gen": "0123456789abcdef", "sid": "s", "dim": "64", "fmt": "int8"}
    base.update({k: v for k, v in over.items() if v is not None})
    out = {k.replace("t_", "t:").encode(): str(v).encode() for k, v in base.items()}
    for k in [k for k, v in over.items() if v is None]:
        out.pop(k.encode(), None)
    return out


def test_uniform_and_schema_layouts() -> None:
    meta = parse_meta(b"s", _fields(schema="", t_0=600, t_2=10), LIMITS)
    assert meta.layout == Layout(64, "int8", None)
    assert meta.tpl == {0: 600, 2: 10} and meta.gen == "0123456789abcdef"
    assert meta.nbytes == 610 * Layout(64, "int8", None).row_bytes(0)
    schema = parse_meta(b"s", _fields(dim="0", fmt="fp16", schema="fp16:32,turbo4:128"), LIMITS)
    assert schema.layout.schema == (("fp16", 32), ("turbo4", 128))
    assert schema.layout.layer(1) == ("turbo4", 128) and schema.layout.layer(2) is None
    fields = schema.layout.fields()
    assert fields == {"dim": "0", "fmt": "fp16", "schema": "fp16:32,turbo4:128"}


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"ver": "2"}, "version"),
        ({"ver": None}, "version"),
        ({"gen": "XYZ"}, "generation"),
        ({"gen": "0123456789ABCDEF"}, "generation"),
        ({"sid": "other"}, "another session"),
        ({"dim": "0"}, "default dim"),
        ({"dim": "-3"}, "integer"),
        ({"dim": "99999999999"}, "integer"),
        ({"dim": "8193"}, "default dim"),
        ({"fmt": "fp64"}, "unknown format"),
        ({"schema": "fp16:0"}, "schema dim"),
        ({"schema": "fp16"}, "schema dim"),
        ({"schema": "fp16:32,int9:8"}, "unknown format"),
        ({"fmt": "fp16", "schema": "int8:8"}, "layer 0"),
        ({"schema": ",".join(["int8:8"] * 60)}, "limits"),
        ({"t_0": "x"}, "integer"),
        ({"t_0": "01"}, "integer"),
        ({"t_80": "5"}, "beyond"),
        ({"t_0": "200001"}, "this server allows"),
        ({"fmt": "fp16", "schema": "fp16:8", "t_1": "5"}, "beyond"),
        ({"bogus": "1"}, "unknown meta field"),
    ],
)
def test_bad_fields_are_refused(over: dict[str, Any], error: str) -> None:
    with pytest.raises(TierFormatError, match=error):
        parse_meta(b"s", _fields(**over), LIMITS)


def test_field_count_is_bounded() -> None:
    fields = _fields()
    fields.update({f"t:{i}".encode(): b"1" for i in range(300)})
    with pytest.raises(TierFormatError, match="fields"):
        parse_meta(b"s", fields, LIMITS)


def test_rope_layers_round_trip_and_bad_ropes_are_refused() -> None:
    schema = "bf16_rope_fp8_body:96:32,fp16:64"
    meta = parse_meta(b"s", _fields(dim="0", fmt="bf16_rope_fp8_body", schema=schema), LIMITS)
    assert meta.layout.ropes == (32, 0) and meta.layout.fields()["schema"] == schema
    assert meta.layout.codec(0).rope == 32  # type: ignore[attr-defined]
    for bad in ("bf16_rope_fp8_body:96:0", "bf16_rope_fp8_body:96:96", "fp16:64:5"):
        fmt = bad.split(":")[0]
        with pytest.raises(TierFormatError, match="rope"):
            parse_meta(b"s", _fields(dim="0", fmt=fmt, schema=bad), LIMITS)
    with pytest.raises(TierFormatError, match="only in a SCHEMA"):
        parse_meta(b"s", _fields(fmt="bf16_rope_fp8_body"), LIMITS)
