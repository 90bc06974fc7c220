"""A sandbox for untrusted code (the answers of the policy being trained): one process tree, contained.

Standard library only. `Sandbox(files, limits).start(argv)` runs argv in a private, empty work folder holding
`files`; `run(argv, files, limits, stdin_bytes)` is the one-shot form; `isolation()` names the strongest isolation
this machine gives and what it lacks ("weaknesses"), probed once per process. `Sandbox(workdir=folder,
slot=uid_slot)` instead works in a host folder the caller owns and keeps (bound read-write at /sandbox), as the
uid of a slot the caller holds: several sandboxes, one after the other, then share one folder and one uid (an
agent's episode, episode.py). The machinery lives beside it:
host.py (cgroups, the uid pool, remove_tree), procs.py (its processes read from the host's /proc: their CPU, their
demand for a CPU, the files they hold open), mounts.py (what the sandbox sees) and launch.py (the launcher, the
seccomp filter and the isolation modes).

What the best level ("bwrap+cgroup+pool-uid", root with bubblewrap and writable cgroups) gives:

- Mount namespace with an allowlist (bubblewrap): read-only /usr, /lib*, /bin, /sbin, a few /etc files (the dynamic
  linker's cache, time zone, alternatives, nsswitch; a synthetic passwd/group), and the Python installation that
  runs the judge at its real paths (sys.prefix, base_prefix, exec_prefix and every existing sys.path entry, minus
  anything that is or contains the project tree, the current folder, the home folder or the temp folder). Missing
  parents are created 0755 in the sandbox's own root, so a venv under a 0700 /root stays importable. Everything
  else is absent: no project tree, no run folders, no home, no /run (no host filesystem sockets), no host /tmp.
  A hidden folder that sits under a bound system folder (a checkout in /usr/src) is covered by an empty tmpfs.
- A private, size-capped tmpfs for the work folder (/sandbox: cwd, HOME and TMPDIR), /tmp, /var/tmp and /dev/shm;
  they vanish with the sandbox's mount namespace. bwrap's minimal /dev, a fresh /proc of its own pid namespace.
- Fresh pid, net (loopback only), ipc and uts namespaces; a new session; no capabilities; no-new-privs;
  `--die-with-parent`. Killing bwrap kills the namespace's pid 1 and so every process in it.
- A uid of its own: as root, each live sandbox holds one slot of a uid pool (60000 + slot, a flock'ed lock file
  per slot, so concurrent judges in other processes never share one) and runs as that uid with no groups.
- A cgroup of its own (v1 pids, memory, cpuacct under the judge's own cgroups, or v2 where the judge's cgroup
  delegates pids and memory): pids.max = nproc, memory (+swap) = memory_mb for the whole tree including its tmpfs
  pages, and the CPU time of the whole tree read from cpuacct, i.e. from outside. The process enters the cgroup
  before anything untrusted runs: a /bin/sh stub blocks on a pipe until the parent has written its pid into
  cgroup.procs, then execs bwrap (no preexec_fn, which is unsafe in a threaded judge).
- rlimits inside (set by a small launcher before it drops the uid and execs the payload): core 0, file size, a
  per-process CPU backstop; and, only where there is no cgroup, address space per process and a process count.

Degraded levels (each named in `weaknesses`, never silently): without bwrap or namespaces the tree runs in a
host folder (0700, under a 0711 base) with its own process group (and `unshare` pid+net namespaces where that
works); without cgroups memory is per process (RLIMIT_AS) and the process count is per uid (per sandbox only with
the root uid pool); as a non-root user the sandbox runs as the judge's own uid (inside a user namespace when
bwrap can make one). CPU time is then summed over the tree's /proc/PID/stat (utime+stime+cutime+cstime), read
from outside; a process that leaves the tree and is reaped elsewhere is not counted there.

Not prevented even at best: CPU use up to the caller's wall deadline (the caller kills; `run` does), kernel attack
surface reachable by an unprivileged process (no seccomp filter here; the payload may create user namespaces of
its own, which do not widen its view of the host filesystem), reading the bound Python installation and OS files.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time

from minigrpo.judge.sandbox.host import UidSlot, add_weakness, cgroup_layout, kill_pid, new_cgroup, pids_of_uid, \
    remove_tree
from minigrpo.judge.sandbox.procs import TICK, demand, open_files, tree_pids, tree_ticks
from minigrpo.judge.sandbox.launch import STUB, Limits, best_mode, launcher_argv, pool_uid_can_run_python
from minigrpo.judge.sandbox.mounts import INPUTS_AT, INSIDE_UID, WORKDIR, bwrap_command, hand_over, \
    host_folder_command, new_host_folder, python_paths

__all__ = ["Limits", "Sandbox", "isolation", "missing_isolation", "run", "remove_tree", "python_paths", "WORKDIR",
           "INPUTS_AT"]

MAX_OUTPUT = 1 << 20            # stdout bytes `run` keeps


def isolation():
    """(level name, weaknesses) of the strongest isolation this machine gives, probed once (cached)."""
    mode, weak = best_mode(Sandbox)
    parts = {"bwrap-pool": ["bwrap", "pool-uid"], "bwrap-userns": ["bwrap", "userns"], "unshare": ["unshare"],
             "plain": ["process-group"]}[mode]
    layout = cgroup_layout()
    if isinstance(layout, dict):
        parts.insert(1, f"cgroup-{layout['kind']}")
    if mode == "plain" and os.geteuid() == 0 and not any("pool uid" in w for w in weak):
        parts.append("pool-uid")
    return "+".join(parts), list(weak)


def missing_isolation() -> list[str]:
    """What this machine lacks of the full isolation (bubblewrap, a pool uid, a cgroup), each with how to get it;
    empty when it has all three. An agent's commands run only under the full one unless the user accepts less."""
    parts = isolation()[0].split("+")
    missing = []
    if "bwrap" not in parts:
        missing.append("bubblewrap (apt install bubblewrap, or dnf install bubblewrap)" if not shutil.which("bwrap")
                       else "bubblewrap that can start here (it is installed, but could not make its namespaces)")
    if "pool-uid" not in parts:
        missing.append("a uid of its own per sandbox (" + ("run as root: the uid pool needs it" if os.geteuid() else
                       "the pool uids cannot read this Python installation: put it where other users may read") + ")")
    if not any(p.startswith("cgroup-") for p in parts):
        missing.append("a cgroup of its own (root, with cgroup v1 pids+memory+cpuacct or v2 delegating pids and "
                       "memory)")
    return missing


# ------------------------------------------------------------------------------------------------------------------
# The sandbox

class Sandbox:
    """One sandboxed process tree; see the module docstring. Use as a context manager, or call close()."""

    def __init__(self, files=None, limits=None, env=None, _mode=None, keep_fds=(), workdir=None, slot=None,
                 inputs=None):
        self.files = dict(files or {})
        # a host folder of input files the caller made and owns (minigrpo/judge/inputs.py): bound read-only at
        # INPUTS_AT; without a mount namespace the payload reads it where it is. `inputs_path`: where it sees it
        self.host_inputs, self.inputs_path = inputs, None
        # a host folder to work in instead of a fresh one, left in place by close(); it is handed to the sandbox's
        # uid before the payload starts (mounts.hand_over). slot: a UidSlot the caller holds, so that consecutive
        # sandboxes over that folder run as one uid; close() does not release it.
        self.host_workdir = workdir
        self._held_slot = slot
        self.keep_fds = list(keep_fds)      # descriptors the payload inherits (a broker's socket), same numbers
        self.limits = limits or Limits()
        self.extra_env = dict(env or {})
        self.mode = _mode
        self.proc = None
        self.weaknesses = []
        self.errors = []        # cleanup problems (recorded, never raised)
        self.folder = None      # host work folder (modes without a mount namespace)
        self.workdir = None     # the work folder as the payload sees it
        self._cg = None
        self._slot = None
        self._fds = []
        self._closed = False
        self._cpu_last = 0.0
        self.output_bytes = 0   # stdout bytes the payload wrote, kept or not (communicate)
        self._t0 = None
        self._lock = threading.Lock()

    # --- start ---------------------------------------------------------------------------------------------------
    def start(self, argv=(), python_source=None):
        """Start `argv`, or with `python_source` the sandbox's Python running that program (`python -I -c`)."""
        if self.proc is not None:
            raise RuntimeError("Sandbox.start called twice")
        try:
            return self._start(list(argv), python_source)
        except BaseException:
            self.close()
            raise

    def _start(self, argv, python_source):
        if self.mode is None:
            self.mode, weak = best_mode(Sandbox)
            self.weaknesses += weak
        mode, lim, root = self.mode, self.limits, os.geteuid() == 0
        weak = self.weaknesses
        self._cg = new_cgroup(lim, weak)
        uid = None
        if root and mode in ("unshare", "plain") and not pool_uid_can_run_python():
            add_weakness(weak, "runs as root with no separate uid: a pool uid cannot read the Python installation "
                               "(it lies under a folder only root can enter)")
        elif root and mode in ("bwrap-pool", "unshare", "plain"):
            try:
                self._slot = self._held_slot or UidSlot()
                uid = self._slot.uid
            except OSError as e:
                add_weakness(weak, f"runs as root with no capabilities ({e})")
        if uid is None and self._cg is None:
            add_weakness(weak, "the process budget (RLIMIT_NPROC) is shared with every process of the same uid")
        if not root:
            add_weakness(weak, "runs as the judge's own uid")
        elif mode == "bwrap-userns":
            add_weakness(weak, f"runs with root's kernel uid inside a user namespace (uid {INSIDE_UID} there, no "
                               "capabilities): a pool uid could not read the Python installation")

        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMEXPR_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        payload = launcher_argv(lim, uid, mode, self._cg is not None, python_source) + argv
        if mode.startswith("bwrap"):
            self.workdir = WORKDIR
            if self.host_workdir:
                if uid is not None:
                    hand_over(self.host_workdir, uid)
                # bwrap enters it as a root with no capabilities, before the launcher drops to the uid: it needs
                # the search bit (no sandbox sees the host folder's path, and its parent is not listable)
                os.chmod(self.host_workdir, 0o711)
            inner = bwrap_command(lim, self.files, self._fds, uid, mode == "bwrap-userns", payload,
                                  workdir=self.host_workdir, inputs=self.host_inputs)
            self.inputs_path = INPUTS_AT if self.host_inputs else None
            cwd = "/"
        else:
            self.folder = None if self.host_workdir else new_host_folder()
            self.workdir = self.host_workdir or self.folder
            inner = host_folder_command(self.workdir, self.files, uid, mode, root, weak, payload)
            self.inputs_path = self.host_inputs
            cwd = self.workdir
        env.update({"HOME": self.workdir, "TMPDIR": self.workdir}, **self.extra_env)
        self.proc = subprocess.Popen(["/bin/sh", "-c", STUB, "sandbox"] + inner, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd, env=env,
                                     pass_fds=self._fds + self.keep_fds, start_new_session=True)
        self._t0 = time.monotonic()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        if self._cg is not None:
            try:
                self._cg.add(self.proc.pid)
            except OSError as e:
                weak.append(f"could not enter the sandbox's cgroup ({e.strerror or e})")
                self._drop_cgroup()
        try:
            self.proc.stdin.write(b"\n")   # the go signal: the stub reads one line, then execs the sandbox
            self.proc.stdin.flush()
        except OSError as e:
            self.errors.append(f"start: the stub died before the go signal ({e})")
        return self.proc

    def _drop_cgroup(self):
        if self._cg is not None:
            self._cg.kill_all()
            self._cg.remove()
            self._cg = None

    # --- state ---------------------------------------------------------------------------------------------------
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self):
        """CPU seconds used so far by everything in the sandbox, measured from outside (never its own clock)."""
        with self._lock:
            if self._cg is not None:
                v = self._cg.cpu_seconds()
                if v is not None:
                    self._cpu_last = max(self._cpu_last, v)
                    return self._cpu_last
            if self.proc is not None and self.proc.returncode is None:
                self._cpu_last = max(self._cpu_last, tree_ticks(self.proc.pid) / TICK)
            return self._cpu_last

    def pids(self):
        """Host pids of the sandbox's processes: its cgroup's, else its top process's tree."""
        if self._cg is not None:
            return sorted(self._cg.procs())
        return tree_pids(self.proc.pid) if self.alive() else []

    def demand(self):
        """(ns its threads have waited for a CPU, whether one is runnable now), from the host's /proc: a process
        that neither runs nor waits to run sleeps or blocks; one that waits is starved by a busy host."""
        return demand(self.pids())

    def open_files(self):
        """The regular files its processes hold descriptors on ("device:inode", sorted), from the host's /proc."""
        return open_files(self.pids())

    def memory_peak_mb(self):
        """Peak memory of the whole sandbox in MB, read from its cgroup (from outside); None without a cgroup."""
        with self._lock:
            return self._cg.memory_peak_mb() if self._cg is not None else None

    def wall_seconds(self):
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def exceeded(self):
        """'timeout' or 'cpu' when a budget is spent (the caller then closes the sandbox), else None."""
        if self.wall_seconds() > self.limits.timeout:
            return "timeout"
        if self.cpu_seconds() > self.limits.cpu_budget:
            return "cpu"
        return None

    def wait(self, timeout=None):
        """Wait for the sandbox's top process; returns its returncode or None if still running at `timeout`.
        Takes the CPU reading before the process is reaped (so /proc still has the whole tree's time)."""
        if self.proc is None:
            return None
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.002
        while self.proc.returncode is None:
            try:
                info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = True
            if info is not None:
                self.cpu_seconds()                  # the zombie's stat still holds its and its children's time
                self.proc.wait()
                break
            if end is not None and time.monotonic() >= end:
                return None
            time.sleep(delay if end is None else max(0.0, min(delay, end - time.monotonic())))
            delay = min(delay * 2, 0.05)
        return self.proc.returncode

    def communicate(self, stdin_bytes=b"", timeout=None, max_output=MAX_OUTPUT):
        """Feed stdin, read stdout (capped), wait until exit or timeout / CPU budget; returns (stdout, rc|None)."""
        if self.proc is None:
            raise RuntimeError("Sandbox.communicate before start")
        out = bytearray()

        def reader():
            with contextlib.suppress(OSError, ValueError):
                while True:
                    chunk = self.proc.stdout.read1(65536)
                    if not chunk:
                        break
                    self.output_bytes += len(chunk)
                    if len(out) < max_output:
                        out.extend(chunk[:max_output - len(out)])

        def writer():
            with contextlib.suppress(OSError, ValueError):
                if stdin_bytes:
                    self.proc.stdin.write(stdin_bytes)
                    self.proc.stdin.flush()
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()

        threads = [threading.Thread(target=reader, daemon=True), threading.Thread(target=writer, daemon=True)]
        for t in threads:
            t.start()
        timeout = self.limits.timeout if timeout is None else timeout
        end = self._t0 + timeout
        rc = None
        while True:
            rc = self.wait(timeout=min(0.05, max(0.0, end - time.monotonic())))
            if rc is not None:
                break
            if time.monotonic() >= end or self.cpu_seconds() > self.limits.cpu_budget:
                self.kill()
                break
        self.kill()             # leftovers (daemons the payload forked) die with it either way
        for t in threads:
            t.join(timeout=2)
        return bytes(out), rc

    # --- ending --------------------------------------------------------------------------------------------------
    def kill(self):
        """SIGKILL every process of the sandbox (its namespace's pid 1, its cgroup, its process group, its pool
        uid), then reap the top process. Never raises."""
        try:
            self._kill()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"kill: {type(e).__name__}: {e}")

    def _kill(self):
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.cpu_seconds()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            kill_pid(self.proc.pid)
        if self._cg is not None:
            self.cpu_seconds()
            if not self._cg.kill_all():
                self.errors.append("cgroup still had processes after 5 s of SIGKILL")
        if self._slot is not None and self.mode not in ("bwrap-pool",):
            for _ in range(50):             # no pid namespace: the uid is ours alone, so all its processes go
                pids = pids_of_uid(self._slot.uid)
                if not pids:
                    break
                for pid in pids:
                    kill_pid(pid)
                time.sleep(0.01)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.errors.append(f"sandbox process {self.proc.pid} not reaped after SIGKILL")

    def close(self):
        """Kill everything, reap, remove the work folder and the cgroup, free the uid. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        self.kill()
        for step in (self._close_pipes, self._remove_folder, self._remove_cgroup, self._release_slot):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - recorded, never raised
                self.errors.append(f"{step.__name__}: {type(e).__name__}: {e}")

    def _close_pipes(self):
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        if self.proc is not None:
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    f and f.close()

    def _remove_folder(self):
        if self.folder:
            self.errors += remove_tree(self.folder)

    def _remove_cgroup(self):
        if self._cg is not None:
            self.cpu_seconds()
            left = self._cg.remove()
            if left:
                self.errors.append(f"cgroup folders not removed: {left}")
            self._cg = None

    def _release_slot(self):
        if self._slot is not None and self._slot is not self._held_slot:
            self._slot.release()
        self._slot = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        with contextlib.suppress(Exception):
            if not self._closed and self.proc is not None:
                self.close()


def run(argv, files=None, limits=None, stdin_bytes=b"", max_output=MAX_OUTPUT):
    """One sandboxed run: (returncode | None on timeout or CPU budget, stdout bytes (first max_output),
    cpu_seconds measured from outside, weaknesses)."""
    limits = limits or Limits()
    with Sandbox(files, limits) as sb:
        sb.start(argv)
        out, rc = sb.communicate(stdin_bytes, timeout=limits.timeout, max_output=max_output)
        cpu = sb.cpu_seconds()
    return rc, out, cpu, list(sb.weaknesses)
