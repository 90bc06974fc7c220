"""bench/device.py's bookkeeping: the time budget of each section, and the results, written as they come.

A run is cut into sections, each with a deadline: section k may run until the start of the run plus the first k
allotments, so a section that finishes early leaves its time to the next ones and one that runs long cannot eat
theirs; only a section that the others cannot do without (the model build's retry) may `extend` its deadline, and
then the last sections lose the time. Inside a section every expensive unit (a model build, a compile, a timed
call) is one `Section.measure`:
  - it declares `need`, the seconds it may take; if less than that is left before the section's deadline, it is
    not started and its row says "skipped" with the numbers;
  - once started, an interval timer (SIGALRM) stops it at the deadline (or at its own `cap`), so that an estimate
    that was too low still cannot overrun: the row then says "stopped";
  - an exception becomes the row's error, and the section goes on: a failing reference case never takes our own
    row with it, because each is its own unit;
  - a unit may raise `Skip(reason)` when what it needs is missing (an earlier unit was skipped or failed).
After every row, results.json and table.md are rewritten under --out (to a temporary name, then renamed), so a
kill at any point leaves every finished figure in a valid file.
"""

import json
import os
import signal
import sys
import time
import traceback

COLUMNS = ("section", "case", "minigrpo", "transformers", "note")


class Skip(Exception):
    """A unit that cannot run (what it needs is missing): its row says skipped, with this reason."""


class Stopped(BaseException):
    """Raised by the interval timer in the unit that reached its deadline (a BaseException, so that library code
    that catches Exception does not swallow it)."""


def _write(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


class Report:
    """The rows so far, the environment lines, the budget clock; files under `out`."""

    def __init__(self, out, budget, start, meta):
        self.out, self.budget, self.start = out, budget, start
        self.meta, self.env, self.rows = dict(meta), [], []
        self.finished = False
        os.makedirs(out, exist_ok=True)
        self.save()

    def elapsed(self):
        return time.time() - self.start

    def left(self):
        return self.budget - self.elapsed()

    def add_env(self, line):
        self.env.append(line)
        print(line, flush=True)
        self.save()

    def header(self):
        print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)

    def add(self, row):
        self.rows.append(row)
        print("| " + " | ".join(cell(row.get(k, "")) for k in COLUMNS) + " |", flush=True)
        self.save()

    def table(self):
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(cell(r.get(k, "")) for k in COLUMNS) + " |" for r in self.rows]
        return "\n".join(lines)

    def save(self):
        doc = dict(self.meta, env=self.env, rows=self.rows, finished=self.finished,
                   elapsed_s=round(self.elapsed(), 1))
        _write(os.path.join(self.out, "results.json"), json.dumps(doc, indent=1) + "\n")
        caption = "\n".join(f"- {line}" for line in self.env)
        _write(os.path.join(self.out, "table.md"), f"{caption}\n\n{self.table()}\n")

    def finish(self):
        self.finished = True
        self.save()

    def section(self, name, allotment):
        """The next section: its deadline is `allotment` seconds past the previous section's (so time one leaves
        unused passes on), never past the whole budget."""
        prev = getattr(self, "_deadline", 0.0)
        self._deadline = min(self.budget, prev + allotment)
        return Section(self, name, self._deadline)


def _alarm(signum, frame):
    raise Stopped()


class Section:
    def __init__(self, report, name, deadline):
        self.report, self.name, self.deadline = report, name, deadline

    def left(self):
        return self.deadline - self.report.elapsed()

    def extend(self, seconds):
        """At least `seconds` more from now, never past the budget: the sections after this one start later, so
        the last of them lose the time first."""
        self.deadline = min(self.report.budget, max(self.deadline, self.report.elapsed() + seconds))
        self.report._deadline = max(self.report._deadline, self.deadline)

    def measure(self, case, fn, need, cap=None):
        """Run fn() -> {"minigrpo": ..., "transformers": ..., "note": ..., "data": ...} as one row, unless it would
        overrun (see the module docstring). Returns the dict's "data" (None when skipped, stopped or failed)."""
        left = self.left()
        row = {"section": self.name, "case": case}
        if left < need:
            row.update(status="skipped", note=f"skipped: needs ~{need:.0f} s, {max(left, 0):.0f} s left in the "
                                              f"section")
            self.report.add(row)
            return None
        limit = min(left, cap) if cap else left
        t0 = time.time()
        data = None
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, max(limit, 0.01))
        try:
            out = fn()
            signal.setitimer(signal.ITIMER_REAL, 0)
            data = out.pop("data", None)
            row.update(out, status="ok")
        except Stopped:
            row.update(status="stopped", note=f"stopped: reached its limit of {limit:.0f} s")
        except Skip as e:
            row.update(status="skipped", note=f"skipped: {e}")
        except Exception as e:  # noqa: BLE001  one failure must not lose the other rows
            row.update(status="error", note=f"error: {type(e).__name__}: {e}"[:400])
            traceback.print_exc(file=sys.stderr)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        row["seconds"] = round(time.time() - t0, 1)
        self.report.add(row)
        return data
