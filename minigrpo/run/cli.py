"""How a command ends, as its exit code and one line: a flag, model or data problem (UsageError, or argparse's own
refusal) is "<prog>: error: <line>" and exit code 2, as argparse prints its own; a run-policy stop (StopRun: a judge
that is down, a full disk) is its cause and what the run keeps, exit code 1; a Ctrl-C is what the run keeps and the
command that continues it, exit code 130. train.py and eval.py end this way."""
import os
import shutil
import sys

from minigrpo.common import StopRun, UsageError
from minigrpo.run.folder import RunFolder


def usage_error(prog, line):
    """The one line of a flag, model or data problem, as argparse prints its own: exit code 2."""
    print(f"{prog}: error: {line}", file=sys.stderr)
    raise SystemExit(2) from None


def parse(prog, resolve, argv):
    """resolve(argv), the command's flags; a refusal with its one-line message exits as usage_error does."""
    try:
        return resolve(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            usage_error(prog, e.code)
        raise


def run(prog, work, ended):
    """work(), with how it ends mapped to an exit code. ended(e) is called with whatever ends it early, before the
    line is printed: it undoes what the command made for itself and returns what is kept (the note of a stop or a
    Ctrl-C)."""
    try:
        return work()
    except BaseException as e:
        kept = ended(e)
        if isinstance(e, UsageError):
            usage_error(prog, str(e))
        if isinstance(e, StopRun):
            print(f"{prog}: {e}; {kept}", file=sys.stderr)
            raise SystemExit(1) from None
        if isinstance(e, KeyboardInterrupt):   # the steps after the last checkpoint are redone by the resume
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"\n{prog}: stopped by Ctrl-C; {kept}", file=sys.stderr)
            raise SystemExit(130) from None
        raise


def training_ended(args, argv):
    """train.py's `ended`: a usage error removes the run folder made for it when it holds nothing (its marker, no
    checkpoint, the judge's empty cache); a stop or a Ctrl-C notes what the run keeps and the command that
    continues it (a pipeline, --task mdp or --experiment, continues by the same command)."""
    made = not os.path.exists(os.path.join(args.runs_dir, args.run_name))

    def ended(e):
        run = RunFolder(args.runs_dir, args.run_name)
        if isinstance(e, UsageError):
            if made and run.holds_nothing():
                shutil.rmtree(run.path)
            return ""
        if not isinstance(e, (StopRun, KeyboardInterrupt)):
            return ""
        if args.task == "mdp" or args.experiment:
            return run.rerun_note(sys.argv[1:] if argv is None else argv)
        return run.stop_note()
    return ended
