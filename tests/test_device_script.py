"""bench/device.py, the one-command GPU measurement, rehearsed on the CPU with tiny shapes: it runs to the end,
prints one table with a row per case, and no case fails (a case the budget did not reach says so)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_device_script_small_on_cpu():
    out = subprocess.run([sys.executable, "bench/device.py", "--device", "cpu", "--small", "--budget", "240"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and not line.startswith("| section")]
    sections = {r.split("|")[1].strip() for r in rows}
    assert sections == {"parity", "train step", "synthetic", "sampler"}, out.stdout
    assert not [r for r in rows if "error:" in r], out.stdout + out.stderr[-3000:]
    parity = [r for r in rows if r.startswith("| parity")]
    assert len(parity) == 2 and all("argmax agrees" in r for r in parity)
    assert "total " in out.stdout.splitlines()[-1]
