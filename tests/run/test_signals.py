"""minigrpo/signals.py: a Ctrl-C that Python swallows in a callback still stops a train.py run, and
kill_process_group ends a child with its own children. Each test starts real processes (seconds), so they live here
and not in tests/core, the loss-math tier."""
import signal
import subprocess
import sys
import time

import pytest
from repo_root import ROOT

from minigrpo.signals import kill_process_group


def test_kill_process_group_ends_the_child_and_its_children():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                            start_new_session=True)
    time.sleep(0.5)
    kill_process_group(proc)
    assert proc.returncode is not None
    kill_process_group(proc)            # a group already gone is fine


CTRL_C_IN_A_CALLBACK = """
import os, signal, weakref
from minigrpo.signals import catch_ctrl_c, stop_if_ctrl_c
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


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    """`kill`, `timeout`, a scheduler: the run stops at once with one line naming the intact checkpoint and the
    resume, exit code 143, and the folder's lock file gone."""
    from minigrpo.run.folder import RunFolder
    from minigrpo.run.lock import LOCK
    from train_runs import ENV, wait_for_checkpoint
    cmd = [sys.executable, "train.py", "--task", "synthetic", "--model", "tiny", "--tasks-per-step", "2",
           "--group-size", "2", "--max-new-tokens", "8", "--quiet", "--steps", "50", "--save-every", "1",
           "--runs-dir", str(tmp_path), "--run-name", "t"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(proc, tmp_path / "t" / "checkpoints" / "step-1", "terminated")
    proc.terminate()
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 143 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("train.py: stopped by SIGTERM; the last checkpoint, "), last
    assert last.endswith(f", is intact; continue with: {RunFolder(str(tmp_path), 't').resume_command()}"), last
    assert not (tmp_path / "t" / LOCK).exists()


@pytest.mark.parametrize("sig, name, code", [(signal.SIGINT, "Ctrl-C", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_a_signal_during_the_imports_is_one_line(sig, name, code):
    """train.py's first line, then a stand-in for torch's seconds of imports: one line, its exit code, no
    traceback, and nothing about --resume (nothing was written)."""
    script = ("from minigrpo import signals; signals.quiet_imports('train.py'); print('importing', flush=True); "
              "import time; time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline() == "importing\n"
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == code
    assert err.strip().splitlines() == [f"train.py: stopped by {name} before it started; nothing was written: run "
                                        "the same command again to start"]
