"""How a command ends: one line and one exit code for each kind of cause (docs/training.md, "How a run ends").

  0    done
  1    a bug: Python's traceback (anything not below)
  2    usage: a flag, model, file or folder the user named cannot be used, or the run cannot fit the memory there
       is: "<prog>: error: <line>", as argparse prints its own
  3    refused, to keep data from harm: a folder another live process writes, a run that exists, a folder that
       is not a run's: "<prog>: refused: <line>", the line ending with what to do instead
  4    a runtime stop: a full disk, a judge that is down, a streak of non-finite steps: the cause, what the run
       keeps and the command that continues it
  130  Ctrl-C, 143 SIGTERM: what the run keeps and the command that works now (resume it, or start it again)

train.py and eval.py end this way; judge.py's own failures use the same codes."""
import contextlib
import os
import shutil
import sys

from minigrpo.errors import Refusal, StopRun, UsageError
from minigrpo import signals
from minigrpo.run.folder import RunFolder


def usage_error(prog, line):
    """The one line of a flag, model or data problem, as argparse prints its own: exit code 2."""
    print(f"{prog}: error: {line}", file=sys.stderr)
    raise SystemExit(2) from None


def parse(prog, resolve, argv):
    """resolve(argv), the command's flags; a flag's one-line problem exits as usage_error does, a refusal to harm
    data found there (a --run-name that is not a run's folder) as ending's."""
    try:
        return resolve(argv)
    except Refusal as e:
        refused(prog, e.code)
    except SystemExit as e:
        if isinstance(e.code, str):
            usage_error(prog, e.code)
        raise


USAGE, REFUSED, STOPPED = 2, 3, 4


def refused(prog, line):
    """The one line of a refusal to harm data: exit code 3."""
    print(f"{prog}: refused: {line}", file=sys.stderr)
    raise SystemExit(REFUSED) from None


@contextlib.contextmanager
def ending(prog, ended):
    """`with ending(prog, ended): work`: how the work ends mapped to an exit code. ended(e) is called with whatever
    ends it early, before the line is printed: it undoes what the command made for itself and returns what is kept
    (the note of a stop or a Ctrl-C). A context, not a call: the command's work runs in its caller's frame."""
    try:
        yield
    except BaseException as e:
        kept = ended(e)
        if isinstance(e, Refusal):
            refused(prog, e.code)
        if isinstance(e, UsageError) or (isinstance(e, SystemExit) and isinstance(e.code, str)):
            usage_error(prog, str(e) if isinstance(e, UsageError) else e.code)
        if isinstance(e, StopRun):
            print(f"{prog}: {e}; {kept}", file=sys.stderr)
            raise SystemExit(STOPPED) from None
        if isinstance(e, KeyboardInterrupt):   # the steps after the last checkpoint are redone by the resume
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"\n{prog}: stopped by {signals.stop_name(e)}; {kept}", file=sys.stderr)
            raise SystemExit(signals.exit_code(e)) from None
        raise


def training_ended(args, argv):
    """train.py's `ended`: a usage error, a Ctrl-C or a SIGTERM removes the run folder made for it when it holds
    nothing (its marker, no checkpoint, the judge's empty cache); a stop or a Ctrl-C notes what the run keeps and
    the command that works now: --resume once config.json is written, else the same command again (a pipeline,
    --task mdp or --experiment, continues by the same command)."""
    made = not os.path.exists(os.path.join(args.runs_dir, args.run_name))
    top = _first_missing(args.runs_dir)    # the --runs-dir folders this command will make, from here down
    again = sys.argv[1:] if argv is None else argv

    def ended(e):
        run = RunFolder(args.runs_dir, args.run_name)
        if isinstance(e, (UsageError, KeyboardInterrupt, StopRun)) and made and run.holds_nothing():
            shutil.rmtree(run.path)
            _remove_empty(args.runs_dir, top)
        if not isinstance(e, (StopRun, KeyboardInterrupt)):
            return ""
        if args.task == "mdp" or args.experiment:
            return run.rerun_note(again)
        if not os.path.exists(run.file("config.json")):
            return f"nothing was written yet; start it again with: {run.start_command(again)}"
        return run.stop_note()
    return ended


def _first_missing(path: str) -> str | None:
    """The outermost folder of path that does not exist yet (None when path exists)."""
    path, top = os.path.abspath(path), None
    while not os.path.exists(path):
        top, path = path, os.path.dirname(path)
    return top


def _remove_empty(path: str, top: str | None):
    """Remove path and its parents up to top, the folders a failed start made, while they are empty: a folder
    that was there before, or that holds anything, stays."""
    path = os.path.abspath(path)
    while top and (path == top or path.startswith(top + os.sep)):
        try:
            os.rmdir(path)
        except OSError:
            return
        path = os.path.dirname(path)
