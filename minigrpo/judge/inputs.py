"""A criterion's input files, made by trusted code before the answer runs, and read-only to it.

A criterion whose verdict depends on what an input is (a 24 MB log read in bounded memory, two 28 MB twins hashed in
chunks, a 32 GB sparse file never read) must not let the answer decide what the input is. Made by a harness snippet
in the answer's own process, it was the answer's to bend: a module-level `open`, a patched `builtins.open`, a
`__build_class__` hook all run inside the snippet, and a value the snippet was handed (the expected count) sits in
a frame the answer can read. So the check's `inputs` source runs here instead, when the broker starts the
criterion's sandbox and before the answer's process exists:

  1. a sandbox of its own (the criterion's limits, no answer code in it) runs the source with a fresh host folder
     as its work folder; the source writes its files there (relative paths only, relative symlinks) and may set
     `result` to plain JSON data (what it drew at random: a count, a size) -- which only the driver gets;
  2. the judge then gives the folder and everything in it to root, files 0444 and folders 0555, and notes each
     regular file's id ("device:inode", as open_files() names what a process holds);
  3. the answer's sandbox sees the folder read-only at INPUTS_AT (a bind mount: it can neither write, rename nor
     replace it), and the test gets the path, the result and the ids (driver.py: INPUTS, prepared, INPUT_FILES).

The files exist before the answer's module runs, so its top-level code may read them; what it does there is its own
time and memory: the memory criteria cap the baseline they credit, and a CPU criterion that could be met by work done
at import counts the sandbox's CPU from its start.
"""

import json
import os
import stat

from minigrpo.judge.sandbox import INPUTS_AT, Limits, Sandbox, remove_tree
from minigrpo.judge.sandbox.mounts import new_host_folder, walk_tree

MAX_RESULT = 1 << 16                # bytes of the source's `result` as JSON

# The source runs as a program of its own: it reads the source on stdin and prints its `result` as one JSON line.
PROGRAM = """
import json, sys
scope = {"__name__": "__inputs__"}
exec(compile(sys.stdin.read(), "<inputs>", "exec"), scope)
sys.stdout.write(json.dumps(scope.get("result")) + "\\n")
"""


def make_inputs(source, limits):
    """(host folder, result, {relative path: "device:inode"}) for one check's `inputs` source; raises ValueError
    when the source fails (the criterion then cannot start: a failure of the judge's own set-up never pays)."""
    folder = new_host_folder()
    try:
        with Sandbox(limits=Limits(timeout=limits.timeout, cpu_s=limits.cpu_budget, memory_mb=limits.memory_mb,
                                   nproc=limits.nproc, fsize_mb=limits.fsize_mb), workdir=folder) as sb:
            sb.start(python_source=PROGRAM)
            out, rc = sb.communicate(source.encode())
        if rc != 0 or len(out) > MAX_RESULT:
            raise ValueError(f"the check's inputs source failed (exit {rc})")
        result = json.loads(out.decode() or "null")
        return folder, result, _freeze(folder)
    except BaseException:
        remove_tree(folder)
        raise


def _freeze(folder):
    """Give the folder to root, read-only for everyone; the ids of its regular files."""
    ids, root = {}, os.geteuid() == 0      # not root: the answer's uid is the judge's, and owns them (a weakness)
    for path, st in walk_tree(folder):
        if root:
            os.chown(path, 0, 0, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            os.chmod(path, 0o555)
        elif stat.S_ISREG(st.st_mode):
            os.chmod(path, 0o444)
            ids[os.path.relpath(path, folder)] = f"{st.st_dev}:{st.st_ino}"
    if root:
        os.chown(folder, 0, 0)
    os.chmod(folder, 0o555)
    return ids


def remove_inputs(folder):
    """Remove a folder make_inputs made (its folders are 0555: give them back their write bit first)."""
    for path, st in walk_tree(folder):
        if stat.S_ISDIR(st.st_mode):
            os.chmod(path, 0o755)
    os.chmod(folder, 0o755)
    return remove_tree(folder)
