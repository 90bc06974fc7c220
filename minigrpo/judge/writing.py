"""Writing checks: does an answer read as a piece of writing at all, or is it keyword stuffing, a word list, a line
repeated, words shuffled or the task echoed back: text that a surface check (a count, a phrase, a syllable
pattern, a "must not" rule) would pay?

The `natural` check (type "natural") measures the answer's words, sentences and lines, and fails it on any of:

  size         fewer than min_words words (a token with no letter in it is not a word: "1 2 3" is not writing);
               min_letter_share: letters and digits as a share of the characters that are not spaces (byte soup,
               symbols and markup are not writing)
  repetition   max_word_share: the most frequent content word's share of the words, once it occurs REPEAT_MIN
               times (a word said once or twice is not repeated over and over); max_repeated_trigrams: the
               share of word trigrams that repeat an earlier one; max_repeated_lines: the share of lines that
               repeat an earlier line
  vocabulary   min_distinct: the distinct-word share, as a moving type-token ratio over windows of WINDOW words (a
               long answer is not held to a short one's ratio)
  structure    min_function_share: function words (the, of, and, is...) as a share of the words;
               min_sentence_share: the share of the words that stand in real units (3 words or more with a
               function word; units are sentences and lines for "prose", lines for "lines"); both only from
               STRUCTURE_WORDS words on (a haiku may have none). max_unit_words: the longest unit.
               max_word_order: where English word order shows (after a determiner or a preposition, at a sentence
               start inside a line), the share of places where it is broken, once there are 3 such faults (a word
               list or a shuffle breaks it everywhere; a typo once)
  restating    max_instructions: the share of the words that are the checklist's vocabulary (words, lines,
               syllables, exactly, at least...) once 4 different ones occur: the task described, not done
  echo         max_echo: the share of the answer's word 4-grams found in `echo`, the text the policy is shown (the
               prompt and the criteria texts, written into the check; echo_source builds it)

Each limit can be set in the check; null switches its rule off. DEFAULTS are loose on purpose: they are the gate that
minigrpo/checks.py run_check applies to every criterion reading target "writing" (unpaid), so an honest attempt,
however bad, must pass them; a task's own degeneracy criterion sets tighter, form-specific limits. With "veto": true
a natural check only takes points away: finding nothing gives None (unchecked: out of a local score's denominator,
handed to the LLM in hybrid mode), because a machine can tell text that is not writing, not good writing from bad.
Every statistic is one pass over the words (linear), on text the caller has capped (checks.MAX_TEXT); nothing here
raises on any string.
"""

import functools
import re
from collections import Counter

FUNCTION_WORDS = frozenset("""
a an the this that these those my your his her its our their some any no every each all both either neither
and or but nor so yet if then than because while when where whether as though although unless until since
of to in on at by for with from into onto over under about after before between through during without within
against among around up down out off near upon via per like
is are was were be been being am do does did has have had having will would can could shall should may might
must it i me we us you he him she they them who whom whose which what why how there here not one now just also
very too only even still again once more most much many few such own other another same
""".split())

# Word order. English never puts NOT_AFTER_DETERMINER after a determiner, nor NOT_AFTER_PREPOSITION (or a capital:
# a name, a quote) after these prepositions; particles that double as adverbs (in, on, by, up) are left out: "the
# reports aren't in by Friday". "to" takes the infinitives it can take. A word list or a shuffle puts them there.
DETERMINERS = frozenset("a an the my your our their its".split())
PREPOSITIONS = frozenset("of at for with from into onto between during without within against among upon via per "
                         "to".split())
_AUX = frozenset("is are was were am be been will would can could shall should may might must do does did has have "
                 "had".split())
_SUBJECTS = frozenset("i he she we they i'm i'll i've i'd you're we're they're he's she's we'll they'll".split())
_NEGATIONS = frozenset("isn't aren't wasn't weren't don't doesn't didn't can't couldn't won't wouldn't shouldn't "
                       "haven't hasn't hadn't".split())
NOT_AFTER_DETERMINER = frozenset("""a an the my your our their of to and or but nor is are was were be been am in on
at by for with from into than that this these those it i me we us you he she they them it's that's there's""".split()
                                 ) | _SUBJECTS | _NEGATIONS
NOT_AFTER_PREPOSITION = PREPOSITIONS - {"at"} | _AUX | _SUBJECTS | _NEGATIONS | {"in", "on", "by"}   # "at least"
NOT_AFTER_TO = NOT_AFTER_PREPOSITION - frozenset("be been have do".split())
_I = frozenset("i i'm i'll i've i'd".split())    # capitals, yet no name after a preposition

# The checklist's own vocabulary: an answer that talks about words, lines and syllables is restating the task
INSTRUCTION_WORDS = frozenset("""constraint constraints criterion criteria checklist word words line lines sentence
sentences paragraph paragraphs character characters syllable syllables exactly least most output format formatted
bullet bullets mention mentions mentioned avoid avoids avoided""".split())
INSTRUCTION_MIN_DISTINCT = 4    # different checklist words before the share counts: one "at least" is English
ORDER_MIN_FAULTS = 3            # word-order faults before their share counts: one or two are typos
REPEAT_MIN = 3                  # uses of the top word before its share counts: in four words, each is a quarter
STRUCTURE_WORDS = 20            # words before the function-word rules apply: a haiku may do without them
WINDOW = 50                     # words per window of the moving type-token ratio
ECHO_N = 4                      # word n-grams compared with the echo text

FORMS = ("prose", "lines")
DEFAULTS = {"form": "prose", "min_words": 3, "min_letter_share": 0.6, "max_word_share": 0.34,
            "max_repeated_trigrams": 0.5, "max_repeated_lines": 0.5, "min_distinct": 0.35, "min_function_share": 0.05,
            "min_sentence_share": 0.25, "max_unit_words": 250, "max_word_order": 0.1, "max_instructions": 0.03,
            "echo": None, "max_echo": 0.5}
_LIMITS = set(DEFAULTS) - {"form", "echo"}

_TOKEN = re.compile(r"\w+(?:['’-]\w+)*")
_UNIT_END = re.compile(r"(?<=[.!?])\s+|\n")
_ABBREVIATION = re.compile(r"\b(?:[A-Za-z]\.){2,}|\b(?:e\.g|i\.e|etc|vs|mr|mrs|ms|dr|st|no)\.", re.I)
# a sentence ends at . ! or ? and whitespace; not at an ellipsis, nor inside a quote ("Wait!" she says.)
_SENTENCE_END = re.compile(r"(?:(?<=[^.]\.)|(?<=[!?]))\s+")


def words(text):
    """The text's words, lower-cased: tokens with a letter in them."""
    return [t for t in _TOKEN.findall(text.lower()) if any(c.isalpha() for c in t)]


def _mattr(ws):
    """Moving-average type-token ratio over windows of WINDOW words (the plain ratio for shorter texts)."""
    if len(ws) <= WINDOW:
        return len(set(ws)) / len(ws)
    counts = Counter(ws[:WINDOW])
    total = len(counts)
    for i in range(WINDOW, len(ws)):
        old = ws[i - WINDOW]
        counts[old] -= 1
        if not counts[old]:
            del counts[old]
        counts[ws[i]] += 1
        total += len(counts)
    return total / (len(ws) - WINDOW + 1) / WINDOW


def _word_order(text):
    """(faults, places): determiners followed by what cannot follow one or ending a sentence, prepositions followed
    by what cannot follow one, and sentences inside a line that start lower-case (only in a text with capitals at
    all: an all-lowercase haiku is lowercase by design)."""
    bad = places = 0
    caps = any(c.isupper() for c in text)
    for line in text.split("\n"):
        for k, sentence in enumerate(_SENTENCE_END.split(_ABBREVIATION.sub("x", line))):
            toks = [t for t in _TOKEN.findall(sentence) if any(c.isalpha() for c in t)]
            if k and caps and toks:
                places += 1
                bad += sentence.lstrip("\"“‘'([ ")[:1].islower()
            low = [t.lower().replace("’", "'") for t in toks] + [None]
            for i, w in enumerate(low[:-1]):
                nxt = low[i + 1]
                if w in DETERMINERS:
                    places += 1
                    bad += nxt is None or nxt in NOT_AFTER_DETERMINER
                elif w in PREPOSITIONS and nxt is not None and (not toks[i + 1][0].isupper() or nxt in _I):
                    places += 1
                    bad += nxt in (NOT_AFTER_TO if w == "to" else NOT_AFTER_PREPOSITION)
    return bad, places


@functools.lru_cache(maxsize=64)
def _ngrams(text):
    ws = words(text)
    return frozenset(zip(*(ws[i:] for i in range(ECHO_N))))


@functools.lru_cache(maxsize=256)
def measure(text, form="prose", echo=None):
    """The statistics the rules compare with their limits: {"words": n, ...}, only "words" when there are none."""
    ws = words(text)
    n = len(ws)
    if not n:
        return {"words": 0}
    content = Counter(w for w in ws if w not in FUNCTION_WORDS)
    top, top_n = content.most_common(1)[0] if content else ("", 0)
    trigrams = list(zip(ws, ws[1:], ws[2:]))
    lines = [key for key in (" ".join(words(line)) for line in text.split("\n")) if key]
    parts = text.split("\n") if form == "lines" else _UNIT_END.split(text)
    units = [u for u in (words(p) for p in parts) if u]
    real = sum(len(u) for u in units if len(u) >= 3 and any(w in FUNCTION_WORDS for w in u))
    bad, places = _word_order(text)
    said = [w for w in ws if w in INSTRUCTION_WORDS]
    ink = [c for c in text if not c.isspace()]
    m = {"words": n, "letter_share": sum(c.isalnum() for c in ink) / len(ink), "top_word": top,
         "word_share": top_n / n if top_n >= REPEAT_MIN else 0.0,
         "repeated_trigrams": 1 - len(set(trigrams)) / len(trigrams) if trigrams else 0.0,
         "repeated_lines": 1 - len(set(lines)) / len(lines) if lines else 0.0,
         "distinct": _mattr(ws), "unit_words": max(len(u) for u in units),
         "word_order": bad / places if bad >= ORDER_MIN_FAULTS else 0.0,
         "instructions": len(said) / n if len(set(said)) >= INSTRUCTION_MIN_DISTINCT else 0.0}
    if n >= STRUCTURE_WORDS:
        m["function_share"] = sum(w in FUNCTION_WORDS for w in ws) / n
        m["sentence_share"] = real / n
    if echo:
        grams = list(zip(*(ws[i:] for i in range(ECHO_N))))
        source = _ngrams(echo)
        m["echo"] = sum(g in source for g in grams) / len(grams) if grams else 0.0
    return m


_RULES = [  # (limit, statistic, a maximum?, a share?, how a failure reads)
    ("min_letter_share", "letter_share", False, True, "letters and digits are {value} of the characters"),
    ("max_word_share", "word_share", True, True, "the word {top!r} is {value} of the words"),
    ("max_repeated_trigrams", "repeated_trigrams", True, True, "{value} of the word trigrams repeat"),
    ("max_repeated_lines", "repeated_lines", True, True, "{value} of the lines repeat an earlier line"),
    ("min_distinct", "distinct", False, False, "distinct-word share {value}"),
    ("min_function_share", "function_share", False, True, "function words (the, of, is...) are {value} of the words"),
    ("min_sentence_share", "sentence_share", False, True, "{value} of the words stand in real sentences or lines"),
    ("max_unit_words", "unit_words", True, False, "a sentence or line of {value} words"),
    ("max_word_order", "word_order", True, True, "the word order is broken at {value} of the places it shows"),
    ("max_instructions", "instructions", True, True, "{value} of the words are the checklist's (words, lines, "
                                                     "exactly...): the task restated, not done"),
    ("max_echo", "echo", True, True, "{value} of the word 4-grams echo the task or its checklist"),
]


def _show(x, share):
    return f"{x:.0%}" if share else f"{x:g}" if isinstance(x, int) else f"{x:.2f}"


MAX_WRITING = 16384    # characters: the longest writing task (a cover letter, ~300 words) needs a tenth of it


def problems(text, check=None):
    """What makes `text` not writing under the limits of `check` (DEFAULTS for those it leaves out): short phrases,
    none when it reads as writing."""
    if len(text) > MAX_WRITING:     # no writing task asks for this much: fail it before measuring it
        return [f"{len(text)} characters (a writing answer has at most {MAX_WRITING})"]
    p = {**DEFAULTS, **(check or {})}
    m = measure(text, p["form"], p["echo"] or None)
    if m["words"] < max(1, p["min_words"] or 0):
        return [f"{m['words']} words (at least {max(1, p['min_words'] or 0)})"]
    out = []
    for limit, stat, is_max, share, how in _RULES:
        if p[limit] is None or stat not in m or ((m[stat] <= p[limit]) if is_max else (m[stat] >= p[limit])):
            continue
        out.append(how.format(value=_show(m[stat], share), top=m["top_word"][:30])
                   + f" ({'at most' if is_max else 'at least'} {_show(p[limit], share)})")
    return out


def check_natural(check, text):
    """(True | False | None, reason) of a `natural` check on the text (None: nothing found, under "veto")."""
    found = problems(text, check)
    if found:
        return False, "not writing: " + "; ".join(found)
    m = measure(text, check.get("form", "prose"), check.get("echo") or None)
    stats = f"{m['words']} words, distinct-word share {m['distinct']:.2f}"
    if check.get("veto"):
        return None, f"unchecked: nothing degenerate found ({stats}); whether it is good writing is the grader's"
    return True, f"reads as writing ({stats})"


def validate_natural(check):
    """Raise ValueError (one line) unless `check` is a well-formed natural check."""
    unknown = set(check) - set(DEFAULTS) - {"type", "target", "veto"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (known: {', '.join(DEFAULTS)}, veto)")
    if check.get("form", "prose") not in FORMS:
        raise ValueError(f"form {check['form']!r} unknown (one of {', '.join(FORMS)})")
    if not isinstance(check.get("veto", False), bool):
        raise ValueError("veto must be true or false")
    if not isinstance(check.get("echo", ""), (str, type(None))):
        raise ValueError("echo must be a string (the task's prompt and criteria texts: writing.echo_source)")
    for key in _LIMITS & set(check):
        value = check[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"{key} must be a non-negative number or null, got {value!r}")


def is_veto(check):
    """Whether the check is a writing veto: a natural check that only takes points away, and when it fails, takes
    away every point of its task's criteria reading target "writing" (minigrpo/judge/grader.py)."""
    return check.get("type") == "natural" and check.get("veto") is True


def reads_writing(check):
    """Whether some part of the check reads target "writing"."""
    return check.get("target") == "writing" or any(reads_writing(c) for c in check.get("checks", [])) \
        or ("check" in check and reads_writing(check["check"]))


def unpaid(check, answer):
    """Why a criterion whose check passed does not pay this answer after all ('' when it does). A blank answer pays
    no criterion: a "must not" check (not, a regex that must not match, banned phrases) passes on it, having
    nothing to find. A criterion reading target "writing" pays only an answer that passes DEFAULTS, whatever its
    check asks, must or must not: keyword stuffing, a word list, a repeated line, a shuffle, the task restated."""
    if not answer.strip():
        return "a blank answer pays no criterion"
    if reads_writing(check) and (found := problems(answer)):
        return "not writing: " + "; ".join(found)
    return ""


def echo_source(task):
    """The text a task's echo rule compares answers with: what the policy is shown (the prompt at turn 0, the
    criteria texts in the critique at turn 1)."""
    return task["prompt"] + "\n" + "\n".join(c["text"] for c in task["criteria"])
