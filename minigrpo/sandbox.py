"""A sandbox for untrusted code (the answers of the policy being trained): one process tree, contained.

Standard library only. `Sandbox(files, limits).start(argv)` runs argv in a private, empty work folder holding
`files`; `run(argv, files, limits, stdin_bytes)` is the one-shot form; `isolation()` names the strongest isolation
this machine gives and what it lacks ("weaknesses"), probed once per process.

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
import fcntl
import functools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["Limits", "Sandbox", "isolation", "run", "remove_tree", "WORKDIR"]

WORKDIR = "/sandbox"            # the work folder's path inside a bwrap sandbox
UID_BASE = int(os.environ.get("MINIGRPO_SANDBOX_UID_BASE", "60000"))
UID_SLOTS = 512
INSIDE_UID = 65534              # what a user-namespace sandbox (non-root) shows as its uid
MAX_OUTPUT = 1 << 20            # stdout bytes `run` keeps


@dataclass
class Limits:
    timeout: float = 10.0       # wall seconds, enforced by the caller's deadline + our kill
    cpu_s: float | None = None  # CPU seconds for the whole sandbox (default: timeout + 1)
    memory_mb: int = 2048       # for the whole sandbox (all its processes together)
    nproc: int = 64             # processes + threads of this sandbox alone
    fsize_mb: int = 16          # largest file
    tmp_mb: int = 64            # size cap of its private /tmp, /var/tmp, /dev/shm and (tmpfs) work folder

    @property
    def cpu_budget(self):
        return self.timeout + 1 if self.cpu_s is None else self.cpu_s


# ------------------------------------------------------------------------------------------------------------------
# Small helpers

def _clk_tck():
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


_TICK = _clk_tck()


def _proc_stat(pid):
    """(ppid, uid-less cpu ticks incl. reaped children) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:   # fields after the name: state ppid ... utime(14) stime cutime cstime -> indexes 11..14 here
        return int(rest[1]), sum(int(x) for x in rest[11:15])
    except (IndexError, ValueError):
        return None


def _all_pids():
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _tree_ticks(root):
    """CPU ticks of root and all its live descendants (each one's own + its reaped children's)."""
    stats = {}
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st is not None:
            stats[pid] = st
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def _pids_of_uid(uid):
    out = []
    for pid in _all_pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                out.append(pid)
        except OSError:
            pass
    return out


def _kill(pid):
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


class _Cgroup:
    """One sandbox's cgroup(s). Raises OSError from __init__ when they cannot be made and limited."""

    V1 = ("pids", "memory", "cpuacct")

    def __init__(self, layout, name, limits):
        self.kind, self.dirs = layout["kind"], []
        mem = int(limits.memory_mb) << 20
        try:
            if self.kind == "v1":
                for c in self.V1:
                    d = os.path.join(layout["dirs"][c], name)
                    os.mkdir(d, 0o700)
                    self.dirs.append(d)
                self.pids_dir, self.mem_dir, self.cpu_dir = self.dirs
                self._write(self.pids_dir, "pids.max", str(int(limits.nproc)))
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
                self._write(d, "pids.max", str(int(limits.nproc)))
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
                _kill(pid)
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
def _cgroup_layout():
    """Where per-sandbox cgroups can be made: {'kind': 'v1'|'v2', 'dirs': {...}}, or a reason string."""
    mounts, own = _mountinfo(), _own_cgroups()
    v1 = {}
    for root, point, fs, opts in mounts:
        if fs == "cgroup":
            for c in _Cgroup.V1:
                if c in opts.split(",") and c in own and c not in v1:
                    rel = own[c]
                    if root != "/" and rel.startswith(root):      # a cgroup namespace / container mount
                        rel = rel[len(root):]
                    v1[c] = os.path.join(point, rel.lstrip("/"))
    candidates = []
    if all(c in v1 for c in _Cgroup.V1):
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
            cg = _Cgroup(layout, name, Limits(memory_mb=64, nproc=8))
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


# ------------------------------------------------------------------------------------------------------------------
# uid pool (root only)

class _UidSlot:
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


# ------------------------------------------------------------------------------------------------------------------
# What the sandbox may see

def _project_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def _hidden_paths():
    out = {_project_root(), os.path.expanduser("~"), tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm", "/run",
           "/root", "/home"}
    with contextlib.suppress(OSError):
        out.add(os.getcwd())
    return sorted({os.path.realpath(p) for p in out} | out)


@functools.lru_cache(maxsize=None)
def python_paths():
    """The folders (real paths) the judge's Python needs: its prefixes, the interpreter's folder and every existing
    sys.path entry, minus any that is or contains a hidden path (project tree, cwd, home, temp), or lies in one
    without being part of a prefix (the script folder of `python train.py`, an editable install of the project).
    Returns (paths, left_out)."""
    prefixes = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if p and os.path.isdir(p):
            prefixes += [os.path.abspath(p), os.path.realpath(p)]
    exe = [os.path.dirname(os.path.abspath(sys.executable)), os.path.dirname(os.path.realpath(sys.executable))] \
        if sys.executable else []
    entries = [os.path.abspath(p) for p in sys.path if p] + [os.path.realpath(p) for p in sys.path if p]
    hidden = _hidden_paths()
    keep, left_out = [], []
    for p in dict.fromkeys(prefixes + exe + entries):
        if not os.path.exists(p):
            continue
        if any(_under(h, p) for h in hidden):
            left_out.append(p)          # it is, or contains, something hidden
        elif any(_under(p, h) for h in hidden) and not any(_under(p, q) for q in prefixes):
            left_out.append(p)
        else:
            keep.append(p)
    keep.sort(key=len)
    out = []
    for p in keep:
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out, left_out


_SYSTEM = ["/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"]
_ETC = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives", "nsswitch.conf",
        "mime.types", "host.conf", "gai.conf"]


def _mkdirs(args, made, path):
    """bwrap creates missing parents 0700 (0.8); create them 0755 ourselves so a pool uid can traverse them."""
    parts, cur = path.strip("/").split("/"), ""
    for part in parts[:-1]:
        cur += "/" + part
        if cur not in made:
            made.add(cur)
            args += ["--perms", "0755", "--dir", cur]


def _bwrap_args(limits, fds, uid, userns):
    """The bwrap options (no command) for one sandbox; `fds` collects fds to pass (file contents)."""
    tmp = str(int(limits.tmp_mb) << 20)
    args = ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if userns:
        args += ["--unshare-all", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID)]
    else:   # as root: every namespace but the user one; the launcher drops to the pool uid instead
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    made, system = {"/"}, []
    for p in _SYSTEM:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
            made.add(p)
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
            made.add(p)
            system.append(p)
    # private tmpfs first, so that a Python installation living under /tmp can still be bound on top of it
    args += ["--proc", "/proc", "--dev", "/dev"]
    made |= {"/proc", "/dev"}
    for d in ("/tmp", "/var/tmp", "/dev/shm", WORKDIR):
        _mkdirs(args, made, d)
        args += ["--perms", "0777" if d == WORKDIR else "1777", "--size", tmp, "--tmpfs", d]
        made.add(d)
    python, _ = python_paths()
    # hidden folders under a bound system folder (a checkout in /usr/src, a venv's project): an empty tmpfs on top
    for h in _hidden_paths():
        if os.path.isdir(h) and any(_under(h, s) and h != s for s in system):
            _mkdirs(args, made, h)
            args += ["--perms", "0000", "--size", "4096", "--tmpfs", h]
    for p in python:
        _mkdirs(args, made, p)
        args += ["--ro-bind", p, p]
    args += ["--perms", "0755", "--dir", "/etc"]
    made.add("/etc")
    for name in _ETC:
        if os.path.exists(os.path.join("/etc", name)):
            args += ["--ro-bind", os.path.join("/etc", name), os.path.join("/etc", name)]
    inside = uid if uid is not None else INSIDE_UID
    passwd = (f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{inside}:{inside}:sandbox:{WORKDIR}:"
              f"/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    group = f"root:x:0:\nsandbox:x:{inside}:\nnogroup:x:65534:\n"
    for name, text in (("passwd", passwd), ("group", group)):
        args += ["--perms", "0444", "--file", str(_memfd(fds, text.encode())), f"/etc/{name}"]
    args += ["--chdir", WORKDIR]
    return args


def _memfd(fds, data):
    try:
        fd = os.memfd_create("minigrpo-sandbox-file", 0)
    except (AttributeError, OSError):
        f = tempfile.TemporaryFile()
        fd = os.dup(f.fileno())
        f.close()
    _write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    fds.append(fd)
    return fd


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# Runs first inside the sandbox: lower the limits, drop to the sandbox uid, no-new-privs, exec the payload.
_LAUNCHER = r"""
import json, os, resource, sys
c = json.loads(sys.argv[1])
for name, v in c["rlimits"]:
    r = getattr(resource, name)
    hard = resource.getrlimit(r)[1]
    v = v if hard == resource.RLIM_INFINITY else min(v, hard)
    resource.setrlimit(r, (v, v))
if c["uid"] is not None:
    os.setgroups([])
    os.setresgid(c["uid"], c["uid"], c["uid"])
    os.setresuid(c["uid"], c["uid"], c["uid"])
    if os.getuid() != c["uid"] or os.geteuid() != c["uid"]:
        os._exit(126)
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)   # PR_SET_NO_NEW_PRIVS
except Exception:
    pass
import signal
for name in ("SIGPIPE", "SIGXFSZ"):     # Python ignores these; an exec'd payload should start with the defaults
    signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execv(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write("sandbox: cannot run %s: %s\n" % (sys.argv[2], e))
    os._exit(127)
"""

# The stub the Popen starts: wait until the parent has put this pid in the cgroup (it then writes one line on
# stdin; the shell's `read` takes bytes one at a time, so nothing meant for the payload is consumed), then exec.
_STUB = 'read x || exit 125; exec "$@"'


# ------------------------------------------------------------------------------------------------------------------
# Isolation levels

_MODES = ("bwrap-pool", "bwrap-userns", "unshare", "plain")


def _mode_ok(mode):
    """Whether a mode can start here at all (cheap checks before the real probe)."""
    root = os.geteuid() == 0
    if mode == "bwrap-pool":
        return root and bool(shutil.which("bwrap"))
    if mode == "bwrap-userns":
        return bool(shutil.which("bwrap"))
    if mode == "unshare":
        return bool(shutil.which("unshare"))
    return True


_PROBE = r"""
import os, sys
for p in sys.path:
    if os.path.isdir(p):
        os.listdir(p)
print("sandbox-ok")
"""


@functools.lru_cache(maxsize=None)
def _probe(mode):
    """(works, weaknesses) of a mode: a tiny Python run through it must start and list its sys.path folders."""
    if not _mode_ok(mode):
        return False, []
    try:
        with Sandbox({}, Limits(timeout=30, memory_mb=512, nproc=32), _mode=mode) as sb:
            sb.start([sys.executable, "-I", "-c", _PROBE])
            out, rc = sb.communicate(b"", timeout=30)
            _PROBE_NOTES[mode] = f"rc={rc} out={out[-200:]!r} errors={sb.errors}"
            return rc == 0 and b"sandbox-ok" in out, list(sb.weaknesses)
    except Exception as e:      # noqa: BLE001 - a probe never crashes the judge
        _PROBE_NOTES[mode] = f"{type(e).__name__}: {e}"
        return False, []


_PROBE_NOTES = {}               # why each probed mode did or did not work (for debugging)


@functools.lru_cache(maxsize=None)
def _pool_uid_can_run_python():
    """Without a mount namespace: can a pool uid start the judge's Python and read its sys.path folders?"""
    try:
        slot = _UidSlot()
    except OSError:
        return False
    try:
        conf = json.dumps({"rlimits": [], "uid": slot.uid})
        res = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, conf, sys.executable, "-I", "-c", _PROBE],
                             cwd="/", stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "HOME": "/"})
        return res.returncode == 0 and b"sandbox-ok" in res.stdout
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        slot.release()


_PROBE_LOCK = threading.Lock()


def _best_mode():
    with _PROBE_LOCK:           # the judge's pool threads may all ask at once; probe once
        return _best_mode_locked()


@functools.lru_cache(maxsize=None)
def _best_mode_locked():
    for mode in _MODES:
        ok, weak = _probe(mode)
        if ok:
            return mode, weak
    return "plain", ["no working isolation at all was found; the probe itself failed"]


def isolation():
    """(level name, weaknesses) of the strongest isolation this machine gives, probed once (cached)."""
    mode, weak = _best_mode()
    parts = {"bwrap-pool": ["bwrap", "pool-uid"], "bwrap-userns": ["bwrap", "userns"], "unshare": ["unshare"],
             "plain": ["process-group"]}[mode]
    layout = _cgroup_layout()
    if isinstance(layout, dict):
        parts.insert(1, f"cgroup-{layout['kind']}")
    if mode == "plain" and os.geteuid() == 0 and not any("pool uid" in w for w in weak):
        parts.append("pool-uid")
    return "+".join(parts), list(weak)


# ------------------------------------------------------------------------------------------------------------------
# The sandbox

class Sandbox:
    """One sandboxed process tree; see the module docstring. Use as a context manager, or call close()."""

    def __init__(self, files=None, limits=None, env=None, _mode=None):
        self.files = dict(files or {})
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
        self._t0 = None
        self._lock = threading.Lock()

    # --- start ---------------------------------------------------------------------------------------------------
    def start(self, argv):
        if self.proc is not None:
            raise RuntimeError("Sandbox.start called twice")
        try:
            return self._start(list(argv))
        except BaseException:
            self.close()
            raise

    def _start(self, argv):
        if self.mode is None:
            self.mode, weak = _best_mode()
            self.weaknesses += weak
        mode, lim, root = self.mode, self.limits, os.geteuid() == 0
        weak = self.weaknesses
        layout = _cgroup_layout()
        if isinstance(layout, dict):
            try:
                self._cg = _Cgroup(layout, f"minigrpo-sb-{os.getpid()}-{os.urandom(6).hex()}", lim)
            except OSError as e:
                weak.append(f"no cgroup for this sandbox ({e.strerror or e})")
        elif not any(w.startswith("no cgroup") for w in weak):
            weak.append(f"no cgroup ({layout})")
        if self._cg is None:
            _add(weak, "memory is limited per process (RLIMIT_AS), not for the sandbox's processes together")
            _add(weak, "CPU time is summed over the process tree from /proc; processes that leave it are not counted")
        uid = None
        if root and mode in ("unshare", "plain") and not _pool_uid_can_run_python():
            _add(weak, "runs as root with no separate uid: a pool uid cannot read the Python installation "
                       "(it lies under a folder only root can enter)")
        elif root and mode in ("bwrap-pool", "unshare", "plain"):
            try:
                self._slot = _UidSlot()
                uid = self._slot.uid
            except OSError as e:
                _add(weak, f"runs as root with no capabilities ({e})")
        if uid is None and self._cg is None:
            _add(weak, "the process budget (RLIMIT_NPROC) is shared with every process of the same uid")
        if not root:
            _add(weak, "runs as the judge's own uid")
        elif mode == "bwrap-userns":
            _add(weak, f"runs with root's kernel uid inside a user namespace (uid {INSIDE_UID} there, no "
                       "capabilities): a pool uid could not read the Python installation")

        rl = [("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", int(lim.fsize_mb) << 20),
              ("RLIMIT_CPU", int(lim.cpu_budget) + 1)]
        if self._cg is None:
            rl.append(("RLIMIT_AS", int(lim.memory_mb) << 20))
            if uid is not None:
                rl.append(("RLIMIT_NPROC", int(lim.nproc)))
            else:     # per uid: the judge's own processes count too, so leave room for them
                rl.append(("RLIMIT_NPROC", len(_pids_of_uid(os.geteuid())) * 4 + int(lim.nproc)))
        elif uid is not None and mode != "bwrap-pool":
            rl.append(("RLIMIT_NPROC", int(lim.nproc)))
        conf = json.dumps({"rlimits": rl, "uid": uid})

        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMEXPR_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        python = sys.executable
        launcher = [python, "-I", "-S", "-c", _LAUNCHER, conf]
        if mode.startswith("bwrap"):
            self.workdir = WORKDIR
            args = _bwrap_args(lim, self._fds, uid, userns=(mode == "bwrap-userns"))
            for name, text in self.files.items():
                dest = self._dest(name)
                parent = os.path.dirname(dest)
                if parent != WORKDIR:
                    args += ["--perms", "0777", "--dir", parent] if parent else []
                data = text.encode() if isinstance(text, str) else bytes(text)
                args += ["--perms", "0666", "--file", str(_memfd(self._fds, data)), dest]
            inner = ["bwrap"] + args + ["--"] + launcher + argv
            cwd = "/"
        else:
            base = _sandbox_base()
            self.folder = tempfile.mkdtemp(prefix="sb-", dir=base)
            self.workdir = self.folder
            for name, text in self.files.items():
                path = os.path.join(self.folder, self._dest(name)[len(WORKDIR) + 1:])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(text.encode() if isinstance(text, str) else bytes(text))
            if uid is not None:
                for top, dirs, names in os.walk(self.folder):
                    for n in [""] + dirs + names:
                        os.chown(os.path.join(top, n), uid, uid, follow_symlinks=False)
            os.chmod(self.folder, 0o700)
            _add(weak, "no mount namespace: the host filesystem is readable wherever file permissions allow, "
                       "and host /tmp, /var/tmp, /dev/shm are shared")
            if mode == "unshare":
                ns = ["unshare", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
                if not root:
                    ns = ["unshare", "--user", "--map-root-user"] + ns[1:]
                inner = ns + launcher + argv
            else:
                _add(weak, "no network namespace: the network is reachable")
                _add(weak, "no pid namespace: processes that leave the process group may outlive the sandbox "
                           "(killed by uid only with a pool uid)")
                inner = launcher + argv
            cwd = self.folder
        env.update({"HOME": self.workdir, "TMPDIR": self.workdir}, **self.extra_env)
        self.proc = subprocess.Popen(["/bin/sh", "-c", _STUB, "sandbox"] + inner, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd, env=env,
                                     pass_fds=self._fds, start_new_session=True)
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

    def _dest(self, name):
        rel = os.path.normpath(name)
        if rel.startswith(("/", "..")) or rel in (".", ""):
            raise ValueError(f"sandbox file name {name!r} must be relative and stay in the work folder")
        return f"{WORKDIR}/{rel}"

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
                self._cpu_last = max(self._cpu_last, _tree_ticks(self.proc.pid) / _TICK)
            return self._cpu_last

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
            _kill(self.proc.pid)
        if self._cg is not None:
            self.cpu_seconds()
            if not self._cg.kill_all():
                self.errors.append("cgroup still had processes after 5 s of SIGKILL")
        if self._slot is not None and self.mode not in ("bwrap-pool",):
            for _ in range(50):             # no pid namespace: the uid is ours alone, so all its processes go
                pids = _pids_of_uid(self._slot.uid)
                if not pids:
                    break
                for pid in pids:
                    _kill(pid)
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
        if self._slot is not None:
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


def _add(lst, item):
    if item not in lst:
        lst.append(item)


@functools.lru_cache(maxsize=None)
def _sandbox_base():
    """Root of host work folders (modes without a mount namespace): traversable, not listable or writable by
    others, so a sandbox can neither write next to its folder nor see its neighbours."""
    base = tempfile.mkdtemp(prefix="minigrpo-sandboxes-")
    os.chmod(base, 0o711)
    import atexit
    atexit.register(remove_tree, base)
    return base


def run(argv, files=None, limits=None, stdin_bytes=b"", max_output=MAX_OUTPUT):
    """One sandboxed run: (returncode | None on timeout or CPU budget, stdout bytes (first max_output),
    cpu_seconds measured from outside, weaknesses)."""
    limits = limits or Limits()
    with Sandbox(files, limits) as sb:
        sb.start(argv)
        out, rc = sb.communicate(stdin_bytes, timeout=limits.timeout, max_output=max_output)
        cpu = sb.cpu_seconds()
    return rc, out, cpu, list(sb.weaknesses)
