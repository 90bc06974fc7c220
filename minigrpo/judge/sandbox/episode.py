"""An agent's episode behind the sandbox: a shell tool whose commands run confined, in one private work folder that
persists across the episode's commands, and a read-only snapshot of that folder for a verifier.

    with Episode({"data.csv": "a,b\\n1,2\\n"}, Limits(timeout=10, memory_mb=512)) as ep:
        r = ep.run("wc -l data.csv")          # CommandResult: output, exit_code, status, cut_bytes, ...
        ...
        with ep.snapshot() as snap:           # a copy of the final folder, on the host, read-only
            verdict = verify(snap.path)

What is confined, and how (the sandbox package's docstring has the full list of each isolation level):

- Each command is `bash -c COMMAND` (stderr merged into stdout) in a fresh Sandbox: the judge's answer sandbox,
  with the same isolation level, cgroup and rlimits. At the best level ("bwrap+cgroup+pool-uid", root with
  bubblewrap): a mount namespace that shows read-only system folders and the judge's Python and nothing of the
  host's files (no project tree, no home, no /root, no host /tmp, no other episode's folder), no network
  (loopback only), its own pid namespace, no capabilities, no-new-privs. The episode's folder is bound read-write
  at /sandbox (cwd and HOME); /tmp, /var/tmp and /dev/shm are private per command and gone when it ends.
- Per command: `limits.timeout` wall seconds (less when the episode's budget has less left), CPU seconds, memory and
  processes for the whole tree (cgroup), largest file (RLIMIT_FSIZE). When a command ends every process it started
  is killed (pid namespace, cgroup, process group, the episode's uid): nothing runs between two commands.
- Per episode: `budget_s` wall seconds over all its commands (then the episode is over: later commands are not
  run); one pool uid for all its commands, so its files stay its own; output kept up to `output_bytes` per command
  (the rest is counted in `cut_bytes`, never stored).
- The work folder: as root, a tmpfs of its own mounted on the host (`folder_mb` of data, `folder_files` inodes, nosuid,
  nodev), so the episode cannot fill the host's disk; where that mount is refused, a host folder whose size is
  checked after each command (the episode ends when it is over) and the weakness is named. The task files are
  copied in at the start, each with mode FILE_MODE; close() (also on an exception) unmounts and removes it.

What a verifier may trust: `snapshot()` copies the folder while no command runs, into a fresh host temp folder
owned by the judge's uid, never seen by any sandbox. It copies folders and regular files only: symlinks are not
followed (nor copied), fifos, sockets and device files are skipped, hard links become separate copies, and the copy
stops at `max_bytes` and `max_files`. Each thing not copied is listed in `Snapshot.skipped` with the reason. The
mode each copied thing had in the episode (its type and every permission bit, setuid, setgid and sticky included)
is kept in `Snapshot.modes`; the copy itself is read-only with no special bit (files 0444, folders 0555), since a
root-owned host copy must never carry the agent's setuid bit or a write bit for other users. So the copy holds
only bytes the agent wrote and the modes it gave them; how they are judged is up to the verifier (it runs outside
the episode's sandbox, and must treat every byte as hostile input). The copy is read-only by its mode bits; a
verifier running as root is not stopped by them, so it must not write there.

Weaker isolation levels (no bubblewrap, not root) keep the same interface and name what they lack in
`Episode.weaknesses`; the tests of tests/judge/sandbox/test_episode.py skip, with that list as the reason, what a
level cannot hold.
"""

import contextlib
import dataclasses
import os
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from minigrpo.judge.sandbox import Limits, Sandbox, isolation, remove_tree
from minigrpo.judge.sandbox.host import UidSlot, add_weakness
from minigrpo.judge.sandbox.mounts import _write_all, new_host_folder, walk_tree

# bash runs the command with stderr on stdout; `eval` keeps the command's own text (and its line numbers) intact
SHELL = ["/bin/bash", "-c", 'exec 2>&1; eval "$1"', "bash"]
# the mode of every file copied in at the start, whatever the host's umask: what a file "left as it is" has at the
# end (a verifier compares it; a command's new files get the same under the sandbox's umask 022)
FILE_MODE = 0o644


@dataclass
class CommandResult:
    command: str
    output: str                 # stdout + stderr, the first output_bytes (decoded, invalid UTF-8 replaced)
    exit_code: int | None       # None: killed (time or CPU) or not run
    status: str                 # "exited", "timeout", "cpu", "budget" (the episode's time ran out), "ended" (not run)
    cut_bytes: int = 0          # output bytes beyond output_bytes, dropped
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_peak_mb: float | None = None

    def observation(self):
        """The result as the agent is shown it: the output, then what was cut and how the command ended."""
        notes = [f"[{self.cut_bytes} more bytes of output cut]"] if self.cut_bytes else []
        notes.append({"exited": f"[exit code {self.exit_code}]",
                      "timeout": f"[killed: ran past its time limit ({self.seconds:.1f} s)]",
                      "cpu": f"[killed: used up its CPU time ({self.cpu_seconds:.1f} s)]",
                      "budget": "[killed: the episode's time budget is spent]",
                      "ended": "[not run: the episode is over]"}[self.status])
        return self.output + ("" if not self.output or self.output.endswith("\n") else "\n") + "\n".join(notes)


@dataclass
class Snapshot:
    """A read-only host copy of an episode's folder (see the module docstring); close() removes it."""
    path: str
    files: int = 0
    bytes: int = 0
    missing: dict = field(default_factory=dict)     # {relative path: why it was not copied}
    modes: dict = field(default_factory=dict)       # {relative path: st_mode in the episode} of what was copied
    cut: str = ""           # why the copy stopped early, at its caps ("" when it did not): the rest is not there

    @property
    def skipped(self):
        """What was not copied, one "relative/path: why" line each (the cut last)."""
        return [f"{rel}: {why}" for rel, why in self.missing.items()] + ([self.cut] if self.cut else [])

    def close(self):
        if self.path and os.path.lexists(self.path):
            remove_tree(self.path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Episode:
    """One agent's episode: a private work folder holding `files`, and run(command) for each shell command. One
    command at a time (from one thread): snapshot() relies on nothing of the episode running while it copies."""

    def __init__(self, files=None, limits=None, budget_s=120.0, output_bytes=16384, folder_mb=64, folder_files=4096,
                 _mode=None):
        self.limits = limits or Limits(timeout=10.0, memory_mb=512, nproc=64)
        self.budget_s, self.output_bytes = float(budget_s), int(output_bytes)
        self.folder_mb, self.folder_files = int(folder_mb), int(folder_files)
        self.mode = _mode
        # what this machine's isolation lacks (known before any command runs); cleanup problems
        self.weaknesses, self.errors = list(isolation()[1]) if _mode is None else [], []
        self.used_s = 0.0                         # charged to the budget: each command's wall time with its host work
        self.host_s = 0.0                         # of that, and of the snapshot and close, the host's work
        self.ended = None                         # why the episode is over, once it is
        self.results = []
        self._mounted, self._closed, self.slot, self.folder = False, False, None, None
        try:
            self.folder = new_host_folder()
            self._mount_folder()
            self._copy_in(files or {})
            if os.geteuid() == 0:
                with contextlib.suppress(OSError):
                    self.slot = UidSlot()         # one uid for every command of the episode
        except BaseException:
            self.close()
            raise

    # --- the folder ------------------------------------------------------------------------------------------
    def _mount_folder(self):
        if os.geteuid() == 0 and shutil.which("mount"):
            opts = f"size={self.folder_mb}m,nr_inodes={self.folder_files},mode=0700,nosuid,nodev"
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "minigrpo-episode", self.folder],
                                     stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
                if res.returncode == 0:
                    self._mounted = True
                    return
        add_weakness(self.weaknesses, "the work folder lies on the host's disk (no tmpfs mount of its own): its "
                                      "size is checked after each command, not during one")

    def _copy_in(self, files):
        for name, data in files.items():
            rel = os.path.normpath(name)
            if rel.startswith(("/", "..")) or rel in (".", ""):
                raise ValueError(f"episode file name {name!r} must be relative and stay in the work folder")
            path = os.path.join(self.folder, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else bytes(data))
            os.chmod(path, FILE_MODE)

    def usage(self, missing=None):
        """(bytes, entries) in the work folder now (regular files' sizes; nothing followed); what the walk could
        not reach (mounts.walk_tree) goes into `missing`."""
        size = count = 0
        for _, st in walk_tree(self.folder, missing):
            count += 1
            size += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
        return size, count

    # --- commands ----------------------------------------------------------------------------------------------
    @property
    def time_left(self):
        return max(0.0, self.budget_s - self.used_s)

    def run(self, command, output_bytes=None):
        """Run one shell command in the episode's folder; returns its CommandResult (also kept in .results). Its
        output is kept up to `output_bytes` (at most the episode's own budget per command)."""
        if self._closed:
            raise RuntimeError("Episode.run after close")
        if self.ended is None and self.time_left <= 0:
            self.ended = "time budget spent"
        if self.ended is not None:
            result = CommandResult(command, "", None, "ended")
        else:
            keep = self.output_bytes if output_bytes is None else max(0, min(int(output_bytes), self.output_bytes))
            result = self._run(command, keep)
        self.results.append(result)
        return result

    def _run(self, command, keep):
        left = self.time_left
        limits = dataclasses.replace(self.limits, timeout=min(self.limits.timeout, left))
        t0 = time.monotonic()
        with Sandbox({}, limits, _mode=self.mode, workdir=self.folder, slot=self.slot) as sb:
            sb.start(SHELL + [command])
            out, rc = sb.communicate(b"", timeout=limits.timeout, max_output=keep)
            cpu, mem, wall, total = sb.cpu_seconds(), sb.memory_peak_mb(), sb.wall_seconds(), sb.output_bytes
        self.mode = sb.mode
        for w in sb.weaknesses:
            add_weakness(self.weaknesses, w)
        self.errors += sb.errors
        # the host's part (handing the folder over, starting and ending the sandbox) is charged as the command's
        took = max(wall, time.monotonic() - t0)
        self.used_s += took
        self.host_s += took - wall
        if rc is not None:
            status = "exited"
        elif wall >= limits.timeout:
            status = "budget" if limits.timeout < self.limits.timeout else "timeout"
        else:
            status = "cpu"
        if status == "budget":
            self.ended = "time budget spent"
        if not self._mounted:
            unreached = {}
            size, count = self.usage(unreached)
            if size > self.folder_mb << 20 or count > self.folder_files or unreached:
                self.ended = (f"work folder over its budget ({size >> 20} MB, {count} entries"
                              + (f", {next(iter(unreached))} out of reach)" if unreached else ")"))
        return CommandResult(command, out.decode("utf-8", "replace"), rc, status, max(0, total - len(out)),
                             wall, cpu, mem)

    # --- the verifier's copy -------------------------------------------------------------------------------------
    def snapshot(self, max_bytes=64 << 20, max_files=4096):
        """A read-only copy of the folder as it is now, in a fresh host folder (see the module docstring)."""
        if self._closed:
            raise RuntimeError("Episode.snapshot after close")
        t0 = time.monotonic()
        snap = Snapshot(tempfile.mkdtemp(prefix="minigrpo-snapshot-"))
        try:
            folders = self._copy_tree(snap, max_bytes, max_files)
            for d in sorted(folders, key=len, reverse=True) + [snap.path]:
                os.chmod(d, 0o555)
        except BaseException:
            snap.close()
            raise
        finally:
            self.host_s += time.monotonic() - t0
        return snap

    def _copy_tree(self, snap, max_bytes, max_files):
        folders = []
        for path, st in walk_tree(self.folder, snap.missing):
            rel = os.path.relpath(path, self.folder)
            target = os.path.join(snap.path, rel)
            kind = _kind(st.st_mode)
            if kind not in ("folder", "file"):
                what = f"symlink to {_readlink(path)!r}, not followed" if kind == "symlink" else f"a {kind}"
                snap.missing[rel] = what
            elif not os.path.isdir(os.path.dirname(target)):
                snap.missing[rel] = "its folder was not copied"
            elif snap.files >= max_files:
                snap.cut = f"{rel}: over the snapshot's {max_files} entries"
                break
            elif kind == "folder":
                os.mkdir(target, 0o700)
                folders.append(target)
                snap.files += 1
                snap.modes[rel] = st.st_mode
            elif snap.bytes + st.st_size > max_bytes:   # the size a reader sees: a sparse file counts in full
                snap.cut = f"{rel}: {st.st_size} bytes, over the snapshot's {max_bytes} bytes in all"
                break
            else:
                why = _copy_file(path, st, target)
                if why:
                    snap.missing[rel] = why
                else:
                    snap.files += 1
                    snap.bytes += st.st_size
                    snap.modes[rel] = st.st_mode
        return folders

    # --- the end -----------------------------------------------------------------------------------------------
    def close(self):
        """Unmount and remove the work folder, free the uid. Idempotent; never raises (problems go to .errors)."""
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        self._free()
        self.host_s += time.monotonic() - t0

    def _free(self):
        if self._mounted:
            self._unmount()
        if self.folder:
            self.errors += remove_tree(self.folder)
        if self.slot is not None:
            self.slot.release()
            self.slot = None

    def _unmount(self):
        why = ""
        for argv in (["umount", self.folder], ["umount", "-l", self.folder]):     # -l: should anything hold it
            try:
                res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                why = f"{type(e).__name__}: {e}"
                continue
            if res.returncode == 0:
                return
            why = res.stderr.decode(errors="replace").strip()
        self.errors.append(f"could not unmount {self.folder}: {why}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    __del__ = close


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _copy_file(path, st, target):
    """Copy one regular file's bytes (at most st.st_size); returns why not, or None. O_NOFOLLOW and O_NONBLOCK
    (a fifo swapped in would not block) plus the inode check make sure the file opened is the one listed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot open ({e.strerror})"
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            return "changed while it was copied"
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                _write_all(out, chunk)
                left -= len(chunk)
        finally:
            os.close(out)
        os.chmod(target, 0o444)       # the agent's mode is kept in Snapshot.modes, not on the copy
        return None
    except OSError as e:
        return f"cannot copy ({e.strerror})"
    finally:
        os.close(fd)
