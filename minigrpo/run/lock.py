"""One writer per folder: a run folder (train.py, the experiment pipelines) or eval.py's output folder.

The writer holds an flock on <folder>/.minigrpo-lock, a file holding its pid, for as long as it writes. A second
process that finds the lock held stops with one line naming the holder's pid, before it writes anything. The kernel
drops an flock when its process dies, however it dies; a lock file whose pid no longer holds the flock (a writer
killed by SIGKILL or a power cut leaves its pid behind) is taken over, with one line saying so.

The writer removes the file when it is done (release(), or at exit), while it still holds the flock. A process that
opened the file just before and then gets the flock holds a file no longer in the folder: it sees that (the path
names another file, or none) and tries again, so two writers never both believe they hold the folder.

Within one process the lock is re-entrant: a pipeline that holds its run folder may hold it again (the count goes
up), and each hold is released once.
"""
import atexit
import contextlib
import fcntl
import os
import sys

from minigrpo.errors import Refusal

LOCK = ".minigrpo-lock"
_held = {}          # real path of a folder -> [fd, holds]


class FolderBusy(Refusal):
    """Another live process holds the folder: the message is the one line a script prints."""


def hold(folder: str, instead: str = "pass another --run-name or --runs-dir"):
    """Take the folder's lock (the folder must exist), or raise FolderBusy, whose line ends with `instead`."""
    key = os.path.realpath(folder)
    path = os.path.join(key, LOCK)
    if key in _held and _same_file(_held[key][0], path):
        _held[key][1] += 1
        return
    if key in _held:         # a folder this process held, since removed and made again: held anew
        os.close(_held.pop(key)[0])
    for _ in range(8):      # each retry means another writer removed the file between our open and our flock
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _pid_in(fd)
            os.close(fd)
            raise FolderBusy(f"{folder} is being written by another process ({_who(holder)}): wait for it to end "
                             f"or stop it, or {instead}") from None
        if _same_file(fd, path):
            break
        os.close(fd)
    else:
        raise FolderBusy(f"{folder}: could not take its lock {path} (it kept being replaced)")
    stale = _pid_in(fd)
    if stale and stale != os.getpid():
        print(f"note: took over the lock of {folder} from pid {stale}, {_gone(stale)}", file=sys.stderr)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:          # a full disk: no lock file is left behind, held by nobody
        os.unlink(path)
        os.close(fd)
        raise
    _held[key] = [fd, 1]


def release(folder: str):
    """Undo one hold(); the last one removes the lock file and lets go of the flock."""
    key = os.path.realpath(folder)
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    with contextlib.suppress(OSError):   # the folder may be gone already (a failed run's, removed)
        os.unlink(os.path.join(key, LOCK))
    os.close(entry[0])


@atexit.register
def _release_all():
    """At exit, however the script ends short of being killed: no lock file is left to look stale."""
    for key in list(_held):
        _held[key][1] = 1
        release(key)


@contextlib.contextmanager
def holding(folder: str):
    hold(folder)
    try:
        yield
    finally:
        release(folder)


def _pid_in(fd) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _who(pid) -> str:
    return f"pid {pid}" if pid else "its pid not yet written"


def _gone(pid) -> str:
    return "which no longer holds it" if running(pid) else "which is no longer running"


def running(pid: int) -> bool:
    """Whether a process of that pid exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _same_file(fd, path) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
