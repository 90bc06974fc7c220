"""Python checks, decided outside the answer's process: the trusted driver.

The answer is code written by the policy being trained, so it is an adversary. Its code never runs in the process
that decides. This driver is a process of its own, itself confined (minigrpo/driver_host.py starts it in a sandbox
of its own: a uid of its own, no project tree, a memory cap), and for each criterion it

  1. asks the judge's broker (driver_host.py) for a fresh sandbox running the answer as module `solution`, served
     by minigrpo/wire_rpc.py over a pipe; the broker makes it with the criterion's own limits (the driver can only
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
  memory_peak_mb()                  the most memory the sandbox (all its processes and files) has held so far, in
                                    MB, read from its cgroup outside the answer; None where there is no cgroup
  in_sandbox(source, **inputs)      run a harness snippet beside the answer and return its `result` (plain data):
                                    for criteria that need the answer's objects in its own process (an event loop,
                                    a monkeypatched library, click's runner). The snippet shares the answer's
                                    process, so its `result` may only be the answer's outputs, compared here;
                                    anything it measures is the answer's word (see "evidence" in checks.py).
  stand_in(**members)               an object to hand the answer (an rng, a clock, a fetcher): its members are
                                    functions, which the answer may only call, and plain data; it crosses by value
                                    (wire.StandIn), so its state and its call counts stay here, out of reach
  sqlite_stand_in(conn)             a stand-in for a sqlite3 connection that stays here (minigrpo/standins.py)
  solution_source                   the answer's code as text (for code-inspection criteria)

One budget per answer: what its failing criteria may cost together is ANSWER_BUDGET times its largest criterion
timeout, in CPU seconds. A criterion that fails is charged the CPU it used, and its whole timeout when it timed out
or stalled (no CPU progress for STALL_S while a reply is awaited); a passing one costs nothing (it did the work it
was given). Once the budget is spent the remaining criteria fail at once, so a sleeping or spinning answer costs
about ANSWER_BUDGET criteria's time, not one time-out per criterion, and an honest answer that is slow on one
performance criterion is still graded on the rest.

Reasons name the criterion's line and the kind of failure (assertion, the answer raised X, not plain data,
exited, timed out); they never quote the test or anything the answer printed.

Input on stdin: {"code": ..., "checks": [{"test", "timeout", ...}, ...], "broker_fd": the broker's socket};
output on stdout: one JSON line {"results": [[passed, reason], ...]}.
"""

import builtins
import collections.abc
import json
import keyword
import os
import socket
import sys
import threading
import time
import traceback

from minigrpo import standins, wire, wire_rpc

TEST_FILE = "<criterion>"
WALL_FACTOR = 3         # a criterion's wall-clock limit, in multiples of its `timeout` (which is CPU seconds)
WATCH_EVERY = 0.05      # seconds between two readings of the sandbox's CPU and wall time
STALL_S = 3.0           # no CPU progress for this long while the driver awaits a reply: the answer sleeps or blocks
ANSWER_BUDGET = 2.0     # an answer's CPU budget across its criteria, in multiples of its largest criterion timeout


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
    share_exception_classes = False     # a test's exception crosses by name and base only, never as a handle

    def __init__(self, rfile, wfile, make_proxy, handle):
        super().__init__("d", rfile, wfile, make_proxy, handle, call_only=True)

    def exception(self, name, base, text, handle):
        if handle is not None:
            try:
                cls = self.codec.decode(handle)
            except wire.ProtocolError:
                cls = None
            if getattr(cls, "__module__", None) == "solution" and isinstance(cls, type) and \
                    issubclass(cls, Exception):     # a mirror of the answer's own exception class, made here
                return cls(text)
        builtin = wire._PLAIN_EXC.get(name)
        if builtin is not None and issubclass(builtin, Exception):
            return builtin(text)
        return super().exception(name, base, text, handle)


# ---------------------------------------------------------------------------------------------------------------
# The judge's broker, seen from here: sandboxes are made and measured by the judge, never by this process

class Broker:
    """Requests to the broker (minigrpo/driver_host.py) over a SOCK_SEQPACKET socket: one JSON message each way;
    a started sandbox's two pipe ends come with the reply as passed file descriptors."""

    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.lock = threading.Lock()

    def ask(self, **request):
        with self.lock:
            self.sock.send(json.dumps(request).encode())
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 2)
        if not data:
            raise CaseFatal("the judge's broker is gone")
        reply = json.loads(data)
        if "error" in reply:
            raise CaseFatal(f"the sandbox could not be started ({str(reply['error'])[:200]})")
        return reply, fds


# ---------------------------------------------------------------------------------------------------------------
# One sandboxed answer process

class Answer:
    """The answer's sandboxed process (made by the broker) and the driver's end of its channel, with its time
    limits: `cpu_s` CPU seconds of the whole sandbox, WALL_FACTOR times that in wall seconds, and no stall longer
    than STALL_S while a reply is awaited. CPU time does not grow when the machine is loaded, so an honest answer
    passes on a busy host (8 judge workers on 2 cores, beside training) as on an idle one."""

    def __init__(self, broker, index, cpu_s):
        self.broker, self.cpu_s, self.failure, self.stalled = broker, cpu_s, None, False
        reply, fds = broker.ask(op="start", criterion=index, cpu_s=cpu_s)
        if len(fds) != 2:
            raise CaseFatal("the broker sent no channel")
        self.id, self.t0 = reply["id"], time.monotonic()
        self.endpoint = DriverEndpoint(os.fdopen(fds[0], "rb", buffering=0), os.fdopen(fds[1], "wb", buffering=0),
                                       self._proxy, self._serve)
        self.cpu_budget = None
        self.waiting = 0                # requests in flight (nested callbacks count once each)
        self.closed = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        last_cpu, last_progress = -1.0, time.monotonic()
        while not self.closed.wait(WATCH_EVERY):
            now, cpu = time.monotonic(), self.cpu_seconds()
            if cpu != last_cpu or not self.waiting:
                last_cpu, last_progress = cpu, now
            if cpu > self.cpu_s:
                self.failure = self.failure or f"timed out: used its {self.cpu_s:g}s of CPU"
            elif now - self.t0 > WALL_FACTOR * self.cpu_s:
                self.failure = self.failure or f"timed out after {WALL_FACTOR * self.cpu_s:g}s (wall clock)"
            elif now - last_progress > STALL_S:
                self.stalled = True
                self.failure = self.failure or f"stalled: no progress for {STALL_S:g}s (it sleeps or blocks)"
            else:
                continue
            self.close()
            return

    def _proxy(self, hid, kind, info):
        if kind == "class" and "exception" in info:
            return _exception_mirror(info.get("name", "AnswerError"), info["exception"])
        return Remote(self, ["H", hid, kind, info])

    def _serve(self, message):
        """A callback from the answer into what the test handed it: only calling a function or stepping an
        iterator. No attribute of either is served (no way to a frame, globals, a closure or a class)."""
        codec = self.endpoint.codec
        target = codec.decode(message["target"])
        op, kind = message.get("op"), wire.call_only_kind(target)
        if op == "call" and kind == "callable":
            args = [codec.decode(a) for a in message.get("args", [])]
            kwargs = {str(k): codec.decode(v) for k, v in message.get("kwargs", [])}
            return target(*args, **kwargs)
        if op == "unary" and kind == "iterator" and message.get("name") in ("iter", "next"):
            return next(target) if message["name"] == "next" else target
        if op == "getattr":     # the answer sees what an object without that attribute would give it
            raise AttributeError(f"{str(message.get('name'))[:40]}: not reachable from the answer")
        raise TypeError(f"{str(op)[:20]!r} is not allowed on a {kind or 'driver'} object of the test")

    def request(self, op, **fields):
        if self.failure:
            raise CaseFatal(self.failure)
        self.waiting += 1
        try:
            result = self.endpoint.request(op, **fields)
        except wire.PeerGone:
            self.failure = self.failure or "the answer's process exited or was killed (an exit is never a pass)"
            raise CaseFatal(self.failure) from None
        except wire.ProtocolError as e:
            self.failure = self.failure or f"the answer's reply is not plain data ({e})"
            raise CaseFatal(self.failure) from None
        finally:
            self.waiting -= 1
        self.check_cpu()
        return result

    def cpu_seconds(self):
        try:
            return float(self.broker.ask(op="cpu", id=self.id)[0]["cpu"])
        except (CaseFatal, OSError, ValueError, KeyError, TypeError):
            return float("inf")

    def memory_peak_mb(self):
        try:
            return self.broker.ask(op="memory", id=self.id)[0]["memory_mb"]
        except (CaseFatal, OSError, ValueError, KeyError):
            return None

    def check_cpu(self):
        if self.cpu_budget is not None and self.cpu_seconds() > self.cpu_budget:
            self.failure = "over the criterion's CPU-time limit"
            raise CaseFatal(self.failure)

    def close(self):
        if self.closed.is_set():
            return
        self.closed.set()
        for f in (self.endpoint.rfile, self.endpoint.wfile):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.broker.ask(op="close", id=self.id)
        except (CaseFatal, OSError, ValueError):
            pass


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


def run_criterion(broker, index, code, check, cpu_s):
    """(passed: bool, reason, charged CPU seconds) for one python check on the answer's code."""
    answer = None
    try:
        answer = Answer(broker, index, cpu_s)
        names = public_names(answer.request("import"))
        if names is None:
            return False, "the answer's module did not list its names", cpu_s
        module = _SolutionModule(names)
        sys.modules["solution"] = module
        scope = _scope(answer, code, names, module)
        exec(compile(check["test"], TEST_FILE, "exec"), scope)
        if answer.failure:
            return False, answer.failure, cpu_s
        answer.check_cpu()
        return True, "tests passed", 0.0
    except CaseFatal as e:
        return False, f"{e} (at {_test_line(e.__traceback__)})", _charge(answer, cpu_s)
    except AssertionError as e:
        return False, f"assertion failed at {_test_line(e.__traceback__)}", _charge(answer, cpu_s)
    except Exception as e:
        where = _test_line(e.__traceback__)
        if answer is not None and answer.failure:
            return False, f"{answer.failure} (at {where})", cpu_s
        return False, f"{_public_name(type(e))} at {where}", _charge(answer, cpu_s)
    finally:
        sys.modules.pop("solution", None)
        if answer is not None:
            answer.close()


def _charge(answer, cpu_s):
    """What a failed criterion costs the answer's budget: all of it after a time-out or stall, else what it used."""
    if answer is None or answer.failure:
        return cpu_s
    return min(cpu_s, answer.cpu_seconds())


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
        answer.cpu_budget = answer.cpu_seconds() + cpu_seconds

    def in_sandbox(source, **inputs):
        codec = answer.endpoint.codec
        return answer.request("exec", source=source, kwargs=[[k, codec.encode(v)] for k, v in inputs.items()])

    helpers = {"__name__": "__criterion__", "__builtins__": builtins, "raises": raises, "deadline": deadline,
               "in_sandbox": in_sandbox, "memory_peak_mb": answer.memory_peak_mb, "stand_in": wire.StandIn,
               "sqlite_stand_in": standins.sqlite_stand_in, "solution": module,
               "solution_source": code}
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
    results = []
    for i, check in enumerate(job["checks"]):
        time.process_time = real_clock
        if "asyncio" in sys.modules:    # a criterion's own event loop does not leak into the next
            sys.modules["asyncio"].set_event_loop(None)
        if budget <= 0.05:
            results.append([False, "not run: the answer spent its time budget on earlier criteria"])
            continue
        passed, reason, spent = run_criterion(broker, i, job["code"], check, min(timeouts[i], budget))
        budget -= spent
        results.append([passed, reason])
    print(json.dumps({"results": results}), flush=True)


if __name__ == "__main__":
    main()
