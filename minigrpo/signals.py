"""The two signals that stop a command, Ctrl-C (SIGINT) and SIGTERM (`kill`, `timeout`, a scheduler, `docker stop`),
from the first line of a script on: stdlib only, so that it is in place before torch's seconds of imports.

During the imports nothing is written yet: either signal ends the process with one line and its exit code.
After them catch_ctrl_c (below) takes over: SIGTERM raises Terminated, a KeyboardInterrupt, so that it
stops a run exactly as a Ctrl-C does (the checkpoint kept, the lock released, one line). And the kill that ends a
child together with every process it started."""
import os
import signal
import sys

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}     # 128 + the signal's number, as a shell reports it
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the handler runs: every `except KeyboardInterrupt` treats it as a Ctrl-C."""


def stop_name(e: BaseException) -> str:
    return NAMES[signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT]


def exit_code(e: BaseException) -> int:
    return EXIT_CODES[signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT]


def quiet_imports(prog: str):
    """Until catch_ctrl_c: a Ctrl-C or SIGTERM prints one line and exits (nothing was started, nothing to keep).
    A signal the parent set to be ignored (`nohup ... &`) stays ignored."""
    def stop(signum, frame):
        print(f"\n{prog}: stopped by {NAMES[signum]} before it started; nothing was written: run the same command "
              "again to start", file=sys.stderr)
        os._exit(EXIT_CODES[signum])
    stop.quiet_imports = True           # catch_ctrl_c replaces it
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(sig, stop)


# Ctrl-C. Python's own handler raises KeyboardInterrupt wherever the main thread is; when that is inside a weakref
# callback or a finalizer (an import lock's, a tensor's), Python prints "Exception ignored" and the run goes on.
# The handler below also remembers the Ctrl-C, and the training loop asks at every step, so it always stops.
# SIGTERM is handled the same way and raises Terminated (a KeyboardInterrupt): the run stops as a Ctrl-C stops it.

_ctrl_c = None      # the exception a signal raised, to raise again at the next step


def _on_signal(signum, frame):
    global _ctrl_c
    _ctrl_c = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    raise _ctrl_c


def _unraisable(hook):
    def quiet_ctrl_c(info):   # remembered above, acted on at the next step: not a traceback for the user
        if not issubclass(info.exc_type, KeyboardInterrupt):
            hook(info)
    return quiet_ctrl_c


def catch_ctrl_c():
    """Install the remembering handler for SIGINT and SIGTERM in place of Python's default ones (or of
    signals.quiet_imports'); a signal ignored (a job started with `nohup ... &`) or handled by someone else stays
    as it is."""
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        now = signal.getsignal(sig)
        if now is default or getattr(now, "quiet_imports", False):
            signal.signal(sig, _on_signal)
    if getattr(sys.unraisablehook, "__name__", "") != "quiet_ctrl_c":
        sys.unraisablehook = _unraisable(sys.unraisablehook)


def stop_if_ctrl_c():
    """Raise the KeyboardInterrupt a Ctrl-C raised where Python could not deliver it."""
    if _ctrl_c:
        raise _ctrl_c


def kill_process_group(proc, wait: bool = True):
    """SIGKILL a child started with start_new_session=True and everything it spawned; a group already gone is
    fine. Then reap the child (wait=True) so that it leaves no zombie."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if wait:
        proc.wait()
