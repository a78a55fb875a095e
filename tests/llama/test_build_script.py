"""scripts/build-llama-server: idempotent, last stdout line is the binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pion_testing.paths import build_script

pytestmark = pytest.mark.llama


def test_second_run_is_a_no_op_printing_the_binary(llama_bin: Path) -> None:
    proc = subprocess.run(
        [str(build_script())], capture_output=True, text=True, check=True, timeout=60
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert Path(last) == llama_bin and Path(last).is_absolute()
    assert os.access(last, os.X_OK)
    assert "already built" in proc.stderr
