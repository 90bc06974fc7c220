"""The sandbox's host side (private to the sandbox package; standard library only): what the judge does from
outside a sandbox to limit, measure and end it.

- The pids of a uid, SIGKILL (a process tree's CPU and files: procs.py).
- remove_tree: removes a folder tree without recursion or long paths (a work folder the payload filled).
- cgroups: where this process may make per-sandbox cgroups (v1 pids+memory+cpuacct, or v2 with pids and memory
  delegated), probed once; one sandbox's cgroup with its limits, CPU reading, kill-all and removal.
- The uid pool (root only): an exclusive uid per live sandbox, held by a flock so judges in other processes never
  share one.
"""

import contextlib
import fcntl
import functools
import os
import pwd
import signal
import subprocess
import tempfile
import time

from minigrpo.judge.sandbox.procs import all_pids

UID_BASE = int(os.environ.get("MINIGRPO_SANDBOX_UID_BASE", "60000"))
UID_SLOTS = 512


def add_weakness(weak, text):
    """Append a weakness to a sandbox's list once."""
    if text not in weak:
        weak.append(text)


# ------------------------------------------------------------------------------------------------------------------
# The pids of a uid, SIGKILL, and removing a folder tree

def pids_of_uid(uid):
    out = []
    for pid in all_pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                out.append(pid)
        except OSError:
            pass
    return out


def kill_pid(pid):
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.kill(pid, signal.SIGKILL)


def remove_tree(path):
    """Remove a folder tree without recursion and without long paths (each step is relative to an open folder
    fd, so 1200 nested folders or 100 KB of path are fine); makes unreadable folders readable when it must.
    Falls back to `rm -rf`. Never raises; returns a list of problems (empty when the tree is gone)."""
    if not os.path.lexists(path):
        return []
    problems = []
    try:
        _remove_tree_fd(path)
    except Exception as e:      # noqa: BLE001 - cleanup must go on
        problems.append(f"iterative removal of {path} failed: {type(e).__name__}: {e}")
    if os.path.lexists(path):
        try:
            subprocess.run(["rm", "-rf", "--one-file-system", "--", path], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            problems.append(f"rm -rf {path} failed: {type(e).__name__}")
    if os.path.lexists(path):
        problems.append(f"could not remove {path}")
    else:
        problems = []           # gone in the end: the first attempt's trouble does not matter
    return problems


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_dir(name, dir_fd):
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd, follow_symlinks=False) if dir_fd is not None else os.chmod(name, 0o700)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _remove_tree_fd(path):
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    fd = _open_dir(path, None)
    names = []                  # folder names from `path` down to the folder `fd` is open on
    try:
        while True:
            sub = None
            with os.scandir(fd) as it:
                entries = list(it)
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    sub = sub or entry.name
                else:
                    try:
                        os.unlink(entry.name, dir_fd=fd)
                    except PermissionError:
                        os.chmod(fd, 0o700)
                        os.unlink(entry.name, dir_fd=fd)
            if sub is not None:
                try:
                    os.chmod(fd, 0o700)     # we may need write access to remove what is below
                except OSError:
                    pass
                child = _open_dir(sub, fd)
                os.close(fd)
                fd = child
                names.append(sub)
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            name = names.pop()
            try:
                os.rmdir(name, dir_fd=fd)
            except PermissionError:
                os.chmod(fd, 0o700)
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


# ------------------------------------------------------------------------------------------------------------------
# cgroups

def _mountinfo():
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        left, _, right = line.partition(" - ")
        left, right = left.split(), right.split()
        if len(left) >= 5 and len(right) >= 3:
            out.append((left[3], left[4].replace("\\040", " "), right[0], right[2]))  # root, mount point, fs, opts
    return out


def _own_cgroups():
    """{controller or '' (v2): path relative to the hierarchy root} of this process."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in (ctrls.split(",") if ctrls else [""]):
                    out[c] = path
    except (OSError, ValueError):
        pass
    return out


class Cgroup:
    """One sandbox's cgroup(s). Raises OSError from __init__ when they cannot be made and limited."""

    V1 = ("pids", "memory", "cpuacct")

    def __init__(self, layout, name, memory_mb, nproc):
        self.kind, self.dirs = layout["kind"], []
        mem = int(memory_mb) << 20
        try:
            if self.kind == "v1":
                for c in self.V1:
                    d = os.path.join(layout["dirs"][c], name)
                    os.mkdir(d, 0o700)
                    self.dirs.append(d)
                self.pids_dir, self.mem_dir, self.cpu_dir = self.dirs
                self._write(self.pids_dir, "pids.max", str(int(nproc)))
                self._write(self.mem_dir, "memory.limit_in_bytes", str(mem))
                if os.path.exists(os.path.join(self.mem_dir, "memory.memsw.limit_in_bytes")):
                    self._write(self.mem_dir, "memory.memsw.limit_in_bytes", str(mem))
                with contextlib.suppress(OSError):
                    self._write(self.mem_dir, "memory.swappiness", "0")
            else:
                d = os.path.join(layout["dirs"][""], name)
                os.mkdir(d, 0o700)
                self.dirs.append(d)
                self.pids_dir = self.mem_dir = self.cpu_dir = d
                self._write(d, "pids.max", str(int(nproc)))
                self._write(d, "memory.max", str(mem))
                with contextlib.suppress(OSError):
                    self._write(d, "memory.swap.max", "0")
                with contextlib.suppress(OSError):
                    self._write(d, "memory.oom.group", "1")
        except OSError:
            self.remove()
            raise

    @staticmethod
    def _write(d, fname, value):
        with open(os.path.join(d, fname), "w") as f:
            f.write(value)

    def add(self, pid):
        for d in self.dirs:
            self._write(d, "cgroup.procs", str(pid))

    def procs(self):
        out = set()
        for d in self.dirs:
            with contextlib.suppress(OSError), open(os.path.join(d, "cgroup.procs")) as f:
                out.update(int(x) for x in f.read().split())
        return out

    def cpu_seconds(self):
        try:
            if self.kind == "v1":
                with open(os.path.join(self.cpu_dir, "cpuacct.usage")) as f:
                    return int(f.read()) / 1e9
            with open(os.path.join(self.cpu_dir, "cpu.stat")) as f:
                for line in f:
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def memory_peak_mb(self):
        """The most memory the whole tree has held at once (its tmpfs pages included), in MB, as the kernel counted
        it; None where the cgroup does not keep a peak (v2 before Linux 5.19)."""
        name = "memory.max_usage_in_bytes" if self.kind == "v1" else "memory.peak"
        try:
            with open(os.path.join(self.mem_dir, name)) as f:
                return int(f.read()) / (1 << 20)
        except (OSError, ValueError):
            return None

    def kill_all(self, patience=5.0):
        """SIGKILL everything in the cgroup until it is empty (pids.max bounds how fast a fork bomb refills)."""
        if self.kind == "v2":
            with contextlib.suppress(OSError):
                self._write(self.dirs[0], "cgroup.kill", "1")
        end = time.monotonic() + patience
        while True:
            pids = self.procs()
            if not pids:
                return True
            for pid in pids:
                kill_pid(pid)
            if time.monotonic() > end:
                return False
            time.sleep(0.01)

    def remove(self, patience=5.0):
        end, left = time.monotonic() + patience, list(self.dirs)
        while left:
            for d in list(left):
                try:
                    os.rmdir(d)
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError:
                    pass
            if not left or time.monotonic() > end:
                break
            time.sleep(0.02)
        return left


@functools.lru_cache(maxsize=None)
def cgroup_layout():
    """Where per-sandbox cgroups can be made: {'kind': 'v1'|'v2', 'dirs': {...}}, or a reason string."""
    mounts, own = _mountinfo(), _own_cgroups()
    v1 = {}
    for root, point, fs, opts in mounts:
        if fs == "cgroup":
            for c in Cgroup.V1:
                if c in opts.split(",") and c in own and c not in v1:
                    rel = own[c]
                    if root != "/" and rel.startswith(root):      # a cgroup namespace / container mount
                        rel = rel[len(root):]
                    v1[c] = os.path.join(point, rel.lstrip("/"))
    candidates = []
    if all(c in v1 for c in Cgroup.V1):
        candidates.append({"kind": "v1", "dirs": v1})
    for root, point, fs, opts in mounts:
        if fs == "cgroup2" and "" in own:
            rel = own[""]
            if root != "/" and rel.startswith(root):
                rel = rel[len(root):]
            base = os.path.join(point, rel.lstrip("/"))
            try:
                with open(os.path.join(base, "cgroup.controllers")) as f:
                    have = f.read().split()
            except OSError:
                continue
            if {"pids", "memory"} <= set(have):
                with contextlib.suppress(OSError), open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                    f.write("+pids +memory" + (" +cpu" if "cpu" in have else ""))
                candidates.append({"kind": "v2", "dirs": {"": base}})
            break
    reasons = []
    for layout in candidates:
        _sweep_stale(layout)
        name = f"minigrpo-probe-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            cg = Cgroup(layout, name, memory_mb=64, nproc=8)
        except OSError as e:
            reasons.append(f"{layout['kind']}: {e.strerror or e}")
            continue
        try:
            subtree = open(os.path.join(cg.pids_dir, "pids.max")).read().strip() == "8"
        except OSError:
            subtree = False
        cg.remove()
        if subtree:
            return layout
    return "; ".join(reasons) or "no pids+memory cgroup controllers mounted for this process"


def _sweep_stale(layout):
    """Remove empty sandbox cgroups left by judges that died (their pid is in the name)."""
    for d in layout["dirs"].values():
        with contextlib.suppress(OSError):
            for name in os.listdir(d):
                parts = name.split("-")
                if name.startswith("minigrpo-") and len(parts) >= 3 and parts[2].isdigit():
                    pid = int(parts[2])
                    if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                        with contextlib.suppress(OSError):
                            os.rmdir(os.path.join(d, name))


def new_cgroup(limits, weak):
    """A fresh cgroup for one sandbox, or None with the reason and its consequences added to `weak`."""
    cg = None
    layout = cgroup_layout()
    if isinstance(layout, dict):
        try:
            cg = Cgroup(layout, f"minigrpo-sb-{os.getpid()}-{os.urandom(6).hex()}", limits.memory_mb, limits.nproc)
        except OSError as e:
            weak.append(f"no cgroup for this sandbox ({e.strerror or e})")
    elif not any(w.startswith("no cgroup") for w in weak):
        weak.append(f"no cgroup ({layout})")
    if cg is None:
        add_weakness(weak, "memory is limited per process (RLIMIT_AS), not for the sandbox's processes together")
        add_weakness(weak, "CPU time is summed over the process tree from /proc; processes that leave it are not "
                           "counted")
    return cg


# ------------------------------------------------------------------------------------------------------------------
# uid pool (root only)

class UidSlot:
    """An exclusive uid from the pool, held by a flock on a lock file (works across threads and processes)."""

    def __init__(self):
        self.uid, self.fd = None, None
        lock_dir = "/run/minigrpo-sandbox" if os.access("/run", os.W_OK) else \
            os.path.join(tempfile.gettempdir(), f"minigrpo-sandbox-uids-{os.geteuid()}")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        for slot in range(UID_SLOTS):
            uid = UID_BASE + slot
            if _uid_taken(uid):
                continue
            fd = os.open(os.path.join(lock_dir, f"slot-{slot}"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid, self.fd = uid, fd
            return
        raise OSError("uid pool exhausted")

    def release(self):
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)       # drops the flock
            self.fd = None


@functools.lru_cache(maxsize=None)
def _uid_taken(uid):
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
