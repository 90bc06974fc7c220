"""Python checks, decided outside the answer's process: the trusted driver.

The answer is code written by the policy being trained, so it is an adversary. Its code never runs in the process
that decides. For each criterion this driver (a process of its own, started by `checks.run_python_checks`)

  1. starts the answer in a fresh sandbox (minigrpo/sandbox.py: no view of the project, the task file, run folders
     or other samples) as module `solution`, served by minigrpo/wire_rpc.py over a pipe;
  2. runs the criterion's test code here, with `solution` (and its names) replaced by proxies: every call, attribute
     read or item access on the answer's functions, classes and objects travels to the sandbox, and only plain,
     exactly-typed data comes back (wire.py) -- so expected values, comparisons, asserts and timing all live here;
  3. passes the criterion only if the test ran to its end with the sandbox still answering. Exit status is never
     evidence: an answer that exits, is killed, times out or replies with something that is not plain data fails
     the case it was in.

Helpers a test sees besides the answer's names:
  raises(exc, fn, *args, **kwargs)  True when fn raised exc (by class: the answer's exceptions cross by name)
  deadline(cpu_seconds)             performance criteria: fail once the sandbox has used that much more CPU
  time.process_time()               the sandbox's CPU seconds, measured from outside (the sandbox's rusage), so
                                    the answer cannot fake it with its own clock or signals
  in_sandbox(source, **inputs)      run a trusted harness snippet beside the answer and return its `result` (plain
                                    data): for criteria that need the answer's objects in its own process (an event
                                    loop, a monkeypatched library, click's runner). The snippet holds inputs and
                                    fakes, never expected values: the asserts stay here.
  memory_peak_mb()                  the most memory the sandbox (all its processes and files) has held so far, in
                                    MB, read from its cgroup outside the answer; None where there is no cgroup
  solution_source                   the answer's code as text (for code-inspection criteria)

A check may also carry `files` ({name: text}, placed in the sandbox's work folder before the answer starts, e.g.
the implementations an answer's own test suite is run against) and `stub_if_missing` ({module: source}, placed
only when the judge's Python cannot import that module).

Reasons name the criterion's line and the kind of failure (assertion, the answer raised X, not plain data,
exited, timed out); they never quote the test or anything the answer printed.

Input on stdin: {"code": ..., "checks": [{"test", "timeout", "memory_mb", ...}, ...]}; output on stdout: one JSON
line {"results": [[passed, reason], ...], "weaknesses": [...]}.
"""

import binascii
import builtins
import collections.abc
import importlib.util
import json
import marshal
import sys
import threading
import time
import traceback

from minigrpo import wire, wire_rpc
from minigrpo.sandbox import Limits, Sandbox

# The sandboxed child's program: the channel's codec, then its request/reply and server (see wire_rpc.py). It is
# compiled here once and handed over as marshalled bytecode (the child runs this same interpreter), so that no
# sandbox spends its start-up compiling 650 lines.
CHILD_SOURCE = open(wire.__file__).read() + "\n" + open(wire_rpc.__file__).read()
CHILD_PROGRAM = "import binascii as _b, marshal as _m\nexec(_m.loads(_b.a2b_base64(%r)))\n" % binascii.b2a_base64(
    marshal.dumps(compile(CHILD_SOURCE, "<sandbox child>", "exec")), newline=False).decode()
TEST_FILE = "<criterion>"
WALL_FACTOR = 3         # a criterion's wall-clock limit, in multiples of its `timeout` (which is CPU seconds)
WATCH_EVERY = 0.05      # seconds between two readings of the sandbox's CPU and wall time


class CaseFailed(Exception):
    """Raised in the test's code when a case cannot go on (sandbox gone, protocol error, time limit)."""


class CaseFatal(BaseException):
    """Like CaseFailed, but not catchable by a test's `except Exception` (or `raises`): the answer is gone."""


# ---------------------------------------------------------------------------------------------------------------
# Stand-ins for the answer's objects

class Remote:
    """An object living in the sandbox. Calls and attribute reads are forwarded; equality, hashing and truth are
    decided here (identity), never by the answer's code."""

    __slots__ = ("_answer", "_ref", "__weakref__")

    def __init__(self, answer, ref):
        object.__setattr__(self, "_answer", answer)
        object.__setattr__(self, "_ref", ref)

    def _ask(self, op, *args, **fields):
        codec = self._answer.endpoint.codec
        return self._answer.request(op, target=self._ref, args=[codec.encode(a) for a in args], **fields)

    def __call__(self, *args, **kwargs):
        codec = self._answer.endpoint.codec
        return self._answer.request("call", target=self._ref, args=[codec.encode(a) for a in args],
                                    kwargs=[[k, codec.encode(v)] for k, v in kwargs.items()])

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", value, name=name)

    def __len__(self):
        n = self._ask("unary", name="len")
        if type(n) is not int:
            raise TypeError("len() of an answer object did not return an int")
        return n

    def __iter__(self):
        it = self._ask("unary", name="iter")
        return it if isinstance(it, Remote) else iter(it)

    def __next__(self):
        return self._ask("unary", name="next")

    def __contains__(self, item):
        found = self._ask("binary", item, name="contains")
        if type(found) is not bool:
            raise TypeError("`in` on an answer object did not return a bool")
        return found

    def __getitem__(self, key):
        return self._ask("binary", key, name="getitem")

    def __setitem__(self, key, value):
        self._ask("binary", key, value, name="setitem")

    def __delitem__(self, key):
        self._ask("binary", key, name="delitem")

    def __bool__(self):
        raise TypeError("the truth of an answer object is not plain data (return a bool)")

    def __repr__(self):
        return f"<answer {self._ref[2]} {self._ref[3].get('name', '?')}>"

    def __instancecheck__(self, obj):     # isinstance(x, AnswerClass)
        return isinstance(obj, Remote) and obj._ref[3].get("cls") == self._ref[1]

    def __await__(self):                  # an answer coroutine: run to completion in the sandbox
        result = self._ask("await")
        return result
        yield  # noqa: unreachable -- makes this a generator, as __await__ must be


collections.abc.Coroutine.register(Remote)    # so asyncio.run(answer_coroutine()) accepts it


def _exception_mirror(name, base):
    """A real exception class standing for one the answer defined: raised here when the answer raises it."""
    parent = wire._PLAIN_EXC.get(base, Exception)
    if not issubclass(parent, Exception):
        parent = Exception
    return type(str(name), (parent,), {"__module__": "solution"})


class DriverEndpoint(wire_rpc.Endpoint):
    def exception(self, name, base, text, handle):
        if handle is not None:
            try:
                cls = self.codec.decode(handle)
            except wire.ProtocolError:
                cls = None
            if isinstance(cls, type) and issubclass(cls, Exception):
                return cls(text)
        builtin = wire._PLAIN_EXC.get(name)
        if builtin is not None and issubclass(builtin, Exception):
            return builtin(text)
        return super().exception(name, base, text, handle)


# ---------------------------------------------------------------------------------------------------------------
# One sandboxed answer process

class Answer:
    """The answer's sandboxed process and the driver's end of its channel, with its time limits: the criterion's
    `timeout` in CPU seconds of the whole sandbox, and WALL_FACTOR times that in wall seconds (for an answer that
    sleeps or blocks). CPU time does not grow when the machine is loaded, so an honest answer passes on a busy
    host (8 judge workers on 2 cores, beside training) as on an idle one."""

    def __init__(self, code, limits, files=None):
        self.limits, self.failure = limits, None
        self.sandbox = Sandbox({**(files or {}), "solution.py": code}, limits)
        proc = self.sandbox.start(python_source=CHILD_PROGRAM)
        self.endpoint = DriverEndpoint("d", proc.stdout, proc.stdin, self._proxy, self._serve)
        self.cpu_budget = None
        self.closed = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while not self.closed.wait(WATCH_EVERY):
            if self.cpu_seconds() > self.limits.cpu_budget:
                self.failure = self.failure or f"timed out: used its {self.limits.cpu_budget:g}s of CPU"
            elif self.sandbox.wall_seconds() > self.limits.timeout:
                self.failure = self.failure or f"timed out after {self.limits.timeout:g}s (wall clock)"
            else:
                continue
            self.sandbox.close()
            return

    def _proxy(self, hid, kind, info):
        if kind == "class" and "exception" in info:
            return _exception_mirror(info.get("name", "AnswerError"), info["exception"])
        return Remote(self, ["H", hid, kind, info])

    def _serve(self, message):
        """A callback from the answer into an object the test handed it (a fake clock, an rng, a fetcher)."""
        codec = self.endpoint.codec
        target = codec.decode(message["target"])
        args = [codec.decode(a) for a in message.get("args", [])]
        kwargs = {str(k): codec.decode(v) for k, v in message.get("kwargs", [])}
        op = message.get("op")
        if op == "call":
            return target(*args, **kwargs)
        if op == "getattr":
            name = str(message["name"])
            if name.startswith("_"):    # no way from a callback to its function's globals, class or frame
                raise AttributeError(f"{name}: not reachable from the answer")
            return getattr(target, name)
        if op == "unary" and message.get("name") in ("len", "iter", "next"):
            return {"len": len, "iter": iter, "next": next}[message["name"]](target)
        raise wire.ProtocolError(f"callback op {str(op)[:20]!r} not allowed")

    def request(self, op, **fields):
        if self.failure:
            raise CaseFatal(self.failure)
        try:
            result = self.endpoint.request(op, **fields)
        except wire.PeerGone:
            self.failure = self.failure or "the answer's process exited or was killed (an exit is never a pass)"
            raise CaseFatal(self.failure) from None
        except wire.ProtocolError as e:
            self.failure = f"the answer's reply is not plain data ({e})"
            raise CaseFatal(self.failure) from None
        self.check_cpu()
        return result

    def cpu_seconds(self):
        return self.sandbox.cpu_seconds()

    def check_cpu(self):
        if self.cpu_budget is not None and self.cpu_seconds() > self.cpu_budget:
            self.failure = "over the criterion's CPU-time limit"
            raise CaseFatal(self.failure)

    def close(self):
        self.closed.set()
        self.sandbox.close()


# ---------------------------------------------------------------------------------------------------------------
# Running one criterion

class _SolutionModule:
    """What `import solution` gives the test: the answer's public names as proxies (or plain values)."""

    def __init__(self, names):
        self.__dict__.update(names)


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


def run_criterion(code, check):
    """(passed: bool, reason) for one python check on the answer's code."""
    seconds = float(check.get("timeout", 10.0))
    limits = Limits(timeout=WALL_FACTOR * seconds, cpu_s=seconds, memory_mb=int(check.get("memory_mb", 2048)),
                    nproc=int(check.get("nproc", 64)), fsize_mb=int(check.get("fsize_mb", 16)))
    files = {f"{name}.py": source for name, source in check.get("stub_if_missing", {}).items()
             if importlib.util.find_spec(name) is None}
    files.update(check.get("files", {}))
    answer = None
    try:
        answer = Answer(code, limits, files)
        names = answer.request("import")
        if type(names) is not dict:
            return False, "the answer's module did not list its names"
        module = _SolutionModule(names)
        sys.modules["solution"] = module
        scope = _scope(answer, code, names, module)
        source = compile(check["test"], TEST_FILE, "exec")
        exec(source, scope)
        if answer.failure:
            return False, answer.failure
        answer.check_cpu()
        return True, "tests passed"
    except CaseFatal as e:
        return False, f"{e} (at {_test_line(e.__traceback__)})"
    except AssertionError as e:
        return False, f"assertion failed at {_test_line(e.__traceback__)}"
    except Exception as e:
        where = _test_line(e.__traceback__)
        if answer is not None and answer.failure:
            return False, f"{answer.failure} (at {where})"
        return False, f"{_public_name(type(e))} at {where}"
    finally:
        sys.modules.pop("solution", None)
        if answer is not None:
            answer.close()


def _scope(answer, code, names, module):
    def raises(exc, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except exc:
            return True
        except Exception:
            return False
        return False

    def deadline(cpu_seconds):
        answer.cpu_budget = budget = answer.cpu_seconds() + cpu_seconds
        threading.Thread(target=stop_when_over, args=(budget,), daemon=True).start()

    def stop_when_over(budget):     # the moment the sandbox is over, not at the test's next call into it
        while not answer.closed.wait(WATCH_EVERY) and answer.cpu_budget == budget:
            if answer.cpu_seconds() > budget:
                answer.failure = answer.failure or "over the criterion's CPU-time limit"
                answer.sandbox.close()
                return

    def in_sandbox(source, **inputs):
        codec = answer.endpoint.codec
        return answer.request("exec", source=source, kwargs=[[k, codec.encode(v)] for k, v in inputs.items()])

    def memory_peak_mb():
        return answer.sandbox.memory_peak_mb()

    helpers = {"__name__": "__criterion__", "raises": raises, "deadline": deadline, "in_sandbox": in_sandbox,
               "memory_peak_mb": memory_peak_mb, "solution": module, "solution_source": code}
    # the answer's names, as `from solution import *` would give them -- except any that would shadow a builtin
    # or one of our helpers (an answer's own `sorted` or `raises` must not decide a comparison)
    scope = {k: v for k, v in names.items() if k not in helpers and not hasattr(builtins, k)}
    scope.update(helpers)
    time.process_time = answer.cpu_seconds       # the sandbox's CPU, read from outside
    return scope


def main():
    job = json.load(sys.stdin)
    real_clock = time.process_time
    results = []
    for check in job["checks"]:
        time.process_time = real_clock
        if "asyncio" in sys.modules:    # a criterion's own event loop does not leak into the next
            sys.modules["asyncio"].set_event_loop(None)
        results.append(list(run_criterion(job["code"], check)))
    from minigrpo.sandbox import isolation
    print(json.dumps({"results": results, "weaknesses": isolation()[1]}), flush=True)


if __name__ == "__main__":
    main()
