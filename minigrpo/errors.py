"""The kinds of stop a user sees as one line, never a traceback: what the user can fix (a flag, a file, a key), a
refusal that keeps data from harm, and a rule that stopped a run. The scripts give each its exit code."""


class UsageError(Exception):
    """A flag or file the user can fix: the scripts print it as one line and exit with code 2."""


class Refusal(SystemExit):
    """A refusal that keeps data from harm (a folder another live process writes, a run that exists): the message
    is the one line, ending with what to do instead; the scripts exit with code 3."""


class StopRun(RuntimeError):
    """A run-policy rule stopped the run (a judge that is down, a checkpoint that cannot be written); the message
    names the cause, and train.py adds what the checkpoints hold and the command that continues the run."""


def first_line(e: Exception) -> str:
    """Library errors are one line already; hub/network errors are paragraphs: keep their first line."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
