"""Python checks, decided outside the answer's process: the trusted driver.

The answer is code written by the policy being trained, so it is an adversary. Its code never runs in the process
that decides. This driver is a process of its own, itself confined (minigrpo/judge/driver_host.py starts it in a sandbox
of its own: a uid of its own, no project tree, a memory cap), and for each criterion it

  1. asks the judge's broker (driver_host.py) for a fresh sandbox running the answer as module `solution`, served
     by minigrpo/judge/wire_rpc.py over a pipe; the broker makes it with the criterion's own limits (the driver can only
     lower them) and hands over the pipe's two ends;
  2. runs the criterion's test code here, with the driver's own builtins and globals, and `solution` (and its
     public names) replaced by proxies: every call, attribute read or item access on the answer's functions,
     classes and objects travels to the sandbox, and only plain, exactly-typed data comes back (wire.py) -- so
     expected values, comparisons, asserts and timing all live here;
  3. passes the criterion only if the test ran to its end with the sandbox still answering. Exit status is never
     evidence: an answer that exits, is killed, stalls, times out or replies with something that is not plain data
     fails the case it was in.

Nothing of the driver is reachable from the answer: what the test hands the answer crosses as plain data, or as a
call-only function or a step-only iterator (wire.Codec's call_only); the answer may call the one and step the
other, never read an attribute, a frame, a closure or globals of either (`Answer._serve`).

Helpers a test sees besides the answer's names:
  raises(exc, fn, *args, **kwargs)  True when fn raised exc (by class: the answer's exceptions cross by name)
  deadline(cpu_seconds)             performance criteria: fail once the sandbox has used that much more CPU
  time.process_time()               the sandbox's CPU seconds, measured from outside (its cgroup, read by the
                                    broker), so the answer cannot fake it with its own clock or signals
  open_files()                      the regular files the sandbox's processes hold descriptors on now ("device:inode",
                                    sorted), read by the judge in the host's /proc: what the answer has left open
                                    after a call, never its own report (a file reached by another name or held by a
                                    child process is the same entry)
  memory_peak_mb()                  the most memory the sandbox (all its processes and files) has held so far, in
                                    MB, read from its cgroup outside the answer; None where there is no cgroup
  INPUTS, prepared, INPUT_FILES     a check with an `inputs` source: the folder of input files the judge made
                                    before the answer's process started (read-only to the answer), the source's
                                    `result` (what it drew: a count, a size; never in the answer's process) and
                                    each file's id as open_files() names it (minigrpo/judge/inputs.py)
  opened_inputs()                   a check with `"look_on_open": true`: [(an input file's id, the files the
                                    sandbox held as it opened it), ...], one per open, read by the judge in the
                                    host's /proc while the kernel held that open (minigrpo/judge/opens.py): a look
                                    the answer cannot schedule or dodge; None where the host cannot watch (not root)
  in_sandbox(source, **inputs)      run a harness snippet beside the answer and return its `result` (plain data):
                                    for criteria that need the answer's objects in its own process (an event loop,
                                    a monkeypatched library, click's runner). The snippet shares the answer's
                                    process, globals and builtins: its `result` may only be the answer's outputs,
                                    compared here; anything it measures or makes is the answer's word (see
                                    "evidence" in checks.py), so it never makes an input whose size or content a
                                    criterion relies on (that is INPUTS), and it is handed nothing expected (the
                                    answer can read its caller's frame).
  stand_in(**members)               an object to hand the answer (an rng, a clock, a fetcher): its members are
                                    functions, which the answer may only call, and plain data; it crosses by value
                                    (wire.StandIn), so its state and its call counts stay here, out of reach
  sqlite_stand_in(conn)             a stand-in for a sqlite3 connection that stays here (minigrpo/judge/standins.py)
  implementation()                  the check's `implementation` source (the code a test-suite answer is run
                                    against) started in a sandbox of its own; returns its public names as proxies

One budget per answer: what its failing criteria may cost together is ANSWER_BUDGET times its largest criterion
timeout, in CPU seconds. A criterion that fails is charged the CPU it used, and its whole timeout when it timed out
or stalled (running or waiting for a CPU for under half of STALL_S while the driver waits for it); a passing one
costs nothing (it did the work it was given), nor does one whose sandbox the judge could not start. Once the budget
is spent the remaining criteria fail at once, so a sleeping or spinning answer costs about ANSWER_BUDGET criteria's
time, not one time-out per criterion, and an honest answer that is slow on one performance criterion is still graded
on the rest. The answer's module itself (its top-level code, run again in each criterion's fresh sandbox) gets
IMPORT_CPU_S of CPU: a module that does not finish importing in that time, or stalls while importing, fails that
criterion and the rest at once, since it would not on the next one either. An honest module imports in well under a
second, its libraries (pandas, sqlalchemy, fastapi) included.

Reasons name the criterion's line and the kind of failure (assertion, the answer raised X, not plain data,
exited, timed out); they never quote the test or anything the answer printed.

Input on stdin: {"checks": [{"test", "timeout", ...}, ...], "broker_fd": the broker's socket};
output on stdout: one JSON line {"result": [passed, reason]} per criterion, as each ends.
"""

import builtins
import json
import keyword
import sys
import time
import traceback

from minigrpo.judge import standins, wire
from minigrpo.judge.driver_answer import STALL_S, WALL_FACTOR, Answer, Broker, CaseFatal  # noqa: F401 (constants: API)

TEST_FILE = "<criterion>"
ANSWER_BUDGET = 1.5     # an answer's CPU budget across its criteria, in multiples of its largest criterion timeout
IMPORT_CPU_S = 3.0      # CPU for the answer's top-level code, each criterion (all of pandas+sqlalchemy+fastapi: ~1.1)
NOT_IMPORTED = "not run: the answer's module did not finish importing on an earlier criterion"


# ---------------------------------------------------------------------------------------------------------------
# Running one criterion

class _SolutionModule:
    """What `import solution` gives the test: the answer's public names as proxies (or plain values)."""

    def __init__(self, names):
        self.__dict__.update(names)


def public_names(names):
    """The answer's names a test may see: public identifiers only (no dunder such as `__builtins__`, no keyword)."""
    if type(names) is not dict:
        return None
    return {k: v for k, v in names.items() if type(k) is str and k.isidentifier() and not k.startswith("_")
            and not keyword.iskeyword(k)}


def _public_name(cls):
    """An exception's class as a reason may name it: builtins by name, the answer's own classes by their base (a
    class name is text the answer chose)."""
    if cls.__module__ == "builtins":
        return cls.__name__
    base = next((k.__name__ for k in cls.__mro__[1:] if k.__module__ == "builtins"), "Exception")
    return f"an exception of the answer's own class ({base} subclass)" if cls.__module__ == "solution" else base


def _test_line(tb):
    line = None
    for frame, lineno in traceback.walk_tb(tb):
        if frame.f_code.co_filename == TEST_FILE:
            line = lineno
    return f"line {line}" if line else "its set-up"


def run_criterion(broker, index, check, cpu_s):
    """(passed: bool, reason, charged CPU seconds, whether the answer's module finished importing) for one python
    check; the test reaches the answer only through its sandbox, never its source."""
    answer = None
    try:
        answer = Answer(broker, index, cpu_s, share=check.get("shared") is True)
        return (*_run_test(answer, check, cpu_s), True)
    except (CaseFatal, Exception):     # CaseFatal is no Exception: the answer's own `except Exception` misses it
        return (*_failed(answer, cpu_s), answer is None or answer.imported or not answer.failure)
    finally:
        sys.modules.pop("solution", None)
        if answer is not None:
            answer.close()


def _run_test(answer, check, cpu_s):
    """(passed, reason, charged CPU seconds); raises for a failure, which _failed words."""
    names = public_names(answer.import_names(min(cpu_s, IMPORT_CPU_S)))
    if names is None:
        return False, "the answer's module did not list its names", cpu_s
    module = _SolutionModule(names)
    sys.modules["solution"] = module
    scope = _scope(answer, names, module)
    exec(compile(check["test"], TEST_FILE, "exec"), scope)
    if answer.failure:
        return False, answer.failure, cpu_s
    answer.check_cpu()
    return True, "tests passed", 0.0


def _failed(answer, cpu_s):
    """(False, reason, charged CPU seconds) for the exception being handled."""
    e = sys.exc_info()[1]
    where = _test_line(e.__traceback__)
    if isinstance(e, CaseFatal):
        return False, f"{e} (at {where})", _charge(answer, cpu_s)
    if isinstance(e, AssertionError):
        return False, f"assertion failed at {where}", _charge(answer, cpu_s)
    if answer is not None and answer.failure:
        return False, f"{answer.failure} (at {where})", cpu_s
    return False, f"{_public_name(type(e))} at {where}", _charge(answer, cpu_s)


def _charge(answer, cpu_s):
    """What a failed criterion costs the answer's budget: all of it after a time-out or stall, else what it used;
    nothing when its sandbox never started (the judge's set-up failed: its inputs source, the broker)."""
    if answer is None:
        return 0.0
    if answer.failure:
        return cpu_s
    return min(cpu_s, answer.cpu_seconds())


def _scope(answer, names, module):
    def raises(exc, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except exc:
            return True
        except Exception:
            return False
        return False

    def deadline(cpu_seconds):      # Answer._watch stops the sandbox the moment it is over, not at the next call
        answer.limit_cpu(cpu_seconds)

    def in_sandbox(source, **inputs):
        codec = answer.endpoint.codec
        return answer.request("exec", source=source, kwargs=[[k, codec.encode(v)] for k, v in inputs.items()])

    def implementation():
        """The check's `implementation` in a sandbox of its own: its public names as proxies. A suite answer gets
        them through stand_in functions of the test's, so it reaches the implementation only by calls, which the
        test can count, and never its source, names or docstrings."""
        other = Answer(answer.broker, answer.index, answer.cpu_s, role="implementation", share=answer.share)
        answer.companions.append(other)
        return _SolutionModule(public_names(other.request("import", share=answer.share)) or {})

    made = answer.inputs
    helpers = {"__name__": "__criterion__", "implementation": implementation, "__builtins__": builtins,
               "INPUTS": made.get("path"), "prepared": made.get("result"), "INPUT_FILES": made.get("files", {}),
               "raises": raises, "deadline": deadline, "in_sandbox": in_sandbox,
               "memory_peak_mb": answer.memory_peak_mb, "open_files": answer.open_files,
               "opened_inputs": answer.opened_inputs, "stand_in": wire.StandIn,
               "sqlite_stand_in": standins.sqlite_stand_in, "solution": module}
    # the answer's names, as `from solution import *` would give them -- except any that would shadow a builtin
    # or one of our helpers (an answer's own `sorted` or `raises` must not decide a comparison); the test always
    # runs with the driver's own builtins
    scope = {k: v for k, v in names.items() if k not in helpers and not hasattr(builtins, k)}
    scope.update(helpers)
    time.process_time = answer.cpu_seconds       # the sandbox's CPU, read from outside
    return scope


def main():
    job = json.load(sys.stdin)
    broker = Broker(int(job["broker_fd"]))
    real_clock = time.process_time
    timeouts = [float(check.get("timeout", 10.0)) for check in job["checks"]]
    budget = ANSWER_BUDGET * max(timeouts, default=0.0)
    imports = True
    for i, check in enumerate(job["checks"]):
        time.process_time = real_clock
        if "asyncio" in sys.modules:    # a criterion's own event loop does not leak into the next
            sys.modules["asyncio"].set_event_loop(None)
        if not imports:
            result = [False, NOT_IMPORTED]
        elif budget <= 0.05:
            result = [False, "not run: the answer spent its time budget on earlier criteria"]
        else:
            passed, reason, spent, imports = run_criterion(broker, i, check, min(timeouts[i], budget))
            budget -= spent
            result = [passed, reason]
        print(json.dumps({"result": result}), flush=True)     # as it goes: a driver killed later keeps it


if __name__ == "__main__":
    main()
