"""The driver's end of one answer: the answer's sandboxed process, seen from the check driver (driver.py).

`Answer` asks the judge's broker (driver_host.py) for a sandbox running the answer, holds the driver's end
of its channel (wire_rpc.Endpoint) and watches its time: its CPU seconds as the broker reads them from the
sandbox's cgroup, stalls (while the driver waits on it, its threads mostly neither run nor wait for a CPU), and a
last-resort wall-clock ceiling.
`Remote` stands in for an object living in the sandbox; `_serve` answers the answer's callbacks into what the
test handed it -- calling a function or stepping an iterator, nothing else of the driver (wire.Codec's call_only
encodes nothing but those and plain data).
"""

import collections.abc
import json
import os
import re
import select
import socket
import threading
import time

from minigrpo.judge import wire, wire_rpc

# The clocks (docs/judge.md, "A busy host"): CPU seconds for every budget; for a stall, the share of the driver's
# wait on the answer in which the answer's threads ran or waited for a CPU; wall time only as the ceiling below.
WALL_FACTOR = 10        # the ceiling: WALL_FACTOR x the criterion's CPU seconds + WALL_SLACK_S, in wall seconds
WALL_SLACK_S = 10.0     # the sandbox's start and the answer's import, on a loaded host
WATCH_EVERY = 0.05      # seconds between two readings of the sandbox's CPU and demand
STALL_S = 3.0           # the stall window: the last STALL_S wall seconds of the driver's waits on the answer
STALL_SHARE = 0.5       # stalled when the answer ran or waited for a CPU under this share of a full window
TOO_LARGE = "the answer's reply is too large (over the message cap, counted as if copied)"
NOT_PLAIN = "the answer's reply is not plain data"
TOO_MANY_FDS = "the answer holds more descriptors than the judge lists (a leak in itself)"
HELD_ID = re.compile(r"[0-9]{1,20}:[0-9]{1,20}")     # "device:inode", as procs.open_files names a file
STALLED = f"stalled: it ran or waited for a CPU for under {STALL_SHARE:.0%} of {STALL_S:g}s (it sleeps or blocks)"


def wall_ceiling(cpu_s):
    """A criterion's wall-clock ceiling for `cpu_s` CPU seconds: only an answer that neither finishes, nor spends
    its CPU, nor stalls (a sleep of a millisecond in a loop) meets it; an honest one is ended by it only on a host
    loaded past ten runnable processes per core for its whole run."""
    return WALL_FACTOR * cpu_s + WALL_SLACK_S


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

    def __init__(self, rfile, wfile, make_proxy, handle, share=False):
        super().__init__("d", rfile, wfile, make_proxy, handle, call_only=True, share=share)

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
    """Requests to the broker (minigrpo/judge/driver_host.py) over a SOCK_SEQPACKET socket: one JSON message each way;
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

OVER_LIMIT = "over the criterion's CPU-time limit"

class StallWindow:
    """The stall rule: of the last STALL_S seconds the driver spent inside single waits on the answer, the answer
    must have run or waited for a CPU for at least STALL_SHARE (its CPU seconds plus its threads' run-queue wait).
    A sleep, a blocking read, or a sleep broken by a spin of a few milliseconds gains neither and fills the window
    at once; a busy host only adds run-queue wait. Only a look interval that lies inside one wait counts, so the
    driver's own work and its wake-up after a reply (between waits) never do, nor do waits shorter than a look: an
    answer polling a stand-in of the driver's every few milliseconds asks for something each time."""

    def __init__(self):
        self.samples = collections.deque()      # (wall seconds, busy seconds) per look interval inside a wait

    def add(self, wall, busy):
        self.samples.append((wall, busy))
        while sum(w for w, _ in self.samples) - self.samples[0][0] >= STALL_S:
            self.samples.popleft()

    def stalled(self):
        wall = sum(w for w, _ in self.samples)
        return wall >= STALL_S and sum(b for _, b in self.samples) < STALL_SHARE * wall


def _busy(before, cpu, waited, runnable, wall):
    """Seconds of `wall` in which the answer ran or waited for a CPU between two looks: its CPU seconds plus its
    threads' run-queue wait (none where the kernel keeps no schedstat), at most `wall`, since a hundred threads
    woken together wait in the queue a hundred times over. A thread runnable or in the kernel's uninterruptible wait
    at the look counts the whole interval (a thread that exited took its wait with it; D is a wait the host imposes,
    a kernel lock a fork bomb beside it holds busy)."""
    if runnable:
        return wall
    queued = max(0, waited - before[1]) / 1e9 if waited is not None and before[1] is not None else 0.0
    return min(wall, max(0.0, cpu - before[0]) + queued)


class _Awaited:
    """One end of the answer's pipe, as the driver uses it: the answer is awaited only while the driver blocks in
    a read or write here, so the driver's own work in between (decoding a reply, running a callback, comparing)
    never counts as the answer's stall."""

    def __init__(self, f, answer):
        self.f, self.answer = f, answer

    def _blocking(self, op, *args):
        self.answer.waits += 1          # the watch judges only time inside one wait (StallWindow)
        self.answer.awaiting = True
        try:
            return op(*args)
        finally:
            self.answer.awaiting = False

    def read(self, n):
        return self._blocking(self.f.read, n)

    def write(self, data):
        return self._blocking(self.f.write, data)

    def flush(self):
        return self._blocking(self.f.flush)

    def close(self):
        self.f.close()


def _held(files):
    """A list of what the sandbox holds, as the broker read it. One cut short at procs.MAX_FDS descriptors ends in
    an entry that is no file's id; it is the same entry in every cut list, so a test that compares two lists (what
    the answer opened since a look before the call) would see no difference, and the files past the cut would
    never be seen: the case fails instead."""
    if type(files) is not list or not all(type(f) is str for f in files):
        raise CaseFatal("the broker's list of open files is malformed")
    if not all(HELD_ID.fullmatch(f) for f in files):
        raise CaseFatal(TOO_MANY_FDS)
    return files


class Answer:
    """The answer's sandboxed process (made by the broker) and the driver's end of its channel, with its time
    limits: `cpu_s` CPU seconds of the whole sandbox, no stall (StallWindow) while the driver waits for the answer,
    and wall_ceiling(cpu_s) as the last resort. None of them runs faster on a busy host: CPU time does not grow
    while the answer waits for a CPU, and a stall counts only time in which it neither ran nor waited to run (read
    by the broker from the host's /proc), with no reply of its waiting in the pipe. `share`: containers keep reference
    semantics (a criterion about mutation); else they cross as copies."""

    def __init__(self, broker, index, cpu_s, role="answer", share=False):
        self.broker, self.index, self.cpu_s, self.failure, self.stalled = broker, index, cpu_s, None, False
        self.share, self.awaiting, self.waits = share, False, 0    # waits: how many the driver has begun
        self.companions = []            # other sandboxes of the same criterion (an implementation), closed with it
        reply, fds = broker.ask(op="start", criterion=index, cpu_s=cpu_s, role=role)
        if len(fds) != 2:
            raise CaseFatal("the broker sent no channel")
        self.id, self.t0 = reply["id"], time.monotonic()
        self.inputs = reply.get("inputs") or {}     # the check's input files, made by the judge (inputs.py)
        self.endpoint = DriverEndpoint(_Awaited(os.fdopen(fds[0], "rb", buffering=0), self),
                                       _Awaited(os.fdopen(fds[1], "wb", buffering=0), self), self._proxy, self._serve,
                                       share)
        self.cpu_budget, self.over_budget = None, OVER_LIMIT     # a limit inside cpu_s, and what breaking it is
        self.imported = False           # the answer's module ran to its end in this sandbox
        self.closed = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        window, last = StallWindow(), None      # last look: (cpu, waited, time, the wait it fell in or None)
        while not self.closed.wait(WATCH_EVERY):
            cpu, waited, runnable = self.activity()
            now = time.monotonic()
            wait = self.waits       # read before `awaiting`: a wait that began since is then a new one, not counted
            if not self.awaiting or self._reply_waiting():
                wait = None
            if wait is not None and last is not None and last[3] == wait:
                window.add(now - last[2], _busy(last, cpu, waited, runnable, now - last[2]))
            last = (cpu, waited, now, wait)
            reason = self._over_limit(cpu, now)
            if reason is None and window.stalled():
                self.stalled = True
                reason = STALLED
            if reason is not None:
                self.failure = self.failure or reason
                self.close()
                return

    def _over_limit(self, cpu, now):
        """The limit the sandbox has run past (CPU, a budget inside it, wall clock), or None."""
        if cpu > self.cpu_s:
            return f"timed out: used its {self.cpu_s:g}s of CPU"
        if self.cpu_budget is not None and cpu > self.cpu_budget:
            return self.over_budget
        if now - self.t0 > wall_ceiling(self.cpu_s):
            return f"timed out at the last-resort wall-clock ceiling ({wall_ceiling(self.cpu_s):g}s)"
        return None

    def _reply_waiting(self):
        """Whether the answer's pipe holds a reply (or its end) the driver has not read yet: the driver is slow,
        not the answer."""
        try:
            return bool(select.select([self.endpoint.rfile.f], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _gone(self):
        """Why the channel closed under a request. The broker's watchdog and the kernel's CPU rlimit end a sandbox
        that ran past its limits too, and on a loaded host they can act before this process's watch has looked:
        that is a time-out (read from outside: the sandbox's CPU and the wall clock), not the answer's exit."""
        return self._over_limit(self.cpu_seconds(), time.monotonic()) or \
            "the answer's process exited or was killed (an exit is never a pass)"

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
        args = [codec.decode(a) for a in message.get("args", [])] if op == "call" else []
        kwargs = {str(k): codec.decode(v) for k, v in message.get("kwargs", [])} if op == "call" else {}
        try:
            codec.check_size(args, kwargs)      # and the shared containers the message refilled, whatever its op
        except wire.TooLarge:
            self.failure = self.failure or TOO_LARGE
            raise CaseFatal(self.failure) from None
        if op == "call" and kind == "callable":
            return target(*args, **kwargs)
        if op == "unary" and kind == "iterator" and message.get("name") in ("iter", "next"):
            return next(target) if message["name"] == "next" else target
        if op == "getattr":     # the answer sees what an object without that attribute would give it
            raise AttributeError(f"{str(message.get('name'))[:40]}: not reachable from the answer")
        raise TypeError(f"{str(op)[:20]!r} is not allowed on a {kind or 'driver'} object of the test")

    def request(self, op, **fields):
        if self.failure:
            raise CaseFatal(self.failure)
        try:
            result = self.endpoint.request(op, **fields)
        except wire.PeerGone:
            self.failure = self.failure or self._gone()
            raise CaseFatal(self.failure) from None
        except wire.TooLarge:
            self.failure = self.failure or TOO_LARGE
            raise CaseFatal(self.failure) from None
        except wire.ProtocolError as e:
            self.failure = self.failure or f"{NOT_PLAIN} ({e})"
            raise CaseFatal(self.failure) from None
        self.check_cpu()
        return result

    def activity(self):
        """(CPU seconds, ns its threads waited for a CPU or None, whether one is runnable), read by the broker."""
        try:
            reply = self.broker.ask(op="cpu", id=self.id, demand=True)[0]
            return float(reply["cpu"]), reply.get("waited"), reply.get("runnable") is True
        except (CaseFatal, OSError, ValueError, KeyError, TypeError):
            return float("inf"), None, False

    def cpu_seconds(self):
        try:
            return float(self.broker.ask(op="cpu", id=self.id)[0]["cpu"])
        except (CaseFatal, OSError, ValueError, KeyError, TypeError):
            return float("inf")

    def open_files(self):
        """The regular files the sandbox's processes hold open now ("device:inode"), read by the broker."""
        return _held(self.broker.ask(op="files", id=self.id)[0]["files"])

    def opened_inputs(self):
        """[[an input file's id, the ids the sandbox held as it opened it], ...], one per open, looked at by the
        judge while the open waited (opens.py); None where the judge has no such watch."""
        reply = self.broker.ask(op="opens", id=self.id)[0]
        looks = reply.get("opens")
        if looks is None:
            return None
        if type(looks) is not list or not all(type(x) is list and len(x) == 2 and type(x[0]) is str
                                              and type(x[1]) is list for x in looks) or reply.get("unlooked"):
            raise CaseFatal("the opens of its input files were not all looked at")
        return [(f, _held(held)) for f, held in looks]

    def memory_peak_mb(self):
        try:
            return self.broker.ask(op="memory", id=self.id)[0]["memory_mb"]
        except (CaseFatal, OSError, ValueError, KeyError):
            return None

    def check_cpu(self):
        if self.cpu_budget is not None and self.cpu_seconds() > self.cpu_budget:
            self.failure = self.failure or self.over_budget
            raise CaseFatal(self.failure)

    def limit_cpu(self, cpu_seconds, reason=OVER_LIMIT):
        """Stop the sandbox once it has used `cpu_seconds` more CPU (within cpu_s); `reason` is the failure."""
        self.cpu_budget, self.over_budget = self.cpu_seconds() + cpu_seconds, reason

    def import_names(self, cpu_seconds):
        """Run the answer's module; its top-level code gets `cpu_seconds` of CPU of its own, since a module that
        does not finish importing in that time is not going to on the next criterion either (driver.py)."""
        self.limit_cpu(cpu_seconds, f"timed out: its module's top-level code used over {cpu_seconds:g}s of CPU")
        names = self.request("import", share=self.share)
        self.cpu_budget, self.over_budget, self.imported = None, OVER_LIMIT, True
        return names

    def close(self):
        if self.closed.is_set():
            return
        self.closed.set()
        for other in self.companions:
            other.close()
        for f in (self.endpoint.rfile, self.endpoint.wfile):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.broker.ask(op="close", id=self.id)
        except (CaseFatal, OSError, ValueError):
            pass
