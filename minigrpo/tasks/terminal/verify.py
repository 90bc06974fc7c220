"""What the terminal verifiers stand on: bounded reads of an episode's snapshot, a probe that runs a command on a
copy of it in a fresh sandbox, and the readings of a final answer.

The agent wrote every byte a verifier looks at, so each one is hostile input:

- `Folder` lists the snapshot with a walk that follows nothing (the snapshot holds no symlinks, but a verifier
  does not rely on that), caps the number of entries, and reads a file only if the walk listed it as a regular
  file, with O_NOFOLLOW and O_NONBLOCK, at most `cap` bytes: a file over the cap reads as missing, not as its
  first megabyte, so a verifier never judges a file it has not seen whole. Nor a folder: a question about a path
  that something the snapshot left out (a symlink, a fifo, a folder too deep) could change, or about a snapshot
  cut at its caps, raises Incomplete, and the episode scores 0 with that reason.
- `probe` is the only way a verifier runs anything of the agent's (a fixed script, a package, a git repository,
  a database): in a fresh sandbox (an Episode of its own, with its own limits) on a copy of the files it names,
  never on the host. The verifier's own files (hidden inputs, its probe script) are copied in last, so they win
  over the agent's of the same name or in their way, and its folder is sized for the copy plus room of its own, so
  nothing the agent left can crowd out the verifier's files or stop the probe from starting. The probe's output
  is read back bounded; what it means is decided on the host against expectations that never enter the sandbox,
  so the agent's code, which runs beside the probe and can print anything, would have to compute the right
  values to forge them.
- The answer readings look at the first MAX_ANSWER characters and take one value each (the last number, the
  last digest, the candidates named): an answer that lists every candidate names more than one and fails.
"""

import errno
import mmap
import os
import re
import stat

from minigrpo.judge.sandbox import Limits
from minigrpo.judge.sandbox.episode import FILE_MODE, Episode

MAX_READ = 1 << 20          # bytes a verifier reads of one file
MAX_ENTRIES = 4096          # entries of a snapshot a verifier lists
MAX_ANSWER = 8192           # characters of the final answer a verifier reads
PROBE_LIMITS = Limits(timeout=10, memory_mb=512, nproc=64, fsize_mb=16)
PROBE_OUTPUT = 65536        # bytes of a probe's output kept
PROBE_BYTES = 8 << 20       # bytes of the agent's files a probe copies, in all
PROBE_FILES = 512
PROBE_PATH = 1024           # bytes of a relative path a probe copies: under the probe's own folder it must stay
#                             within the kernel's 4096, or the verifier's sandbox would fail to start
# the room a probe's folder has beyond its copy (inodes, MB), the same whatever the agent left: the verifier's own
# files and the probe's run never compete with the agent's for the folder's limits
PROBE_ROOM_FILES = 4096
PROBE_ROOM_MB = 64


class VerifierUnavailable(RuntimeError):
    """The verifier's own sandbox could not start (the machine, not the agent): the episode is not scored."""


class Incomplete(Exception):
    """A verifier asked about a part of the snapshot that is not whole (something there was not copied, or the
    copy was cut at its caps), or a probe could not copy it whole: the episode scores 0, since what is missing may
    be exactly what is checked."""


def _related(missing, rel):
    # what is missing at `missing` changes the answer about `rel` ("" for everything): the same path, or one
    # below the other either way round. A trailing "/" names a folder whose contents were left out.
    missing = missing.rstrip("/")
    return not rel or missing == rel or missing.startswith(rel + "/") or rel.startswith(missing + "/")


class Folder:
    """An episode's snapshot as a verifier reads it: `entries` maps each relative path to "dir" or "file" (a regular
    file), `modes` to its whole st_mode as the agent left it (type, setuid/setgid/sticky and all nine permission
    bits: Snapshot.modes, since the copy itself is read-only); anything else the walk meets is left out, and a
    question whose answer it could change raises Incomplete (see `whole`). Without `modes` (a folder that is not a
    snapshot) the listing's own modes are the truth."""

    def __init__(self, path, missing=None, cut="", modes=None):
        self.path = path
        self.missing = dict(missing or {})  # {relative path: why} the snapshot did not copy (Snapshot.missing)
        listed, self.cut = _listing(path, MAX_ENTRIES, self.missing)
        self.cut = cut or self.cut          # why the copy or this listing stopped early ("" when whole)
        self.modes = listed if modes is None else {}
        for rel, mode in listed.items():
            if modes is None or stat.S_IFMT(modes.get(rel, 0)) == stat.S_IFMT(mode):
                self.modes[rel] = mode if modes is None else modes[rel]
            else:                           # never the case for a snapshot: it records what it copied
                self.missing[rel] = "its mode in the episode is not known"
        self.entries = {rel: "dir" if stat.S_ISDIR(m) else "file" for rel, m in self.modes.items()}

    def whole(self, rel=""):
        """Raise Incomplete unless everything at and under the relative path `rel` ("" for all), and every folder
        above it, was copied: a verifier must not read "not there" where the snapshot only left a thing out."""
        if self.cut:
            raise Incomplete(f"the snapshot is incomplete: {self.cut}")
        for m, why in self.missing.items():
            if _related(m, rel.rstrip("/")):
                raise Incomplete(f"the snapshot is incomplete under {rel or 'the work folder'}: {m}: {why}")

    def files(self, under=""):
        """The regular files at or under the relative folder `under` ("" for all), sorted."""
        self.whole(under)
        prefix = under.rstrip("/") + "/" if under else ""
        return sorted(p for p, kind in self.entries.items() if kind != "dir" and p.startswith(prefix))

    def folders(self, under=""):
        self.whole(under)
        prefix = under.rstrip("/") + "/" if under else ""
        return sorted(p for p, kind in self.entries.items() if kind == "dir" and p.startswith(prefix))

    def mode(self, rel):
        """The whole st_mode the agent left `rel` with (stat.S_IMODE for its permission bits), or None if absent."""
        self.whole(rel)
        return self.modes.get(rel)

    def read(self, rel, cap=MAX_READ):
        """The bytes of the regular file `rel`, or None: not listed as one, unreadable, or over `cap` bytes."""
        self.whole(rel)
        if self.entries.get(rel) != "file":
            return None
        try:
            fd = os.open(os.path.join(self.path, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            chunks, got = [], 0
            while got <= cap:           # one byte past the cap: a file over it reads as missing
                chunk = os.read(fd, min(1 << 16, cap + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            return None if got > cap else b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def text(self, rel, cap=MAX_READ):
        """The file as UTF-8 text, or None (missing, over the cap, or not UTF-8)."""
        data = self.read(rel, cap)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def lines(self, rel, cap=MAX_READ):
        """The file's lines (text_lines), or None."""
        text = self.text(rel, cap)
        return None if text is None else text_lines(text)


def text_lines(text):
    """The lines of `text` as a shell's tools count them: split at "\n" alone (a final newline or none). Python's
    splitlines() also splits at \r, \v, \f, \x1c-\x1e, \x85 and \u2028: a file of one line that `wc -l` counts
    as 0 would read as the lines asked for."""
    return text.removesuffix("\n").split("\n") if text else []


def _listing(top, cap, missing):
    """({relative path: st_mode}, why it stopped early or "") of a folder's folders and regular files, walked
    iteratively without following anything, at most `cap` entries; what it cannot list or stat, and anything that
    is neither, goes into `missing`."""
    entries, stack = {}, [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(top, rel) if rel else top) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError as e:
            missing[rel + "/"] = f"cannot list ({e.strerror})"
            continue
        for entry in found:
            if len(entries) >= cap:
                return entries, f"over the verifier's {cap} entries"
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                missing[path] = f"cannot stat ({e.strerror})"
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                entries[path] = st.st_mode
                if stat.S_ISDIR(st.st_mode):
                    stack.append(path)
            else:
                missing[path] = "not a folder or a regular file"
    return entries, ""


# ------------------------------------------------------------------------------------------------------------------
# running the agent's work, confined

def probe(folder, command, take=None, extra=None, limits=PROBE_LIMITS):
    """Run the bash `command` in a fresh sandbox holding a copy of the snapshot's files that `take(rel)` accepts
    (all when None; each with the nine permission bits the agent gave it, so a script its owner cannot read or
    execute does not run) and then the verifier's `extra` {path: content}. Returns the
    CommandResult. Raises Incomplete when any of those files cannot come across whole: one the snapshot left out
    (`take` asked of the path, and of it as a folder: a symlink or fifo may stand where a folder should be), any
    folder whose contents the snapshot left out (they could be anything), one over PROBE_BYTES in all, past
    PROBE_FILES or with a path over PROBE_PATH, or a copy that finds no room; a probe on part of the agent's work
    could read "not there" as the truth, and a sandbox that cannot start for what the agent left must not take the
    episode out of its group. Only a failure of the host raises VerifierUnavailable."""
    files, modes = _taken(folder, take)
    extra = extra or {}
    files = {rel: data for rel, data in files.items() if not _in_the_way(rel, extra)}
    modes = {rel: mode for rel, mode in modes.items() if rel in files}
    files.update(extra)
    inodes, size = _footprint(files)
    try:
        ep = Episode(files, limits, budget_s=limits.timeout + 1, output_bytes=PROBE_OUTPUT,
                     folder_files=inodes + PROBE_ROOM_FILES, folder_mb=(size >> 20) + 1 + PROBE_ROOM_MB)
    except OSError as e:
        # sized for the copy, the folder can run out only on the host's disk (no tmpfs of its own), which the
        # agent's own folder shares: counted as the agent's, so that filling it never gets an episode unscored
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Incomplete(f"the probe's copy found no room: {e.strerror}") from None
        raise VerifierUnavailable(f"the verifier's sandbox did not start: {e}") from None
    except ValueError as e:
        raise VerifierUnavailable(f"the verifier's sandbox did not start: {e}") from None
    with ep:
        for rel, mode in modes.items():     # the folder holds only what Episode wrote there: no link to follow
            os.chmod(os.path.join(ep.folder, rel), stat.S_IMODE(mode) & 0o777)
        try:
            return ep.run(command)
        except OSError as e:
            raise VerifierUnavailable(f"the verifier's sandbox did not run: {e}") from None


def _taken(folder, take):
    """({rel: bytes}, {rel: st_mode}) of the snapshot's files that `take` accepts; raises Incomplete (probe)."""
    wanted = (lambda rel: True) if take is None else take
    if folder.cut:
        raise Incomplete(f"the snapshot is incomplete: {folder.cut}")
    for m, why in folder.missing.items():
        if m.endswith("/") or wanted(m) or wanted(m + "/"):
            raise Incomplete(f"the snapshot is incomplete: {m}: {why}")
    files, modes, size = {}, {}, 0
    for rel in sorted(p for p, kind in folder.entries.items() if kind != "dir"):
        if not wanted(rel):
            continue
        if len(rel.encode()) > PROBE_PATH:
            raise Incomplete(f"{rel[:80]}...: a path over the probe's {PROBE_PATH} bytes")
        data = folder.read(rel, PROBE_BYTES)
        if data is None or size + len(data) > PROBE_BYTES or len(files) >= PROBE_FILES:
            raise Incomplete(f"{rel}: over the probe's {PROBE_FILES} files or {PROBE_BYTES} bytes in all")
        files[rel], modes[rel], size = data, folder.mode(rel), size + len(data)
    return files, modes


def _in_the_way(rel, extra):
    # the verifier's files win: an agent's file where one of them goes, where a folder above one goes, or below
    # a path where one goes would make the copy-in fail for the agent's choice of names
    return rel in extra or any(e.startswith(rel + "/") or rel.startswith(e + "/") for e in extra)


def _footprint(files):
    """(inodes, bytes) a tmpfs needs to hold `files`: the root, each file and each folder above one, and every
    file's and folder's pages."""
    folders = {os.path.dirname(rel) for rel in files} - {""}
    for rel in list(folders):
        while rel := os.path.dirname(rel):
            folders.add(rel)
    sizes = (len(data.encode() if isinstance(data, str) else data) for data in files.values())
    pages = sum(-(-n // mmap.PAGESIZE) for n in sizes) + len(folders)
    return 1 + len(files) + len(folders), pages * mmap.PAGESIZE


# ------------------------------------------------------------------------------------------------------------------
# reading a final answer

_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_HEX64 = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])")


def last_number(answer):
    """The last number in the answer (thousands commas allowed), or None."""
    found = _NUMBER.findall(answer[:MAX_ANSWER])
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def number_is(answer, expected, tol=1e-6):
    got = last_number(answer)
    return 1.0 if got is not None and abs(got - expected) <= tol else 0.0


def named(answer, candidates):
    """The candidates the answer names, each as a whole word (a path's last part counts: data/x.csv names
    x.csv). Case-sensitive: a file name is."""
    text = answer[:MAX_ANSWER]
    return {c for c in candidates if re.search(r"(?<![\w.-])" + re.escape(c) + r"(?![\w-])", text)}


def names_only(answer, expected, candidates):
    """1.0 when the answer names `expected` and no other candidate, else 0.0."""
    return 1.0 if named(answer, set(candidates) | {expected}) == {expected} else 0.0


def last_digest(answer):
    """The last 64-hex-digit token of the answer (a SHA-256 digest), lower-cased, or None."""
    found = _HEX64.findall(answer[:MAX_ANSWER])
    return found[-1].lower() if found else None


def as_given(folder, files, under, others=False):
    """Whether the files under the relative folder `under` are exactly those of `files` ({path: content}) there,
    each with that content and the mode every given file starts with (FILE_MODE): what an instruction to leave
    files as they are (or not to edit them) asks, their modes included. others=True lets new files lie beside
    them (a test run's __pycache__)."""
    want = {p: c for p, c in files.items() if p.startswith(under.rstrip("/") + "/")}
    listed = folder.files(under)
    return (set(want) <= set(listed) if others else listed == sorted(want)) and all(
        folder.text(p) == c and stat.S_IMODE(folder.mode(p)) == FILE_MODE for p, c in want.items())


def lines_are(folder, rel, expected):
    """1.0 when the file `rel` holds exactly the `expected` lines (trailing spaces and the final newline aside)."""
    got = folder.lines(rel)
    return 1.0 if got is not None and [g.rstrip() for g in got] == list(expected) else 0.0
