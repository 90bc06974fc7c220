"""Machine checks of the criteria-checklist judge (the `local` backend), and the sandbox that runs answer code.

A check is a small dict (schema in the contract, examples in tests/test_judge_checks.py); `run_check(check, answer)`
returns (True | False | None, reason). None means "could not be decided here" (a package the test needs is not
installed), and the judge leaves that criterion out of the score's denominator.

Text checks look at the whole answer ("text") or at its code ("code": the fenced code blocks tagged python or
untagged, joined). Syllables and rhymes are English spelling heuristics: good enough to tell a haiku from a
paragraph, not a phonetic dictionary; the `tol` of a syllables check absorbs the rest.

Python checks: the answer is code written by the policy being trained, so it never runs in the process that
decides. `run_python_checks` hands an answer's python criteria to the trusted driver (minigrpo/pydriver.py, one
process per answer), which runs each criterion's test with the answer in a fresh sandbox (minigrpo/sandbox.py)
behind a plain-data channel (minigrpo/wire.py). A criterion passes only when its test ran to the end; anything
else the answer causes fails it. Where the machine cannot give the full sandbox, every reason says
"weaker sandbox: ..." and the soyuz task prints it once at start.
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
# Python checks: decided by the trusted driver (minigrpo/pydriver.py), the answer sandboxed (minigrpo/sandbox.py)

_DRIVER_MARGIN = 10.0     # seconds the driver process gets beyond its checks' own time limits (start-up, pandas)


def missing_packages(check):
    """Packages a python check `requires` that this interpreter cannot import: a declared environment gap."""
    return [m for m in check.get("requires", []) if importlib.util.find_spec(m) is None]


def run_python_checks(checks, answer):
    """[(True | False | None, reason), ...] for python checks on one answer, run by one driver process (each
    criterion in a fresh sandbox of its own). None only for a declared environment gap (a package in `requires`
    not installed); anything the answer causes -- or a driver that fails -- fails the criterion."""
    out = [None] * len(checks)
    todo = []
    for i, check in enumerate(checks):
        if missing := missing_packages(check):
            out[i] = (None, f"unchecked: package {missing} not installed")
        elif not (code := _target(check, answer, default="code")).strip():
            out[i] = (False, "no code found (no python/untagged fenced block)")
        else:
            todo.append((i, check, code))
    by_code = {}
    for i, check, code in todo:
        by_code.setdefault(code, []).append((i, check))
    for code, items in by_code.items():
        for (i, _), result in zip(items, _run_driver(code, [check for _, check in items])):
            out[i] = result
    return out


def _run_driver(code, checks):
    job = json.dumps({"code": code, "checks": checks})
    limit = sum(float(c.get("timeout", SANDBOX_DEFAULTS["timeout"])) + 2 for c in checks) + _DRIVER_MARGIN
    with tempfile.TemporaryDirectory(prefix="minigrpo-driver-") as folder:
        with open(os.path.join(folder, "solution.py"), "w") as f:    # for code-inspection criteria
            f.write(code)
        env = {**os.environ, "PYTHONPATH": _PROJECT_ROOT, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            run = subprocess.run([sys.executable, "-m", "minigrpo.pydriver"], input=job, capture_output=True,
                                 text=True, timeout=limit, cwd=folder, env=env, start_new_session=True)
            results = json.loads(run.stdout.strip().splitlines()[-1])["results"]
            if len(results) != len(checks):
                raise ValueError("result count")
        except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError, TypeError, OSError) as e:
            reason = f"the check driver failed ({type(e).__name__}); a failure of the judge never passes"
            return [(False, reason)] * len(checks)
    note = _weaker_note()
    return [(bool(passed) if passed is not None else False, str(reason) + note) for passed, reason in results]


def _weaker_note():
    weak = sandbox_isolation()[1]
    return f" (weaker sandbox: {', '.join(weak)})" if weak else ""


@functools.lru_cache(maxsize=None)
def sandbox_isolation():
    """(level, weaknesses) of the answer sandbox on this machine (probed once)."""
    from minigrpo.sandbox import isolation
    return isolation()


_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANDBOX_DEFAULTS = {"timeout": 10.0, "memory_mb": 2048, "fsize_mb": 16, "nproc": 64}


def _check_python(check, answer):
    return run_python_checks([check], answer)[0]


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
