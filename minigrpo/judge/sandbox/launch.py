"""How a sandbox starts (private to the sandbox package; standard library only): the stub and the launcher every
sandboxed process runs first, and the isolation modes a sandbox can start in, each probed once on this machine.

Modes, strongest first: "bwrap-pool" (root: bubblewrap namespaces, a pool uid), "bwrap-userns" (bubblewrap in a
user namespace), "unshare" (pid+net namespaces, a host work folder), "plain" (a process group in a host folder).
"""

import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass

from minigrpo.judge.sandbox.host import UidSlot, pids_of_uid


# ------------------------------------------------------------------------------------------------------------------
# The limits, the launcher and the stub

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


def launcher_argv(limits, uid, mode, has_cgroup, python_source=None):
    """The launcher's command line (the payload's argv follows it): the rlimits to set, and the uid to drop to.
    With `python_source`, the launcher does not exec a payload: it is the payload's first lines, and the whole is
    one `python -I -c` (one interpreter start fewer per sandbox; only the Python installation's own start-up code
    runs before the limits and the uid drop, never anything of the answer's)."""
    rl = [("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", int(limits.fsize_mb) << 20),
          ("RLIMIT_CPU", int(limits.cpu_budget) + 1)]
    if not has_cgroup:
        rl.append(("RLIMIT_AS", int(limits.memory_mb) << 20))
        if uid is not None:
            rl.append(("RLIMIT_NPROC", int(limits.nproc)))
        else:     # per uid: the judge's own processes count too, so leave room for them
            rl.append(("RLIMIT_NPROC", len(pids_of_uid(os.geteuid())) * 4 + int(limits.nproc)))
    elif uid is not None and mode != "bwrap-pool":
        rl.append(("RLIMIT_NPROC", int(limits.nproc)))
    conf = json.dumps({"rlimits": rl, "uid": uid, "seccomp": SECCOMP_ARCH.get(platform.machine())})
    if python_source is not None:
        return [sys.executable, "-I", "-c", _DROP + python_source, conf]
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, conf]


# (name, AUDIT_ARCH_*, keyctl, the system calls refused, lseek, ioctl) of the architectures the launcher filters (both
# little-endian: the low word of an argument comes first); elsewhere there is no filter, and the sandbox names that
# gap (best_mode). Refused (EPERM): the key calls (add_key, request_key, keyctl), and the calls that read or clear
# the host's page cache state exactly (mincore, readahead, fadvise64, preadv2 / pwritev2 with RWF_NOWAIT, io_uring,
# cachestat): every sandbox reads the same files of the Python installation, so their cached pages are bits one
# sandbox could set and a later one read. docs/judge.md: what is left (timing). lseek with SEEK_DATA or SEEK_HOLE
# fails with EINVAL, as on a kernel without them, and so does the FIEMAP ioctl (a file system's extent map; tmpfs
# has none): a budget's file of holes must be read to be hashed, not skipped.
SECCOMP_ARCH = {
    "x86_64": ("x86_64", 0xC000003E, 250, (248, 249, 250, 27, 187, 221, 327, 328, 425, 426, 427, 451), 8, 16),
    "aarch64": ("aarch64", 0xC00000B7, 219, (217, 218, 219, 232, 213, 223, 286, 287, 425, 426, 427, 451), 62, 29),
}

# Runs first inside the sandbox: lower the limits, drop to the sandbox uid, no-new-privs; then (_LAUNCHER) exec
# the payload, or (_DROP + a program) go on as that program.
_DROP = r"""
import json as _json, os as _os, resource as _resource, sys as _sys
def _drop(c):
    os, resource, sys = _os, _resource, _sys
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
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)                                  # PR_SET_NO_NEW_PRIVS
        # Kernel keyrings are per uid, not per namespace: a key one sandbox leaves is seen by the next (state
        # across samples), and an inherited session keyring is the judge's. Leave it for a fresh one, then refuse
        # the key system calls, the page-cache probes and the calls that find a file's data without reading it
        # (SECCOMP_ARCH) with a seccomp filter; any other ABI too.
        arch = c.get("seccomp")
        if arch is not None:
            libc.syscall(arch[2], 1, None)                          # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)
            a, n, lseek, ioctl = arch[1], arch[3], arch[4], arch[5]
            # classic BPF over seccomp_data (offset 0: nr, 4: arch, 16 + 8 i: args[i], low word first); 0x20 load
            # word, 0x15 jump if ==, 0x35 jump if >=, 0x06 return. A jump names the return it goes to, or skips a
            # number of instructions (0: on to the next). docs/judge.md says why this is not libseccomp's binding.
            returns = {"allow": 0x7FFF0000, "deny": 0x00050001, "einval": 0x00050016}     # RET_ERRNO | EPERM, EINVAL
            prog = [(0x20, 0, 0, 4), (0x15, 0, "deny", a),              # an arch not ours
                    (0x20, 0, 0, 0), (0x35, "deny", 0, 0x40000000)]     # the x32 ABI
            prog += [(0x15, "deny", 0, nr) for nr in n]                 # a refused call
            prog += [(0x15, 0, 3, lseek), (0x20, 0, 0, 32),             # lseek: whence (the kernel reads 32 bits)
                     (0x15, "einval", 0, 3), (0x15, "einval", "allow", 4),            # SEEK_DATA, SEEK_HOLE
                     (0x15, 0, "allow", ioctl), (0x20, 0, 0, 24),       # ioctl: its command (32 bits)
                     (0x15, "einval", "allow", 0xC020660B)]             # FS_IOC_FIEMAP: a file's extents
            at = {name: len(prog) + i for i, name in enumerate(returns)}
            def jump(i, to):
                return to if isinstance(to, int) else at[to] - i - 1
            prog = [(code, jump(i, t), jump(i, f), k) for i, (code, t, f, k) in enumerate(prog)]
            prog += [(0x06, 0, 0, value) for value in returns.values()]
            class Filter(ctypes.Structure):
                _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                            ("k", ctypes.c_uint)]
            class Prog(ctypes.Structure):
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]
            table = (Filter * len(prog))(*[Filter(*f) for f in prog])
            if libc.prctl(22, 2, ctypes.byref(Prog(len(prog), table)), 0, 0) != 0:    # SECCOMP_MODE_FILTER
                os._exit(124)
    except Exception:
        os._exit(124)
_drop(_json.loads(_sys.argv[1]))
del _drop, _json, _os, _resource, _sys
"""

_LAUNCHER = _DROP + r"""
import os, signal, sys
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
STUB = 'read x || exit 125; exec "$@"'


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
def _probe(mode, sandbox):
    """(works, weaknesses) of a mode: a tiny Python run through it (`sandbox`: the package's Sandbox class, handed
    in since it starts in the mode this module picks) must start and list its sys.path folders."""
    if not _mode_ok(mode):
        return False, []
    try:
        with sandbox({}, Limits(timeout=30, memory_mb=512, nproc=32), _mode=mode) as sb:
            sb.start([sys.executable, "-I", "-c", _PROBE])
            out, rc = sb.communicate(b"", timeout=30)
            _PROBE_NOTES[mode] = f"rc={rc} out={out[-200:]!r} errors={sb.errors}"
            return rc == 0 and b"sandbox-ok" in out, list(sb.weaknesses)
    except Exception as e:      # noqa: BLE001 - a probe never crashes the judge
        _PROBE_NOTES[mode] = f"{type(e).__name__}: {e}"
        return False, []


_PROBE_NOTES = {}               # why each probed mode did or did not work (for debugging)


@functools.lru_cache(maxsize=None)
def pool_uid_can_run_python():
    """Without a mount namespace: can a pool uid start the judge's Python and read its sys.path folders?"""
    try:
        slot = UidSlot()
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


def best_mode(sandbox):
    """(mode, weaknesses): the strongest mode that works here, probed once with `sandbox`, the Sandbox class."""
    with _PROBE_LOCK:           # the judge's pool threads may all ask at once; probe once
        return _best_mode_locked(sandbox)


@functools.lru_cache(maxsize=None)
def _best_mode_locked(sandbox):
    for mode in _MODES:
        ok, weak = _probe(mode, sandbox)
        if ok:
            if platform.machine() not in SECCOMP_ARCH:
                weak = weak + [f"kernel keyrings are shared between sandboxes (no key filter for "
                               f"{platform.machine()})"]
            return mode, weak
    return "plain", ["no working isolation at all was found; the probe itself failed"]
