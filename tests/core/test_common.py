"""minigrpo/common.py: the small shared helpers."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from repo_root import ROOT

from minigrpo.common import (atomic_write, derive_seed, kill_process_group, left_pad, mean, pick_dtype, read_json,
                             splitmix64)


def test_left_pad_puts_every_row_last_token_in_the_last_column():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == torch.long


def test_atomic_write_replaces_whole_files(tmp_path):
    path = str(tmp_path / "f.json")
    atomic_write(path, "one")
    atomic_write(path, b"two")

    def write(tmp):
        with open(tmp, "w") as f:
            f.write("three")
    atomic_write(path, write)
    assert open(path).read() == "three" and os.listdir(tmp_path) == ["f.json"]


def test_read_json_says_which_file_and_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json: pass --data"):
        read_json(str(tmp_path / "missing.json"), "pass --data")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad.json: not valid JSON \(.*\); fix it"):
        read_json(str(tmp_path / "bad.json"), "", fix="; fix it")


def test_mean_skips_none():
    assert mean([1.0, None, 2.0]) == 1.5 and mean([None]) is None and mean([]) is None


def test_pick_dtype():
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_kill_process_group_ends_the_child_and_its_children():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                            start_new_session=True)
    time.sleep(0.5)
    kill_process_group(proc)
    assert proc.returncode is not None
    kill_process_group(proc)            # a group already gone is fine


def test_derive_seed_is_splitmix64_folded_over_the_parts():
    seeds = [derive_seed(*p) for p in [(0,), (0, 1), (1, 0), (0, "a"), (0, "b"), (0, 1, 2), (0, 2, 1)]]
    assert len(set(seeds)) == len(seeds)                                   # order and strings matter
    assert all(0 <= s < 2**63 for s in seeds) and derive_seed(0, "a") == derive_seed(0, "a")
    one = int(splitmix64(torch.tensor(7))) % 2**64 >> 1
    assert derive_seed(7) == one                                           # one part: splitmix64 of it, 63 bits


CTRL_C_IN_A_CALLBACK = """
import os, signal, weakref
from minigrpo.common import catch_ctrl_c, stop_if_ctrl_c
if {catch}:
    catch_ctrl_c()
class Thing:
    pass
def callback(ref):          # a finalizer, as an import lock's: a KeyboardInterrupt raised here is "ignored"
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10 ** 6):
        pass
thing = Thing()
ref = weakref.ref(thing, callback)
del thing
print("went on")
try:
    stop_if_ctrl_c()
    print("not stopped")
except KeyboardInterrupt:
    print("stopped")
"""


@pytest.mark.parametrize("catch", [False, True])
def test_a_ctrl_c_python_swallows_in_a_callback_still_stops(catch):
    # SIGINT at its default, as under a terminal (a suite run with `nohup ... &` starts children with it ignored)
    out = subprocess.run([sys.executable, "-c", CTRL_C_IN_A_CALLBACK.format(catch=catch)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.stdout.splitlines() == (["went on", "stopped"] if catch else ["went on", "not stopped"]), out
    # without the handler Python prints the interrupt it dropped; with it the Ctrl-C is acted on, not printed
    assert ("Traceback" in out.stderr) != catch, out.stderr
