"""Machine checks of the criteria-checklist judge (the `local` backend), and the sandbox that runs answer code.

A check is a small dict (schema in the contract, examples in tests/test_judge_checks.py); `run_check(check, answer)`
returns (True | False | None, reason). None means "could not be decided here" (a package the test needs is not
installed), and the judge leaves that criterion out of the score's denominator.

Text checks look at the whole answer ("text") or at its code ("code": the fenced code blocks tagged python or
untagged, joined). Syllables and rhymes are English spelling heuristics: good enough to tell a haiku from a
paragraph, not a phonetic dictionary; the `tol` of a syllables check absorbs the rest.

The sandbox (run_python_sandboxed): answer code is untrusted, written by the policy being trained. Each run gets a
fresh folder (cwd, HOME and TMPDIR; its parent is not writable or listable by the sandbox user), a scrubbed
environment (PATH, HOME, LANG, thread counts: no inherited secrets), `python -I`, its own session (process group)
SIGKILLed at the wall timeout, and rlimits on CPU seconds, address space, file size and process count (a check may
override timeout, memory_mb, fsize_mb, nproc). The rlimits are set by a small runner inside the sandbox, not by a
preexec_fn, which is unsafe while the judge's pool threads run. Where the OS allows it, the run is also in fresh
network + pid + mount namespaces (`unshare`: no network, its own /proc, and every process it forked dies with it,
even ones that left the process group) and, when we are root, runs as user nobody (`setpriv`): RLIMIT_NPROC does
not bind root, and root can read every process's /proc/PID/environ and write anywhere. Whatever could not be set
up is named in the verdict reason as "weaker sandbox: ...". Not contained even at best: reading world-readable
files, writing world-writable folders such as /tmp and /dev/shm (RLIMIT_FSIZE bounds each file, not their number),
and CPU/memory pressure on the host until the timeout.
"""

import ast
import atexit
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

NOBODY = 65534
# nproc counts every process and thread of the sandbox user (nobody), so it is one budget shared by the sandboxes
# running at once: high enough for 8 tests using thread pools, low enough to stop a fork bomb early.
SANDBOX_DEFAULTS = {"timeout": 10.0, "memory_mb": 2048, "fsize_mb": 16, "nproc": 256}

# ----------------------------------------------------------------------------------------------------------------
# Getting at the parts of an answer

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_PY_TAGS = {"", "python", "py", "python3"}


def fenced_blocks(answer):
    """[(lang, body), ...] of the answer's ``` fenced blocks, lang lower-cased ('' when untagged)."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(answer)]


def extract_code(answer):
    """The answer's Python: its python-tagged or untagged fenced blocks joined; with no fences at all, the whole
    answer if it parses as Python (a bare code reply), else ''."""
    blocks = fenced_blocks(answer)
    if blocks:
        return "\n\n".join(body for lang, body in blocks if lang in _PY_TAGS)
    try:
        ast.parse(answer)
    except (SyntaxError, ValueError):
        return ""
    return answer if answer.strip() else ""


def _target(check, answer, default="text"):
    return extract_code(answer) if check.get("target", default) == "code" else answer


def _lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def _words(text):
    return re.findall(r"\w+(?:['’-]\w+)*", text)


# ----------------------------------------------------------------------------------------------------------------
# Text checks

def _check_regex(check, answer):
    flags = 0
    for letter in check.get("flags", ""):
        flags |= {"i": re.I, "m": re.M, "s": re.S, "x": re.X}[letter]
    found = re.search(check["pattern"], _target(check, answer), flags) is not None
    must = check.get("must", True)
    return found == must, f"/{check['pattern']}/ {'found' if found else 'not found'} (must{'' if must else ' not'} match)"


def _count(text, unit):
    if unit == "words":
        return len(_words(text))
    if unit == "lines":
        return len(_lines(text))
    if unit == "sentences":
        return sum(1 for s in re.split(r"(?<=[.!?])\s+", text.strip()) if re.search(r"\w", s))
    if unit == "chars":
        return len(text.strip())
    if unit == "paragraphs":
        return sum(1 for p in re.split(r"\n\s*\n", text) if p.strip())
    raise ValueError(f"count check: unknown unit {unit!r} (words, lines, sentences, chars, paragraphs)")


def _check_count(check, answer):
    n = _count(_target(check, answer), check["unit"])
    lo, hi = check.get("min", 0), check.get("max", float("inf"))
    return lo <= n <= hi, f"{n} {check['unit']} (want {lo}..{hi})"


def _has_phrase(text, phrase, case):
    # whole words/phrases: "cat" does not match "concatenate"; any run of whitespace matches a space
    pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, phrase.split())) + r"(?!\w)"
    return re.search(pattern, text, 0 if case else re.I) is not None


def _check_contains(check, answer):
    text, case = _target(check, answer), check.get("case", False)
    missing = [p for p in check.get("all", []) if not _has_phrase(text, p, case)]
    anys = check.get("any", [])
    no_any = bool(anys) and not any(_has_phrase(text, p, case) for p in anys)
    banned = [p for p in check.get("none", []) if _has_phrase(text, p, case)]
    problems = ([f"missing {missing}"] if missing else []) + ([f"none of {anys}"] if no_any else []) \
        + ([f"has banned {banned}"] if banned else [])
    return not problems, "; ".join(problems) or "required/banned phrases ok"


# Words the rules below get wrong often enough to matter in haiku-sized texts.
_SYLLABLE_EXCEPTIONS = {"every": 2, "evening": 2, "poem": 2, "poet": 2, "quiet": 2, "science": 2, "business": 2,
                        "idea": 3, "area": 3, "create": 2, "being": 2, "fire": 1, "hour": 1, "our": 1, "people": 2}


def syllables(word):
    """Heuristic English syllable count: vowel groups, minus a silent final e and a silent -ed/-es, plus the split
    vowel pairs (li-on, pi-a-no) that spelling hides."""
    w = re.sub(r"[^a-z]", "", word.lower())
    if not w:
        return 0
    if w in _SYLLABLE_EXCEPTIONS:
        return _SYLLABLE_EXCEPTIONS[w]
    n = len(re.findall(r"[aeiouy]+", w[0].replace("y", "b") + w[1:]))   # a leading y is a consonant (yes, you)
    if n > 1 and w.endswith("e") and not w.endswith(("le", "ee", "ye")):
        n -= 1                                                            # make, silence
    elif n > 1 and w.endswith(("ed", "es")) and not re.search(r"(t|d)ed$|(s|z|c|g|x|sh|ch)es$", w):
        n -= 1                                                            # jumped, lines (but wanted, horses)
    n += len(re.findall(r"[^tscg]i[aou]", w))                             # lion, piano (not nation, social)
    n += 1 if re.search(r"[aeiouy]ing$", w) else 0                        # going, seeing
    return max(1, n)


def _check_syllables(check, answer):
    lines, want, tol = _lines(_target(check, answer)), check["lines"], check.get("tol", 0)
    if len(lines) != len(want):
        return False, f"{len(lines)} non-empty lines, want {len(want)}"
    got = [sum(syllables(w) for w in _words(line)) for line in lines]
    ok = all(abs(g - s) <= tol for g, s in zip(got, want))
    return ok, f"syllables per line {got}, want {want} (±{tol})"


def rime(word):
    """The spelled rime of a word's last syllable: its last vowel group and what follows, after dropping a silent
    final e and folding a few spellings of one sound (day/say -> 'ai', me/sea/tree -> 'ee')."""
    w = re.sub(r"[^a-z]", "", word.lower())
    if len(w) > 2 and w.endswith("e") and w[-2] not in "aeiouy":
        w = w[:-1]                                                        # time -> tim, mouse -> mous
    w = w[0] + w[1:].replace("y", "i") if w else w                        # rhyme -> rhime, day -> dai
    if re.fullmatch(r"[^aeiou]*e", w):
        w = w + "e"                                                       # me, she -> mee, shee
    m = re.search(r"[aeiou]+[^aeiou]*$", w)
    key = m.group(0) if m else w
    return {"ea": "ee", "ay": "ai", "ey": "ai", "ow": "o", "oe": "o"}.get(key, key)


def rhymes(a, b):
    a, b = a.lower().strip(), b.lower().strip()
    return bool(a) and a != b and rime(a) == rime(b)    # a word repeated is not a rhyme (cheap to game)


def _check_rhyme(check, answer):
    lines, scheme = _lines(_target(check, answer)), check["scheme"]
    if len(lines) != len(scheme):
        return False, f"{len(lines)} non-empty lines, scheme {scheme} wants {len(scheme)}"
    ends = [(_words(line) or [""])[-1] for line in lines]
    seen, bad = {}, []
    for i, letter in enumerate(scheme):
        # a line rhymes with its group if it rhymes with some earlier line of it (limericks repeat line 1's word)
        if seen.get(letter) and not any(rhymes(e, ends[i]) for e in seen[letter]):
            bad.append(f"{seen[letter][0]}/{ends[i]}")
        seen.setdefault(letter, []).append(ends[i])
    return not bad, f"line ends {ends}" + (f"; no rhyme: {', '.join(bad)}" if bad else f" fit {scheme}")


def _check_json(check, answer):
    candidates = [answer.strip()] + [body for lang, body in fenced_blocks(answer) if lang in ("json", "")]
    for text in candidates:
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        keys = check.get("schema_keys", [])
        missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
        return not missing, f"JSON parses; missing keys {missing}" if missing else "JSON parses with the keys"
    return False, "no parseable JSON (whole answer or a fenced json block)"


def _check_code_block(check, answer):
    want = check.get("lang")
    langs = [lang for lang, _ in fenced_blocks(answer)]
    ok = any(want is None or lang == want.lower() or (lang in _PY_TAGS - {""} and want.lower() in _PY_TAGS)
             for lang in langs)
    return ok, f"fenced blocks tagged {langs}, want {want or 'any'}"


def _check_combined(check, answer):
    results = [run_check(c, answer) for c in check["checks"]]
    values = [r[0] for r in results]
    if check["type"] == "all":
        value = False if False in values else (None if None in values else True)
    else:
        value = True if True in values else (None if None in values else False)
    return value, f"{check['type']}(" + "; ".join(r[1] for r in results) + ")"


def _check_not(check, answer):
    value, reason = run_check(check["check"], answer)
    return (None if value is None else not value), f"not({reason})"


# ----------------------------------------------------------------------------------------------------------------
# Python checks and the sandbox

@functools.lru_cache(maxsize=None)
def _isolation():
    """(argv prefix, weaknesses) of the strongest isolation that works on this machine, probed once."""
    root = os.geteuid() == 0
    ns = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if not root:
        ns = ["unshare", "--user", "--map-root-user"] + ns[1:]    # unprivileged user namespace, where allowed
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if root else []
    as_root = ["runs as root, so RLIMIT_NPROC does not bind and it can write wherever root can"] if root else []
    no_ns = ["network not cut", "no pid namespace, so children that leave the process group may outlive it"]
    for prefix, weak in [(ns + drop, []), (ns, as_root), (drop, no_ns), ([], no_ns + as_root)]:
        if _works(prefix):
            return prefix, weak


def _works(prefix):
    if not prefix:
        return True
    if not all(shutil.which(tool) for tool in prefix if not tool.startswith("-")):
        return False
    folder = tempfile.mkdtemp(prefix="minigrpo-probe-")
    try:
        if "setpriv" in prefix:
            os.chown(folder, NOBODY, NOBODY)
        run = subprocess.run(prefix + [sys.executable, "-I", "-c", "pass"], cwd=folder, capture_output=True,
                             timeout=30)
        return run.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# Runs inside the sandbox before the test: lower the limits (allowed without privileges), then run the test file
# with the sandbox folder on sys.path (-I leaves the script folder out, so `from solution import *` needs this).
_RUNNER = """import resource, runpy, sys
for name, value in {limits!r}:
    resource.setrlimit(getattr(resource, name), (value, value))
sys.path.insert(0, "")
sys.argv = ["check_test.py"]
runpy.run_path("check_test.py", run_name="__main__")
"""


def run_python_sandboxed(files, test, timeout=10.0, memory_mb=2048, fsize_mb=16, nproc=256):
    """Write `files` ({name: source}) and `test` into a fresh folder and run the test there, contained.
    Returns (returncode | None on timeout, output tail, weaknesses list)."""
    prefix, weak = _isolation()
    limits = [("RLIMIT_CPU", int(timeout) + 1), ("RLIMIT_AS", memory_mb << 20), ("RLIMIT_FSIZE", fsize_mb << 20),
              ("RLIMIT_NPROC", nproc), ("RLIMIT_CORE", 0)]
    folder = tempfile.mkdtemp(prefix="run-", dir=_sandbox_base())
    try:
        for name, source in {**files, "check_test.py": test}.items():
            with open(os.path.join(folder, name), "w") as f:
                f.write(source)
        if "setpriv" in prefix:
            for name in os.listdir(folder) + [""]:
                os.chown(os.path.join(folder, name), NOBODY, NOBODY)
        os.chmod(folder, 0o700)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        argv = prefix + [sys.executable, "-I", "-c", _RUNNER.format(limits=limits)]
        with tempfile.TemporaryFile() as out:   # outside the folder; RLIMIT_FSIZE bounds it too
            proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            _kill_group(proc)    # always: the test may have left children behind
            out.seek(max(0, out.seek(0, 2) - 2000))
            tail = out.read().decode("utf-8", "replace")
        return rc, tail, weak
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _sandbox_base():
    """Root of the sandbox folders: traversable but not listable or writable by others, so a sandboxed test cannot
    write next to its folder (../x) nor see its neighbours."""
    base = tempfile.mkdtemp(prefix="minigrpo-sandboxes-")
    os.chmod(base, 0o711)
    atexit.register(shutil.rmtree, base, True)
    return base


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _check_python(check, answer):
    missing = [m for m in check.get("requires", []) if importlib.util.find_spec(m) is None]
    if missing:
        return None, f"unchecked: package {missing} not installed"
    code = _target(check, answer, default="code")
    if not code.strip():
        return False, "no code found (no python/untagged fenced block)"
    opts = {k: check[k] for k in SANDBOX_DEFAULTS if k in check}
    t0 = time.monotonic()
    rc, tail, weak = run_python_sandboxed({"solution.py": code}, check["test"], **{**SANDBOX_DEFAULTS, **opts})
    note = f" (weaker sandbox: {', '.join(weak)})" if weak else ""
    if rc is None:
        return False, f"timed out after {time.monotonic() - t0:.1f}s{note}"
    last = tail.strip().splitlines()[-1][:300] if tail.strip() else ""
    return rc == 0, ("tests passed" if rc == 0 else f"tests failed (exit {rc}): {last}") + note


# ----------------------------------------------------------------------------------------------------------------

CHECKS = {"python": _check_python, "regex": _check_regex, "count": _check_count, "contains": _check_contains,
          "syllables": _check_syllables, "rhyme": _check_rhyme, "json": _check_json, "code_block": _check_code_block,
          "all": _check_combined, "any": _check_combined, "not": _check_not}


def validate_check(check, where="check"):
    """Raise ValueError (one line, naming `where`) if `check` is not a well-formed machine check."""
    if not isinstance(check, dict) or check.get("type") not in CHECKS:
        raise ValueError(f"{where}: check type {check.get('type') if isinstance(check, dict) else check!r} "
                         f"unknown (one of {', '.join(CHECKS)})")
    required = {"python": ["test"], "regex": ["pattern"], "count": ["unit"], "syllables": ["lines"],
                "rhyme": ["scheme"], "all": ["checks"], "any": ["checks"], "not": ["check"]}
    for key in required.get(check["type"], []):
        if key not in check:
            raise ValueError(f"{where}: {check['type']} check needs key {key!r}")
    for i, sub in enumerate(check.get("checks", []) if check["type"] in ("all", "any") else []):
        validate_check(sub, f"{where}.checks[{i}]")
    if check["type"] == "not":
        validate_check(check["check"], f"{where}.check")


def run_check(check, answer):
    """Evaluate one machine check on an answer -> (True | False | None, reason)."""
    return CHECKS[check["type"]](check, answer)
