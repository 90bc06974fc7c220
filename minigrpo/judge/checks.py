"""Machine checks of the criteria-checklist judge (the `local` backend), and the sandbox that runs answer code.

A check is a small dict (schema in the contract, examples in tests/judge/test_checks.py); `run_check(check, answer)`
returns (True | False | None, reason). None means "could not be decided here" (a package the test needs is not
installed; a "veto" writing check that found nothing), and the judge leaves that criterion out of the denominator.

Text checks look at the whole answer ("text", or "writing": the text as a piece of writing), never at its code
alone (a pattern in the source is spelling; python checks run the code). Syllables and rhymes are English spelling heuristics: good enough to tell a
haiku from a paragraph, not a phonetic dictionary; the `tol` of a syllables check absorbs the rest.

The answer is written by the policy being trained, so the text checks are total and bounded: an answer longer than
MAX_TEXT (64 KB) fails them; task patterns run on the `regex` engine (re's syntax, V0) with concurrent=True (no GIL:
the judge pool runs beside the training thread) and a REGEX_TIMEOUT of 1 s (the regex module counts the process's
CPU time); the helper regexes are linear; fences are found by a line scanner; parser bombs (deep nesting that makes
ast.parse or json.loads raise) count as "does not parse". Whatever the answer makes a check trip on fails the
criterion (AnswerFault), also under `not`; never None, never an exception.

There is no code-inspection check: what the answer's source says (the calls it names, its loops, its imports) never
pays, since a branch no test takes can name anything and a loop can be spelled many ways (`reduce`, `zip(*cols)`).
A criterion about how code is written is paid locally only by behaviour (a budget or a test the alternative
fails) or has no machine check, and then the LLM grades it in hybrid and llm modes (docs/judge-evidence.md). The
writing check (type "natural": repetition, vocabulary, sentence structure, echo of the prompt) lives in
minigrpo/judge/writing.py. Two rules hold for every criterion (run_check), because a
"must not" check passes on text that has nothing in it: a blank answer pays no criterion, and a criterion reading
target "writing" pays only an answer that passes writing.DEFAULTS (no keyword stuffing, word list, shuffle...).

Python checks: the answer is code written by the policy being trained, so it never runs in the process that
decides. `run_python_checks` hands an answer's python criteria to the trusted driver (minigrpo/judge/driver.py, one
process per answer), which runs each criterion's test with the answer in a fresh sandbox (minigrpo/judge/sandbox/)
behind a plain-data channel (minigrpo/judge/wire.py). A criterion passes only when its test ran to the end; anything
else the answer causes fails it. Where the machine cannot give the full sandbox, every reason says
"weaker sandbox: ..." and the soyuz task prints it once at start.
"""

import functools
import json
import re

import regex

from minigrpo.judge.answer_code import PY_TAGS, fenced_blocks
from minigrpo.judge.pychecks import ANSWER_EVIDENCE, SANDBOX_DEFAULTS, missing_packages, run_python_checks, \
    sandbox_isolation  # noqa: F401 (the package's public names come from here)
from minigrpo.judge.writing import check_natural, unpaid, validate_natural

# The text checks read at most this many characters of an answer (a policy's answer is a few KB); a longer answer
# fails them. Every task pattern runs under the `regex` engine with a time limit and without the GIL.
MAX_TEXT = 65536
REGEX_TIMEOUT = 1.0


class AnswerFault(Exception):
    """The answer made a text check impossible (too long, a pattern over time, input a parser cannot take): the
    criterion fails with this message as its reason, also under `not`."""


# ----------------------------------------------------------------------------------------------------------------
# Getting at the parts of an answer

def _lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def _words(text):
    return re.findall(r"\w+(?:['’-]\w+)*", text)


# ----------------------------------------------------------------------------------------------------------------
# Text checks

_FLAGS = {"i": regex.I, "m": regex.M, "s": regex.S, "x": regex.X}


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern, flags=""):
    """A task pattern under the `regex` engine (V0: re's syntax and semantics). ValueError if it does not compile."""
    bits = regex.V0
    for letter in flags:
        if letter not in _FLAGS:
            raise ValueError(f"regex flag {letter!r} unknown (i, m, s, x)")
        bits |= _FLAGS[letter]
    try:
        return regex.compile(pattern, bits)
    except regex.error as e:
        raise ValueError(f"pattern {_show(pattern)} does not compile: {e}") from None


def _show(pattern, n=60):
    text = ascii(pattern)[1:-1]    # one line, whatever the pattern holds
    return "/" + (text if len(text) <= n else text[:n] + "...") + "/"


def search(pattern, text, flags=""):
    """regex search with a time limit, off the GIL; over time raises AnswerFault (the answer caused it)."""
    try:
        return compile_pattern(pattern, flags).search(text, concurrent=True, timeout=REGEX_TIMEOUT)
    except TimeoutError:
        raise AnswerFault(f"{_show(pattern)} took over {REGEX_TIMEOUT:g}s on this answer") from None


def _check_regex(check, answer):
    found = search(check["pattern"], answer, check.get("flags", "")) is not None
    must = check.get("must", True)
    return found == must, f"{_show(check['pattern'])} {'found' if found else 'not found'} " \
                          f"(must{'' if must else ' not'} match)"


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
    n = _count(answer, check["unit"])
    lo, hi = check.get("min", 0), check.get("max", float("inf"))
    return lo <= n <= hi, f"{n} {check['unit']} (want {lo}..{hi})"


def _has_phrase(text, phrase, case):
    # whole words/phrases: "cat" does not match "concatenate"; any run of whitespace matches a space
    pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, phrase.split())) + r"(?!\w)"
    return re.search(pattern, text, 0 if case else re.I) is not None


def _check_contains(check, answer):
    text, case = answer, check.get("case", False)
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
    elif n > 1 and w.endswith(("ed", "es")) and not w.endswith(_SOUNDED_ENDINGS):
        n -= 1                                                            # jumped, lines (but wanted, horses)
    n += len(re.findall(r"[^tscg]i[aou]", w))                             # lion, piano (not nation, social)
    n += 1 if len(w) > 3 and w.endswith("ing") and w[-4] in "aeiouy" else 0   # going, seeing
    return max(1, n)


_SOUNDED_ENDINGS = ("ted", "ded", "ses", "zes", "ces", "ges", "xes", "shes", "ches")


def _check_syllables(check, answer):
    lines, want, tol = _lines(answer), check["lines"], check.get("tol", 0)
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
    if w.endswith("e") and not any(c in "aeiou" for c in w[:-1]):
        w = w + "e"                                                       # me, she -> mee, shee
    # the last vowel group and what follows it (a scan from the end: linear, unlike a search for [aeiou]+[^aeiou]*$)
    end = len(w)
    while end and w[end - 1] not in "aeiou":
        end -= 1
    start = end
    while start and w[start - 1] in "aeiou":
        start -= 1
    key = w[start:] if end else w
    return {"ea": "ee", "ay": "ai", "ey": "ai", "ow": "o", "oe": "o"}.get(key, key)


def rhymes(a, b):
    a, b = a.lower().strip(), b.lower().strip()
    return bool(a) and a != b and rime(a) == rime(b)    # a word repeated is not a rhyme (cheap to game)


def _check_rhyme(check, answer):
    lines, scheme = _lines(answer), check["scheme"]
    if len(lines) != len(scheme):
        return False, f"{len(lines)} non-empty lines, scheme {scheme} wants {len(scheme)}"
    ends = [(_words(line) or [""])[-1] for line in lines]
    seen, bad = {}, []
    for i, letter in enumerate(scheme):
        # a line rhymes with its group if it rhymes with some earlier line of it (limericks repeat line 1's word)
        if seen.get(letter) and not any(rhymes(e, ends[i]) for e in seen[letter]):
            bad.append(f"{seen[letter][0][:40]}/{ends[i][:40]}")
        seen.setdefault(letter, []).append(ends[i])
    ends_shown = [e[:40] for e in ends]
    return not bad, f"line ends {ends_shown}" + (f"; no rhyme: {', '.join(bad)}" if bad else f" fit {scheme}")


def _check_json(check, answer):
    candidates = [answer.strip()] + [body for lang, body in fenced_blocks(answer) if lang in ("json", "")]
    for text in candidates:
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError, MemoryError):    # a 100k-deep array is not parseable JSON here
            continue
        keys = check.get("schema_keys", [])
        missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
        return not missing, f"JSON parses; missing keys {missing}" if missing else "JSON parses with the keys"
    return False, "no parseable JSON (whole answer or a fenced json block)"


def _check_code_block(check, answer):
    want = check.get("lang")
    langs = [lang for lang, _ in fenced_blocks(answer)]
    ok = any(want is None or lang == want.lower() or (lang in PY_TAGS - {""} and want.lower() in PY_TAGS)
             for lang in langs)
    shown = [lang[:20] for lang in langs[:10]] + (["..."] if len(langs) > 10 else [])
    return ok, f"fenced blocks tagged {shown}, want {want or 'any'}"


def _check_combined(check, answer):
    results = [_run(c, answer) for c in check["checks"]]
    values = [r[0] for r in results]
    if check["type"] == "all":
        value = False if False in values else (None if None in values else True)
    else:
        value = True if True in values else (None if None in values else False)
    return value, f"{check['type']}(" + "; ".join(r[1] for r in results) + ")"


def _check_not(check, answer):
    value, reason = _run(check["check"], answer)
    return (None if value is None else not value), f"not({reason})"


# ----------------------------------------------------------------------------------------------------------------
# Python checks: decided by the trusted driver, the answer sandboxed (minigrpo/judge/pychecks.py)

def _check_python(check, answer):
    return run_python_checks([check], answer)[0]


# ----------------------------------------------------------------------------------------------------------------

CHECKS = {"python": _check_python, "regex": _check_regex, "count": _check_count, "contains": _check_contains,
          "syllables": _check_syllables, "rhyme": _check_rhyme, "json": _check_json, "code_block": _check_code_block,
          "all": _check_combined, "any": _check_combined, "not": _check_not,
          "natural": lambda check, answer: check_natural(check, answer)}
TEXT_CHECKS = {"regex", "count", "contains", "syllables", "rhyme", "json", "code_block", "natural"}
# What a text check reads: the whole answer, or the answer as a piece of writing (writing.unpaid). Never its code: a
# pattern found in the source is spelling (a python check runs the code instead).
TARGETS = ("text", "writing")


def validate_check(check, where="check"):
    """Raise ValueError (one line, naming `where`) if `check` is not a well-formed machine check."""
    if isinstance(check, dict) and check.get("type") == "ast":     # the check type this judge no longer has
        raise ValueError(f"{where}: check type 'ast' reads the answer's source, which never pays: pay the behaviour "
                         "it stands for (a budget or a test the alternative fails) or leave the criterion without "
                         "a check (the LLM grades it in hybrid mode)")
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
    if check["type"] == "python" and check.get("evidence", "driver") not in ("driver", "answer"):
        raise ValueError(f"{where}: python check 'evidence' must be \"driver\" or \"answer\"")
    if check["type"] == "python" and type(check.get("shared", False)) is not bool:
        raise ValueError(f"{where}: python check 'shared' (containers keep reference semantics) must be true or false")
    if check["type"] == "python" and check.get("target", "code") not in ("code", "text"):
        raise ValueError(f"{where}: python check target {check['target']!r} unknown (code: its python; text: all)")
    if check["type"] not in ("python", "all", "any", "not") and check.get("target", "text") not in TARGETS:
        why = ": a text check on the code reads the source, which never pays" if check["target"] == "code" else ""
        raise ValueError(f"{where}: target {check['target']!r} unknown (one of {', '.join(TARGETS)}){why}")
    try:
        if check["type"] == "natural":
            validate_natural(check)
        if check["type"] == "regex":
            compile_pattern(check["pattern"], check.get("flags", ""))
    except ValueError as e:
        raise ValueError(f"{where}: {check['type']} check: {e}") from None


def _run(check, answer):
    kind = check["type"]
    if kind not in TEXT_CHECKS:
        return CHECKS[kind](check, answer)
    if len(answer) > MAX_TEXT:
        raise AnswerFault(f"answer is {len(answer)} characters; text checks read at most {MAX_TEXT}")
    try:
        return CHECKS[kind](check, answer)
    except AnswerFault:
        raise
    except Exception as e:    # total on any answer: what the answer made the check trip on fails the criterion
        raise AnswerFault(f"{kind} check could not read this answer ({type(e).__name__})") from None


def run_check(check, answer):
    """Evaluate one machine check on an answer -> (True | False | None, reason). Text checks never raise: an answer
    they cannot read (over MAX_TEXT, a pattern over time, a parser bomb) fails the criterion, also inside not/any.
    A pass must then get past writing.unpaid, applied to the whole check (a `not` inside cannot turn it round)."""
    try:
        value, reason = _run(check, answer)
    except AnswerFault as e:
        return False, str(e)
    why = unpaid(check, answer) if value is True else ""
    return (False, f"{why} (the check alone: {reason})") if why else (value, reason)
