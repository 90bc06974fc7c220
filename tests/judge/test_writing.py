"""The writing check (type "natural", minigrpo/judge/writing.py) rule by rule, and the two rules every criterion is held
to (checks.run_check -> writing.unpaid): a blank answer pays no criterion, and a criterion reading target "writing"
pays only writing, must or must not. Each rule fires on its own kind of degenerate text, is quiet on real writing,
and switched off lets its text through; the check is total and linear on any string."""

import json
import random
import time

import pytest

from minigrpo.judge import writing
from minigrpo.judge.checks import run_check, validate_check

STORY = ("The supply boat leaves a single envelope on the rocks, and Maren knows the handwriting before she reads "
         "her name. She opens the letter at the lamp table while the salt wind rattles the glass. The girl who wrote "
         "it asks about the city and the paintings, and whether Maren still hates the sea.")


def shuffled(text, seed):
    """The words of each line in a random order, the first and last kept (as bench/writing_table.py shuffles)."""
    rnd, out = random.Random(seed), []
    for line in text.split("\n"):
        ws = line.split()
        mid = ws[1:-1]
        rnd.shuffle(mid)
        out.append(" ".join(ws[:1] + mid + ws[-1:]) if len(ws) > 3 else line)
    return "\n".join(out)


def natural(**limits):
    return {"type": "natural", **limits}


# ----------------------------------------------------------------------------------------------------------------
# The natural check, rule by rule

# (rule, text that breaks it and that the rule alone is asked about)
DEGENERATE = [
    ("min_words", "letter"),
    ("min_letter_share", "w*\x14\ufffdJ\ufffd\x18y\x0fP\ufffd\ufffd r8\x16p\ufffd 1\ufffd\x14 the ##** a --"),  # byte soup
    ("max_word_share", "the rain, the rain, rain and rain on fans"),
    ("max_repeated_trigrams", "the fans hum on and on. " * 6),
    ("max_repeated_lines", "green lights blink for no one\n" * 4 + "a drive ticks, then rests"),
    ("min_distinct", " ".join(["salt letter sea keeper lamp"] * 12)),
    ("min_function_share", "salt letter lighthouse keeper envelope rocks handwriting lamp table wind glass girl "
                           "city husband paintings sea beam water logbook hands sheet wick"),
    ("min_sentence_share", "\n".join("salt letter keeper lamp sea rocks wind glass".split() * 3)),
    ("max_unit_words", " ".join(["the keeper reads a letter and the salt wind"] * 30)),
    ("max_word_order", shuffled(STORY, 1)),
    ("max_instructions", "Exactly 5 lines with at most 25 words per line, the syllables in each sentence, and no "
                         "bullet or heading: every criterion of the checklist is met here."),
    ("max_echo", "Write a micro-fiction story: a lighthouse keeper receives a letter she wrote to herself twenty "
                 "years ago."),
]
ECHO = "Write a micro-fiction story: a lighthouse keeper receives a letter she wrote to herself twenty years ago."


def only(rule, value):
    """A check asking about one rule alone (every other limit switched off)."""
    off = {k: None for k in writing.DEFAULTS if k not in ("form", "echo")}
    return natural(**{**off, rule: value, "echo": ECHO if rule == "max_echo" else None})


@pytest.mark.parametrize("rule,text", DEGENERATE, ids=[r for r, _ in DEGENERATE])
def test_each_rule_fails_its_degenerate_text(rule, text):
    limit = writing.DEFAULTS[rule] if rule != "max_echo" else 0.25
    assert run_check(only(rule, limit), text)[0] is False, writing.measure(text, "prose", ECHO)
    assert run_check(only(rule, None), text)[0] is True        # switched off, the rule lets it through


@pytest.mark.parametrize("rule", [r for r, _ in DEGENERATE])
def test_each_rule_passes_real_writing(rule):
    limit = writing.DEFAULTS[rule] if rule != "max_echo" else 0.25
    assert run_check(only(rule, limit), STORY)[0] is True


@pytest.mark.parametrize("text", ["“Wait!” she says. “Not yet.” The lamp... flickers, and then it steadies.",
                                  "the reports land at 3 a.m. and the racks hum. the fans spin. e.g. this one.",
                                  "winter fans hum on. green lights blink for no one now. a drive ticks, then rests.",
                                  "Could you send them to me by Friday? If they aren't in by then, I will write."])
def test_word_order_is_quiet_on_english(text):
    assert writing._word_order(text)[0] == 0      # quotes, ellipses, abbreviations, a lowercase poem, "in by"


def test_a_word_said_once_is_not_repeated():
    """In four words each is a quarter of them: the top word's share counts once it is used three times."""
    assert not writing.problems("Great\nReally\nAwesome\nDude", natural(max_word_share=0.15))
    assert writing.problems("Great\ngreat\nAwesome\ngreat", natural(max_word_share=0.15))


def test_veto_only_takes_points_away():
    assert run_check(natural(veto=True), STORY)[0] is None              # nothing found: left to the grader
    assert run_check(natural(veto=True), "rain " * 40)[0] is False
    assert run_check(natural(), STORY)[0] is True


@pytest.mark.parametrize("bad,match", [
    (natural(form="verse"), "form"), (natural(max_words=3), "unknown keys"), (natural(min_distinct=-1), "non-negative"),
    (natural(max_echo=True), "non-negative"), (natural(echo=["x"]), "echo"), (natural(veto="yes"), "veto"),
    ({"type": "regex", "pattern": "x", "target": "prose"}, "target"),
])
def test_validate_natural(bad, match):
    validate_check(natural(form="lines", veto=True, echo="x", max_echo=None, min_words=5))
    with pytest.raises(ValueError, match=match) as e:
        validate_check({"type": "not", "check": bad})
    assert "\n" not in str(e.value) and str(e.value).startswith("check.check: ")


def test_natural_is_total_and_linear():
    rnd = random.Random(0)
    pieces = ["a", "the", " ", "\n", ".", "!", "?", "…", "“", "’", "x", "I'm", "of", "to", "-", "1", "é", "\x00"]
    for _ in range(3000):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 30)))
        assert run_check(natural(echo=text[:9], veto=bool(len(text) % 2)), text)[0] in (True, False, None)
    for text in ["the " * 16000, "a\n" * 32000, "x. " * 21000, " ".join(str(i) for i in range(12000)),
                 "".join(chr(0x4E00 + i % 500) for i in range(65000))]:
        writing.measure.cache_clear()
        t0 = time.thread_time()
        assert run_check(natural(echo=STORY), text)[0] in (True, False)
        assert time.thread_time() - t0 < 1.0
    passed, reason = run_check(natural(), "x " * 35000)                   # over MAX_TEXT: fails, never raises
    assert passed is False and "text checks read at most" in reason


# ----------------------------------------------------------------------------------------------------------------
# The two rules of every criterion (checks.run_check -> writing.unpaid)

MUST_NOT = [{"type": "regex", "pattern": "!", "must": False}, {"type": "contains", "none": ["very"]},
            {"type": "not", "check": {"type": "contains", "any": ["sorry"]}},
            {"type": "count", "unit": "words", "max": 100},
            {"type": "all", "checks": [{"type": "regex", "pattern": "^#", "flags": "m", "must": False}]}]


@pytest.mark.parametrize("check", MUST_NOT, ids=lambda c: c["type"])
def test_a_blank_answer_pays_no_criterion(check):
    for blank in ("", " ", "\n\n\t "):
        passed, reason = run_check(check, blank)
        assert passed is False and reason.startswith("a blank answer pays no criterion"), reason
    assert run_check(check, "ok")[0] is True                        # plain text: one word still passes a "must not"


@pytest.mark.parametrize("check", MUST_NOT, ids=lambda c: c["type"])
def test_a_must_not_on_writing_pays_only_writing(check):
    def writing_(c):
        c = json.loads(json.dumps(c))
        for leaf in [c, *c.get("checks", []), *([c["check"]] if "check" in c else [])]:
            leaf["target"] = "writing"
        return c
    for degenerate in ("rain rain rain rain rain fans fans fans", "letter", shuffled(STORY, 1),
                       "\n".join("salt letter keeper lamp sea rocks wind glass".split() * 3)):
        passed, reason = run_check(writing_(check), degenerate)
        assert passed is False and reason.startswith("not writing: "), (degenerate, reason)
    assert run_check(writing_(check), "The keeper reads it twice, and smiles at the sea.")[0] is True


def test_not_cannot_turn_the_gate_around():
    inner = {"type": "regex", "pattern": "salt", "target": "writing"}
    for check in ({"type": "not", "check": inner}, {"type": "not", "check": {"type": "not", "check": inner}},
                  {"type": "any", "checks": [{"type": "not", "check": inner}, inner]}):
        assert run_check(check, "rain rain rain rain rain rain")[0] is False
