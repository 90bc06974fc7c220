"""The package's data folder, and files written so that a kill never leaves half of one, read so that a bad one is
one line naming it."""
import errno
import json
import os
import shutil

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")   # the package's own data files


def _umask() -> int:
    mask = os.umask(0)       # the only way to read it is to set it: put back at once
    os.umask(mask)
    return mask


def atomic_write(path: str, data, fsync: bool = True):
    """Write `data` (str, bytes, or a callable that writes a given temp path) to a temporary name next to `path`,
    then rename it into place: rename is atomic on POSIX, so a kill never leaves half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    if callable(data):
        data(tmp)
        os.chmod(tmp, 0o666 & ~_umask())     # safetensors' writer makes its file 0600: the mode open() would give
    else:
        mode, encoding = ("wb", None) if isinstance(data, bytes) else ("w", "utf-8")
        with open(tmp, mode, encoding=encoding) as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def disk_full(e: BaseException) -> bool:
    """Whether a write failed for want of room (ENOSPC, or a quota's EDQUOT), anywhere in e's chain of causes;
    safetensors' writer says so only in words ("os error 28")."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(f"(os error {n})" in str(e) for n in (errno.ENOSPC, errno.EDQUOT)):
            return True
        e = e.__cause__ or e.__context__
    return False


def full_disk_line(what: str, folder: str) -> str:
    """The runtime stop's words for a full disk: what could not be written, errno's words, the room left."""
    while not os.path.isdir(folder) and folder != os.path.dirname(folder):   # one made for it, since removed
        folder = os.path.dirname(folder)
    free = shutil.disk_usage(folder).free / 2 ** 20
    return (f"stopping: {what} could not be written ({os.strerror(errno.ENOSPC)}; {free:.1f} MiB free in {folder}): "
            "free some space")


def read_json(path: str, missing: str, error=ValueError, fix: str = ""):
    """The parsed JSON file at `path`. A missing file raises FileNotFoundError "<path>: <missing>"; invalid JSON
    raises `error` "<path>: not valid JSON (<where>)<fix>": one line that names the file and what to do."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: {missing}")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise error(f"{path}: not valid JSON ({e}){fix}") from None
