"""A look at what the answer holds, taken by the judge at each open of an input file, while that open waits.

A look the answer can schedule is a look it can dodge: file-handle-leak-fix's closing criterion used to read the
answer's descriptors when it asked for its next path, and an answer that took every path first was never looked at
mid-loop. CPython closes a file the moment nothing refers to it, so a leak shows only at the right moment: the file
a loop opened without closing is released when its variable is rebound, just after the next file is open. The
moment that counts is the next open itself, and the kernel can hold it: a fanotify permission mark on each input
file (an inode mark: it holds whatever name, link or mount the answer opens it by, from any of its processes) makes
every open of it wait until the judge has answered. Before answering, the judge reads the regular files the
sandbox's processes hold (its host's /proc, as open_files() does) and records them with the file being opened.

fanotify needs root (CAP_SYS_ADMIN). Without it there is no watch and the test gets None (driver.py's
opened_inputs), and it keeps only the looks it takes itself. Where the host allows it and a watch is still refused,
the criterion cannot start, and fails.
"""

import ctypes
import os
import select
import struct
import threading

FAN_CLOEXEC, FAN_CLASS_CONTENT = 0x1, 0x4
FAN_OPEN_PERM, FAN_MARK_ADD, FAN_ALLOW = 0x10000, 0x1, 0x1
AT_FDCWD = -100
EVENT = struct.Struct("IBBHQii")     # struct fanotify_event_metadata: len, version, -, metadata len, mask, fd, pid
RESPONSE = struct.Struct("iI")      # struct fanotify_response: fd, response
MAX_LOOKS = 1000                    # opens looked at; past it the rest are let through unlooked, and counted

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]


_AVAILABLE = {}          # device -> whether a permission mark is allowed on a folder there (asked once per device)


def available(folder="/") -> bool:
    """Whether this host lets the judge hold opens of files in `folder`'s filesystem (root, a kernel with fanotify
    permission events, a filesystem that takes the mark). Asked once per filesystem: a refusal after that (the
    user's fanotify groups spent, say) is a failure of the judge's set-up, not a host without fanotify, and must
    not quietly weaken the check."""
    dev = os.stat(folder).st_dev
    if dev not in _AVAILABLE:
        fd = _libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDONLY | os.O_LARGEFILE)
        ok = fd >= 0 and _libc.fanotify_mark(fd, FAN_MARK_ADD, FAN_OPEN_PERM, AT_FDCWD, os.fsencode(folder)) == 0
        if fd >= 0:
            os.close(fd)
        _AVAILABLE[dev] = ok
    return _AVAILABLE[dev]


class OpenWatch:
    """Holds each open of `paths` until `look()` (the ids the sandbox holds) has run; `looks` is [[the opened file's
    id, look()], ...] in order, and `unlooked` counts the opens past MAX_LOOKS. Raises OSError where fanotify is
    refused (not root, or a kernel without permission events)."""

    def __init__(self, paths, look):
        self.look, self.looks, self.unlooked = look, [], 0
        self.fd = _libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDONLY | os.O_LARGEFILE)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")
        try:
            for path in paths:
                if _libc.fanotify_mark(self.fd, FAN_MARK_ADD, FAN_OPEN_PERM, AT_FDCWD, os.fsencode(path)) < 0:
                    raise OSError(ctypes.get_errno(), f"fanotify_mark {path}")
        except BaseException:
            os.close(self.fd)
            raise
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            ready, _, _ = select.select([self.fd, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            data = os.read(self.fd, 4096)
            for at in range(0, len(data), EVENT.size):
                _, _, _, _, _, fd, _ = EVENT.unpack_from(data, at)
                if fd >= 0:
                    self._answer(fd)

    def _answer(self, fd):
        """Look, then let the open through, whatever the look did (an open never stays held)."""
        try:
            if len(self.looks) < MAX_LOOKS:
                st = os.fstat(fd)
                self.looks.append([f"{st.st_dev}:{st.st_ino}", self.look()])
            else:
                self.unlooked += 1
        except Exception:       # noqa: BLE001 - whatever went wrong, the open is let through, and counted unlooked
            self.unlooked += 1
        finally:
            os.write(self.fd, RESPONSE.pack(fd, FAN_ALLOW))
            os.close(fd)

    def close(self):
        """Stop looking; an open still waiting is let through (closing the group allows it)."""
        os.write(self._stop_w, b"x")
        self._thread.join()
        for fd in (self.fd, self._stop_r, self._stop_w):
            os.close(fd)
