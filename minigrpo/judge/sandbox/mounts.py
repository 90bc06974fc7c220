"""What a sandbox sees (private to minigrpo/judge/sandbox/__init__.py; standard library only): the filesystem view of a
sandboxed process tree, and its work folder with the caller's files.

- With a mount namespace (bubblewrap): `bwrap_command` builds the allowlist the
  sandbox package's docstring describes: read-only system folders, a few /etc files and a synthetic passwd/group, the
  judge's Python installation (`python_paths`, minus the project tree, cwd, home and temp, and with every other copy
  of the package it can find covered: `hidden_copies`), private size-capped
  tmpfs for the work folder (WORKDIR), /tmp, /var/tmp and /dev/shm; the files reach it as memfds.
- Without one: `new_host_folder` and `host_folder_command` make a 0700 host folder under a 0711 base, write the
  files there and name what this level lacks.
- A caller's work folder that several sandboxes use in turn: `hand_over` gives it to the next one's uid, and
  `walk_tree` lists a folder a payload filled without following anything it planted, WALK_DEPTH folders deep.
"""

import contextlib
import functools
import os
import stat
import sys
import tempfile

from minigrpo.judge.sandbox.host import add_weakness, remove_tree

WORKDIR = "/sandbox"            # the work folder's path inside a bwrap sandbox
INPUTS_AT = f"{WORKDIR}/inputs"     # where a sandbox sees a caller's read-only input folder (bwrap)
INSIDE_UID = 65534              # what a user-namespace sandbox (non-root) shows as its uid


# ------------------------------------------------------------------------------------------------------------------
# The folders it may see

def _project_root():
    here = os.path.abspath(__file__)                       # minigrpo/judge/sandbox/mounts.py
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))


def _under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def _hidden_paths():
    out = {_project_root(), os.path.expanduser("~"), tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm", "/run",
           "/root", "/home"}
    with contextlib.suppress(OSError):
        out.add(os.getcwd())
    return sorted({os.path.realpath(p) for p in out} | out)


PACKAGE = "minigrpo"
# where a system Python keeps packages: a copy of the project installed there is on no sys.path of the judge's,
# but /usr is bound whole, so a sandbox would see it
_SYSTEM_SITES = ["/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/usr/lib/python3/dist-packages"]


def _is_copy(name):
    # the package, its metadata and the pointers to it: minigrpo/, minigrpo-0.1.dist-info, minigrpo.egg-info,
    # minigrpo.egg-link, minigrpo.pth, an .egg, __editable__.minigrpo-0.1.pth and its finder module
    name = name.lower()
    return name.startswith(PACKAGE) or (name.startswith("__editable__") and PACKAGE in name)


def package_copies(entries):
    """Every copy of this project's package directly in one of the folders `entries` (real paths, sorted): what a
    sandbox must not see, wherever it is bound from. The running copy's project tree is hidden whole besides."""
    found = set()
    for top in entries:
        with contextlib.suppress(OSError):
            with os.scandir(top) as it:
                # the real path: a mount on a symlink would land where it points
                found |= {os.path.realpath(e.path) for e in it if _is_copy(e.name)}
    return sorted(found)


def _holds_copy(path):
    return bool(package_copies([path]))


@functools.lru_cache(maxsize=None)
def hidden_copies():
    """package_copies of every sys.path entry, every site folder of the judge's Python and of the system's."""
    import glob
    import site
    sites = list(site.getsitepackages()) + [site.getusersitepackages()]
    system = [p for pattern in _SYSTEM_SITES for p in glob.glob(pattern)]
    return package_copies([p for p in dict.fromkeys(sys.path + sites + system) if p])


@functools.lru_cache(maxsize=None)
def python_paths():
    """The folders (real paths) the judge's Python needs: its prefixes, the interpreter's folder and every existing
    sys.path entry, minus any that is or contains a hidden path (project tree, cwd, home, temp), or lies in one
    without being part of a prefix (the script folder of `python train.py`, an editable install of the project),
    or holds a copy of the package without being part of a prefix (another checkout on PYTHONPATH: its tests and
    docs would come with it). A copy inside a prefix (an install in site-packages) is covered (hidden_copies).
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
        elif not any(_under(p, q) for q in prefixes) and (any(_under(p, h) for h in hidden) or _holds_copy(p)):
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


def _bwrap_args(limits, fds, uid, userns, workdir=None):
    """The bwrap options (no command) for one sandbox; `fds` collects fds to pass (file contents). workdir: a host
    folder bound read-write as the work folder (bwrap binds nosuid) in place of its private tmpfs."""
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
    for name in ("/proc/keys", "/proc/key-users"):     # the kernel's keyrings are not namespaced: keep them unseen
        if os.path.exists(name):
            args += ["--ro-bind", "/dev/null", name]
    for d in ("/tmp", "/var/tmp", "/dev/shm", WORKDIR):
        _mkdirs(args, made, d)
        if d == WORKDIR and workdir:
            args += ["--bind", workdir, d]
        else:
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
    # every other copy of the package where a bound folder shows it (site-packages, a system Python's): covered
    for c in hidden_copies():
        if any(_under(c, b) for b in system + python):
            args += ["--perms", "0000", "--size", "4096", "--tmpfs", c] if os.path.isdir(c) else \
                ["--ro-bind", "/dev/null", c]
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


# ------------------------------------------------------------------------------------------------------------------
# The work folder and the command that enters the sandbox

def _work_path(name):
    rel = os.path.normpath(name)
    if rel.startswith(("/", "..")) or rel in (".", ""):
        raise ValueError(f"sandbox file name {name!r} must be relative and stay in the work folder")
    return f"{WORKDIR}/{rel}"


def bwrap_command(limits, files, fds, uid, userns, payload, workdir=None, inputs=None):
    """bwrap + its options + `payload` (the launcher and argv); `files` go in the work folder as memfds, whose fds
    are appended to `fds` (the caller passes them to bwrap and closes them). `inputs`: a host folder bound
    read-only at INPUTS_AT (a mount point: the payload can neither write into it nor rename or replace it)."""
    args = _bwrap_args(limits, fds, uid, userns=userns, workdir=workdir)
    if inputs:
        args += ["--ro-bind", inputs, INPUTS_AT]
    for name, text in files.items():
        dest = _work_path(name)
        parent = os.path.dirname(dest)
        if parent != WORKDIR:
            args += ["--perms", "0777", "--dir", parent] if parent else []
        data = text.encode() if isinstance(text, str) else bytes(text)
        args += ["--perms", "0666", "--file", str(_memfd(fds, data)), dest]
    return ["bwrap"] + args + ["--"] + payload


def new_host_folder():
    """A fresh host work folder (modes without a mount namespace); the caller removes it."""
    return tempfile.mkdtemp(prefix="sb-", dir=_sandbox_base())


def host_folder_command(folder, files, uid, mode, root, weak, payload):
    """Write `files` into the host work folder, hand it to `uid`, and return the command that runs `payload` there
    (in `unshare` namespaces for mode "unshare"); adds what this level lacks to `weak`."""
    for name, text in files.items():
        path = os.path.join(folder, _work_path(name)[len(WORKDIR) + 1:])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else bytes(text))
    if uid is not None:
        hand_over(folder, uid)
    os.chmod(folder, 0o700)
    add_weakness(weak, "no mount namespace: the host filesystem is readable wherever file permissions allow, "
                       "and host /tmp, /var/tmp, /dev/shm are shared")
    if mode == "unshare":
        ns = ["unshare", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
        if not root:
            ns = ["unshare", "--user", "--map-root-user"] + ns[1:]
        return ns + payload
    add_weakness(weak, "no network namespace: the network is reachable")
    add_weakness(weak, "no pid namespace: processes that leave the process group may outlive the sandbox "
                       "(killed by uid only with a pool uid)")
    return payload


@functools.lru_cache(maxsize=None)
def _sandbox_base():
    """Root of host work folders (modes without a mount namespace): traversable, not listable or writable by
    others, so a sandbox can neither write next to its folder nor see its neighbours."""
    base = tempfile.mkdtemp(prefix="minigrpo-sandboxes-")
    os.chmod(base, 0o711)
    import atexit
    atexit.register(remove_tree, base)
    return base


# ------------------------------------------------------------------------------------------------------------------
# A folder a payload has written to, looked at from the host

WALK_DEPTH = 32     # folders below a work folder that the host walks; deeper ones are left out, and said so


def walk_tree(top, missing=None, max_depth=WALK_DEPTH):
    """(path, lstat result) of every entry below `top`, folders before their contents. Iterative, never follows a
    symlink, and never enters a folder `max_depth` levels down: each step resolves a path of at most that many
    folders, so the walk's cost is bounded by the entries times max_depth (a 2,000-deep chain costs what a
    32-deep one does). What it leaves out (a folder too deep, one it cannot list, an entry it cannot stat) goes
    into `missing` {path relative to top: why} when given; a folder whose contents it left out is named with a
    trailing "/". Safe only while no payload runs in the folder: the
    caller walks it between sandboxes."""
    todo = [(top, 1)]
    def note(path, why, folder=False):
        if missing is not None:
            missing[os.path.relpath(path, top) + "/" * folder] = why

    while todo:
        folder, depth = todo.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            note(folder, f"cannot list ({e.strerror})", folder=True)
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                note(entry.path, f"cannot stat ({e.strerror})")
                continue
            yield entry.path, st
            if stat.S_ISDIR(st.st_mode):
                if depth < max_depth:
                    todo.append((entry.path, depth + 1))
                else:
                    note(entry.path, f"more than {max_depth} folders deep: not walked", folder=True)


def hand_over(folder, uid):
    """Give `folder` and its folders and regular files to `uid` (the next sandbox's) where another uid owns them: the
    caller's files copied in, or what a sandbox of another uid left. Nothing else changes owner: no symlink, and no
    file with a second hard link, which may be a link to a file from outside the folder."""
    os.chown(folder, uid, uid, follow_symlinks=False)
    for path, st in walk_tree(folder):
        mine = st.st_uid == uid and st.st_gid == uid
        if not mine and (stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)):
            with contextlib.suppress(OSError):
                os.chown(path, uid, uid, follow_symlinks=False)
