"""The two signals that stop a command, Ctrl-C (SIGINT) and SIGTERM (`kill`, `timeout`, a scheduler, `docker stop`),
from the first line of a script on: stdlib only, so that it is in place before torch's seconds of imports.

During the imports nothing is written yet: either signal ends the process with one line and its exit code.
After them minigrpo.common.catch_ctrl_c takes over: SIGTERM raises Terminated, a KeyboardInterrupt, so that it
stops a run exactly as a Ctrl-C does (the checkpoint kept, the lock released, one line)."""
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
