"""The sandbox's seccomp filter (minigrpo/judge/sandbox/launch.py): nothing finds a file's data without reading it.

A budget criterion (pathlib-duplicate-files c6) hands the answer a file of holes with one page of data somewhere:
reading it costs CPU, which is the point. lseek's SEEK_DATA / SEEK_HOLE would find that page for free, so the
filter refuses those two modes (EINVAL, as on a kernel without them) and lets every other lseek through; the FIEMAP
ioctl (a file system's extent map) is refused too."""

import errno
import platform

import pytest

from minigrpo.judge.sandbox.launch import SECCOMP_ARCH
from sandbox_probe import probe_json

pytestmark = pytest.mark.skipif(platform.machine() not in SECCOMP_ARCH,
                                reason=f"no seccomp filter for {platform.machine()} (the sandbox names the gap)")

SEEKS = """
import json, os
with open("sparse", "wb") as f:
    f.truncate(1 << 22)
    f.seek((1 << 22) - 4096)
    f.write(b"x" * 4096)
fd = os.open("sparse", os.O_RDONLY)
out = {}
for name, whence, pos in [("SET", os.SEEK_SET, 8), ("CUR", os.SEEK_CUR, 8), ("END", os.SEEK_END, -8),
                          ("DATA", os.SEEK_DATA, 0), ("HOLE", os.SEEK_HOLE, 0)]:
    try:
        out[name] = os.lseek(fd, pos, whence)
    except OSError as e:
        out[name] = -e.errno
import fcntl, struct
try:                                    # FS_IOC_FIEMAP: the extents, 8 of them at most
    fcntl.ioctl(fd, 0xC020660B, bytearray(struct.pack("=QQLLLL", 0, 1 << 40, 0, 0, 8, 0) + bytes(56 * 8)))
    out["FIEMAP"] = 0
except OSError as e:
    out["FIEMAP"] = -e.errno
print(json.dumps(out))
"""


def test_lseek_finds_no_data_or_hole_in_the_sandbox():
    seen = probe_json(SEEKS)
    assert seen["DATA"] == seen["HOLE"] == seen["FIEMAP"] == -errno.EINVAL, seen     # (tmpfs: FIEMAP EOPNOTSUPP)
    # the plain modes still work: SET to 8, CUR 8 further, END 8 before the end
    assert (seen["SET"], seen["CUR"], seen["END"]) == (8, 16, (1 << 22) - 8), seen


def test_the_filter_reads_whence_from_the_low_word_only():
    """The kernel takes whence as a 32-bit int: high bits set around SEEK_DATA must not get it past the filter."""
    code = SEEKS.replace("import json, os", "import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)")
    code = code.replace('print(json.dumps(out))', '''
ctypes.set_errno(0)
r = libc.syscall(ctypes.c_long(NR), ctypes.c_long(fd), ctypes.c_long(0), ctypes.c_long((1 << 32) | os.SEEK_DATA))
out["WIDE"] = r if r >= 0 else -ctypes.get_errno()
print(json.dumps(out))''', 1).replace("NR", str(SECCOMP_ARCH[platform.machine()][4]))
    assert probe_json(code)["WIDE"] == -errno.EINVAL
