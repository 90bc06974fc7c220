"""minigrpo/common.py's process signals: a Ctrl-C that Python swallows in a callback still stops a train.py run, and
kill_process_group ends a child with its own children. Each test starts real processes (seconds), so they live here
and not in tests/core, the loss-math tier."""
import signal
import subprocess
import sys
import time

import pytest
from repo_root import ROOT

from minigrpo.common import kill_process_group


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
