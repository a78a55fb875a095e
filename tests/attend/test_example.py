"""The worked Stage 2 example (examples/stage2_attention.py) runs against a real server
and its own checks pass: the documentation cannot drift from the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pion.server.run import ServerThread

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stage2_attention.py"


def test_stage2_example_runs(server: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("stage2_attention", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(server.host, server.port)
    out = capsys.readouterr().out
    assert "WARM: 2 layers (0 skipped)" in out
    assert "layer 0 is now COLD" in out
    assert "cold rehydrates the client observed: 1" in out
