"""The judge's side of python checks: it starts the check driver confined, and brokers the answer's sandboxes.

Who runs what, as which uid (the best isolation: root with bubblewrap and cgroups; minigrpo/judge/sandbox/):

  judge process      the trainer's uid (often root). Holds the task file, the run folder, the verdict cache and
                     the checkout. Runs no test code and no answer code: it starts the driver, serves the broker
                     below, and reads the driver's one result line (checked: one (bool, str) per criterion).
  driver sandbox     a pool uid of its own, its own mount namespace (no project tree, no run folders, no home, no
                     host /tmp: the Python installation read-only, a private tmpfs), its own cgroup with a memory
                     cap, an environment of a few fixed variables. Runs minigrpo/judge/driver.py, which the judge hands
                     over as bytecode in a file of its work folder (the project tree stays out of its view), and
                     the hidden tests. Talks to the judge only through its stdin/stdout and the broker's socket.
  answer sandbox     one per criterion, another pool uid, the same kind of confinement with the criterion's own
                     limits. Runs the answer as module `solution` behind the plain-data channel (wire.py,
                     wire_rpc.py), whose two pipe ends the broker hands to the driver.

The broker (a thread of the judge process) makes and measures the answer's sandboxes for the driver, since only
the judge may create cgroups and switch uids: `start` (criterion i: the judge takes files and limits from its own
copy of the check; the driver can only lower the CPU time, and each criterion starts once, with at most one
companion: the check's `implementation`, which a suite answer is run against), `cpu` (the sandbox's CPU seconds
from its cgroup; for the driver's watch also whether its threads waited for a CPU, from the host's /proc), `memory` (its
cgroup's peak), `files` (the regular files its processes hold open, from the host's /proc), `close`. All are read
from outside the sandbox, where the answer cannot reach them. The broker enforces each sandbox's own limits itself
as well, so a driver that misbehaves cannot keep an answer running past them. So code that somehow ran in the
driver could decide this answer's grades (as the driver does anyway), but not another sample's grade, the
checkout, the judge's cache or the host: it has none of them in view and no uid that could write them.
"""

import binascii
import functools
import json
import marshal
import os
import re
import socket
import threading
import time

from minigrpo.judge import driver, driver_answer, inputs, opens, standins, wire, wire_rpc, wire_shared, wire_values
from minigrpo.judge.sandbox import Limits, Sandbox

# The answer's program: the channel's codec (wire_values.py, wire_shared.py, wire.py), then its request/reply and server
# (wire_rpc.py), compiled here once and handed over as marshalled bytecode (the child runs this same interpreter).
_CHILD_SOURCE = "\n".join(open(m.__file__).read() for m in (wire_values, wire_shared, wire, wire_rpc))
CHILD_PROGRAM = "import binascii as _b, marshal as _m\nexec(_m.loads(_b.a2b_base64(%r)))\n" % binascii.b2a_base64(
    marshal.dumps(compile(_CHILD_SOURCE, "<sandbox child>", "exec")), newline=False).decode()

# The driver's program: wire_values, wire_shared, wire, wire_rpc, standins, driver_answer and driver as modules of
# packages `minigrpo` and `minigrpo.judge` made in memory; the bytecode comes as a file in the driver's work folder
# (too long for a command line).
DRIVER_FILE = "driver.bin"
DRIVER_PROGRAM = r"""
import marshal, sys, types
for name in ("minigrpo", "minigrpo.judge"):
    package = types.ModuleType(name)
    package.__path__ = []
    sys.modules[name] = package
sys.modules["minigrpo"].judge = package
with open("driver.bin", "rb") as f:
    parts = marshal.load(f)
for name, code in parts:
    module = types.ModuleType(name)
    sys.modules[name] = module
    setattr(package, name.rpartition(".")[2], module)
    exec(code, module.__dict__)
del package, parts, module, name, code, f
sys.modules["minigrpo.judge.driver"].main()
"""
DRIVER_MEMORY_MB = 1536     # the driver's cgroup: test code, decoded replies (each at most wire.MAX_MESSAGE), pandas
MAX_LIVE = 2                # answer sandboxes alive at once for one driver (it runs its criteria one at a time)
STUCK_SLACK = 10.0          # seconds a driver may go past a sandbox's wall limit (or between two) before it is
                            # taken for stuck (decoding a forged reply, a query that never returns) and killed
WATCHDOG_EVERY = 0.1        # seconds between the broker's own checks of each answer sandbox's limits


@functools.lru_cache(maxsize=None)
def driver_bundle():
    parts = []
    for module in (wire_values, wire_shared, wire, wire_rpc, standins, driver_answer, driver):
        with open(module.__file__, encoding="utf-8") as f:
            parts.append((module.__name__, compile(f.read(), f"<{module.__name__}>", "exec")))
    return marshal.dumps(parts)


def criterion_limits(check, cpu_s=None):
    """The answer sandbox's limits for one check: its `timeout` in CPU seconds (lowered to cpu_s if given), and
    the driver's last-resort wall-clock ceiling for it plus a second, so the driver's own watch ends it first."""
    seconds = float(check.get("timeout", 10.0))
    if cpu_s is not None:
        seconds = max(0.05, min(seconds, float(cpu_s)))
    return Limits(timeout=driver_answer.wall_ceiling(seconds) + 1.0, cpu_s=seconds,
                  memory_mb=int(check.get("memory_mb", 2048)), nproc=int(check.get("nproc", 64)),
                  fsize_mb=int(check.get("fsize_mb", 16)))


def criterion_files(code, check):
    import importlib.util
    files = {f"{name}.py": source for name, source in check.get("stub_if_missing", {}).items()
             if importlib.util.find_spec(name) is None}
    files.update(check.get("files", {}))
    files["solution.py"] = code
    return files


class Broker:
    """Serves one driver's requests on its end of a SOCK_SEQPACKET socket pair, in a thread of the judge."""

    def __init__(self, sock, code, checks, on_stuck=None):
        self.sock, self.code, self.checks, self.on_stuck = sock, code, checks, on_stuck
        self.live, self.started, self.lock, self.done = {}, set(), threading.Lock(), threading.Event()
        self.watches = {}       # key -> the OpenWatch on its input files (opens.py), where the check asks for one
        self.deadline = time.monotonic() + 3 * STUCK_SLACK      # the driver's start-up, on a loaded machine
        self.threads = [threading.Thread(target=self._serve, daemon=True),
                        threading.Thread(target=self._watchdog, daemon=True)]

    def start(self):
        for t in self.threads:
            t.start()

    def _serve(self):
        while not self.done.is_set():
            try:
                data = self.sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            files = []
            try:
                reply, files = self._handle(json.loads(data))
            except Exception as e:      # noqa: BLE001 - the driver is not trusted: a bad request is answered
                reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            try:
                socket.send_fds(self.sock, [json.dumps(reply).encode()], [f.fileno() for f in files])
            except OSError:
                break
            finally:
                for f in files:         # the driver holds the channel now; the judge keeps no end of it
                    f.close()
        self.close()

    def _handle(self, request):
        op = request.get("op") if isinstance(request, dict) else None
        if op == "start":
            index, role = request["criterion"], request.get("role", "answer")
            if type(index) is not int or not 0 <= index < len(self.checks) or (index, role) in self.started:
                raise ValueError("no such criterion, or it was started already")
            check = self.checks[index]
            if role == "answer":
                files = criterion_files(self.code, check)
            elif role == "implementation" and type(check.get("implementation")) is str:
                files = {"solution.py": check["implementation"]}    # what a suite answer is run against
            else:
                raise ValueError("no such role for this criterion")
            with self.lock:
                if len(self.live) >= MAX_LIVE:
                    raise ValueError("too many sandboxes at once")
                self.started.add((index, role))
                self.deadline = float("inf")    # making a sandbox is the judge's time, not the driver's
            cpu_s = request.get("cpu_s")
            limits = criterion_limits(check, cpu_s if type(cpu_s) in (int, float) else None)
            made = None
            if role == "answer" and type(check.get("inputs")) is str:      # before the answer's process exists
                made = inputs.make_inputs(check["inputs"], criterion_limits(check))
            sandbox = Sandbox(files, limits, inputs=made and made[0])
            watch = None
            try:
                watch = _watch(check, made, sandbox)
                proc = sandbox.start(python_source=CHILD_PROGRAM)
            except BaseException:
                _end(sandbox, watch)
                raise
            key = f"s{index}-{role}"
            with self.lock:
                self.live[key] = sandbox
                self.watches[key] = watch
                self.deadline = time.monotonic() + sandbox.limits.timeout + STUCK_SLACK
            reply = {"id": key}
            if made is not None:
                reply["inputs"] = {"path": sandbox.inputs_path, "result": made[1], "files": made[2]}
            return reply, [proc.stdout, proc.stdin]
        with self.lock:
            sandbox = self.live.get(request.get("id")) if op in ("cpu", "memory", "files", "opens", "close") else None
            watch = self.watches.get(request.get("id"))
        if sandbox is None:
            raise ValueError(f"unknown request {str(op)[:20]!r} or sandbox")
        if op == "cpu" and request.get("demand") is True:      # the driver's watch, every WATCH_EVERY
            waited, runnable = sandbox.demand()
            return {"cpu": sandbox.cpu_seconds(), "waited": waited, "runnable": runnable}, []
        if op == "cpu":             # the test's clock and budgets, at each request: the cgroup's reading alone
            return {"cpu": sandbox.cpu_seconds()}, []
        if op == "memory":
            return {"memory_mb": sandbox.memory_peak_mb()}, []
        if op == "files":
            return {"files": sandbox.open_files()}, []
        if op == "opens":
            return {"opens": None if watch is None else [list(look) for look in watch.looks],
                    "unlooked": 0 if watch is None else watch.unlooked}, []
        with self.lock:
            self.live.pop(request["id"], None)
            self.watches.pop(request["id"], None)
            self.deadline = time.monotonic() + STUCK_SLACK
        _end(sandbox, watch)
        return {"closed": True}, []

    def _watchdog(self):
        while not self.done.wait(WATCHDOG_EVERY):
            with self.lock:
                over = [(k, sb) for k, sb in self.live.items() if sb.exceeded()]
                stuck = time.monotonic() > self.deadline
            for _, sandbox in over:
                sandbox.close()
            if stuck and self.on_stuck is not None:
                self.on_stuck()         # the driver: what it printed so far stands, the rest fail
                self.close()

    def close(self):
        """Stop serving and kill every answer sandbox still alive. Idempotent."""
        self.done.set()
        with self.lock:
            live, self.live, watches, self.watches = list(self.live.items()), {}, self.watches, {}
        for key, sandbox in live:
            _end(sandbox, watches.get(key))


def _watch(check, made, sandbox):
    """A look at what the sandbox holds at each open of an input file (opens.py), where the check asks for it
    (`"look_on_open": true`) and the host allows it (root); else None. A watch refused where the host allows it
    raises: the criterion cannot start, rather than be graded without the look it asked for."""
    if made is None or check.get("look_on_open") is not True or not opens.available(made[0]):
        return None
    return opens.OpenWatch([os.path.join(made[0], rel) for rel in made[2]], sandbox.open_files)


def _end(sandbox, watch=None):
    """Stop its watch, close an answer's sandbox, then remove the input folder it read (minigrpo/judge/inputs.py)."""
    if watch is not None:
        watch.close()
    sandbox.close()
    if sandbox.host_inputs:
        inputs.remove_inputs(sandbox.host_inputs)


def run_driver(code, checks, limit):
    """[(passed, reason), ...] from the confined driver for one answer's python checks; raises ValueError when
    the driver gave no well-formed result (the caller fails every criterion: a failure of the judge never pays)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    job = json.dumps({"checks": checks, "broker_fd": child.fileno()}).encode()
    limits = Limits(timeout=limit, cpu_s=limit, memory_mb=DRIVER_MEMORY_MB, nproc=64, fsize_mb=16)
    broker = None
    try:
        with Sandbox({"solution.py": code, DRIVER_FILE: driver_bundle()}, limits, keep_fds=[child.fileno()]) as sb:
            broker = Broker(parent, code, checks, on_stuck=sb.kill)
            sb.start(python_source=DRIVER_PROGRAM)
            child.close()
            broker.start()
            out, _ = sb.communicate(job, timeout=limit)
    finally:
        if broker is not None:
            broker.close()
        child.close()
        parent.close()
    return parse_results(out, len(checks))


STOPPED = "the check driver stopped before this criterion (stuck, out of memory or killed)"
# The reasons a driver gives (driver.py, driver_answer.py), as patterns: the judge passes on only these, so that
# even a driver that was taken over cannot put a hidden test's text into a verdict (and so into a critique). The
# details some failures carry (what was not plain data) are dropped.
_WHERE = r"(?: \(?at (?:line \d{1,6}|its set-up)\)?)?"
_NUMBER = r"[0-9.e+-]{1,12}"
_REASONS = [re.compile(p + _WHERE) for p in (
    r"tests passed", r"assertion failed", r"[A-Z][A-Za-z]{0,40}",
    r"an exception of the answer's own class \([A-Z][A-Za-z]{0,40} subclass\)",
    rf"timed out: used its {_NUMBER}s of CPU", rf"timed out at the last-resort wall-clock ceiling \({_NUMBER}s\)",
    rf"stalled: it ran or waited for a CPU for under {_NUMBER}% of {_NUMBER}s \(it sleeps or blocks\)",
    r"the answer's process exited or was killed \(an exit is never a pass\)", r"over the criterion's CPU-time limit",
    r"the answer's module did not list its names", r"not run: the answer spent its time budget on earlier criteria",
    rf"timed out: its module's top-level code used over {_NUMBER}s of CPU",
    r"not run: the answer's module did not finish importing on an earlier criterion",
    re.escape(STOPPED), re.escape(driver_answer.TOO_LARGE), re.escape(driver_answer.TOO_MANY_FDS),
    re.escape(f"{driver_answer.NOT_PLAIN} ({wire.SAME_HASH})"))]
_PREFIXES = (driver_answer.NOT_PLAIN, "the judge's broker is gone", "the sandbox could not be started")


def vetted_reason(passed, reason):
    if any(p.fullmatch(reason) for p in _REASONS):
        return reason
    for prefix in _PREFIXES:
        if reason.startswith(prefix):
            return prefix
    return "tests passed" if passed else "failed (the driver gave a reason it may not give)"


def parse_results(out, n):
    """The driver prints {"result": [passed, reason]} once per criterion as it goes, so that a driver killed on
    the way keeps the criteria it finished; the rest fail. Lines that are not results (a test's own prints) are
    skipped; more than n results, or a result that is not (bool, str), is a failed driver (ValueError)."""
    results = []
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        r = entry.get("result") if type(entry) is dict else None
        if r is None:
            continue
        if type(r) is not list or len(r) != 2 or type(r[0]) is not bool or type(r[1]) is not str:
            raise ValueError("a result of the driver is not (bool, str)")
        results.append((r[0], vetted_reason(r[0], r[1][:500])))
    if len(results) > n:
        raise ValueError("more results than criteria")
    if not results:
        raise ValueError("the driver printed no result")
    return results + [(False, STOPPED)] * (n - len(results))
