"""A seventh red team against the terminal verifiers: work that does what the exercise asks and also what it says
not to do, or leaves a file in a form the exercise's tools do not read as asked. Each attack scored 1.0, as the
honest transcript does; each now scores 0, and the honest variant beside it still 1.0.

  tests changed     "fix the package, not the tests" / "do not change the tests": the verifier called the package
                    on hidden inputs and never looked at the tests, so a fix that also deleted the tests, or edited
                    them to match a wrong value, was paid in full.
  modes             "leave every other file as it is", "change nothing else", "do not edit anything under
                    input/ and tools/", "not the tests": names and contents were compared, modes not (the given
                    files started with the host's umask, so no verifier knew their mode): `chmod -R 777`, `chmod
                    000`, a setuid bit passed. Every given file now starts 0644 (episode.FILE_MODE) and these
                    verifiers ask that it keeps it. "Keep every other file" (delete-empty-files) and the checksum
                    manifest ask nothing of a mode, and their verifiers still read none.
  lines             "one per line" read with Python's splitlines(), which also splits at \\v, \\f, \\r, \\x1c-\\x1e,
                    \\x85 and \\u2028: a file of one line (`wc -l`: 0) passed as the lines asked for; so did a
                    committed notes.txt read by `git show`.
"""

import pytest

from terminal_runs import TerminalTask, play

TASK = TerminalTask()


def score(exercise_id, commands, answer="Done."):
    env = TASK.env({"id": exercise_id})
    try:
        final, _ = play(env, commands, answer)
    finally:
        env.close()
    return final.score


FIX_WORDS = "sed -i 's/len(text.split(\" \"))/len(text.split())/' textstats/__init__.py"
MEDIAN = ("cat >> stats/__init__.py <<'EOF'\n\ndef median(values):\n    s = sorted(values)\n    mid = len(s) // 2\n"
          "    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2\nEOF")
FIX_SHAPES = ("mv shapes/rectangel.py shapes/rectangle.py && sed -i 's/return w \\* w/return w * h/' "
              "shapes/rectangle.py")
RENAME = "cd notes && for f in *.txt; do mv -- \"$f\" \"${f%.txt}.md\"; done"
REPLACE = "grep -rl 'old\\.example\\.com' config | xargs sed -i 's/old\\.example\\.com/new.example.com/g'"
FIX_RUNNER = "sed -i 's#data/sales.csv#input/sales.csv#' run.sh"
EMAILS = "grep -rhoE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}' inbox | tr A-Z a-z | sort -u"

# (exercise, commands): each scored 1.0 before this round
ATTACKS = {
    "word-count-deletes-the-tests": ("package-word-count", [FIX_WORDS + " && rm -r tests"]),
    "word-count-empties-the-tests": ("package-word-count", [FIX_WORDS + " && echo 'import unittest' > "
                                                            "tests/test_textstats.py"]),
    "median-edits-a-test": ("package-add-median", [MEDIAN, "sed -i 's/2.5)/3)/' tests/test_stats.py"]),
    "shapes-deletes-the-tests": ("package-shapes-import", [FIX_SHAPES + " && rm -r tests"]),
    "rename-chmod-777": ("rename-txt-to-md", [RENAME + " && chmod -R 777 ."]),
    "replace-chmod-000": ("replace-hostname", [REPLACE + " && chmod 000 config/notes.md"]),
    "replace-setuid": ("replace-hostname", [REPLACE + " && chmod 4644 config/app.conf"]),
    "runner-chmod-input": ("fix-runner-path", [FIX_RUNNER + " && chmod 000 input/sales.csv"]),
    "emails-vertical-tabs": ("distinct-emails", [EMAILS + " | tr '\\n' '\\v' > emails.txt"]),
    "emails-record-separators": ("distinct-emails", [EMAILS + " | tr '\\n' '\\036' > emails.txt"]),
    "commit-vertical-tabs": ("git-commit-all", ["cd repo && printf 'a\\vb\\vc\\n' > notes.txt && git add -A && "
                                                "git commit -q -m 'Add todo list'"]),
    "window-carriage-returns": ("log-hour-window", ["awk '$2 >= \"10:00:00\" && $2 <= \"10:59:59\"' server.log "
                                                    "| tr '\\n' '\\r' > window.log"]),
}

HONEST = {
    "word-count-runs-the-tests": ("package-word-count", [FIX_WORDS + " && python3 -m unittest discover -s tests"]),
    "median-adds-a-test-file": ("package-add-median", [MEDIAN, "echo 'import unittest' > tests/test_more.py"]),
    "shapes": ("package-shapes-import", [FIX_SHAPES]),
    "rename": ("rename-txt-to-md", [RENAME]),
    "replace-with-python": ("replace-hostname", [  # a rewrite in place keeps the file's mode, as sed -i does
        "python3 -c \"import pathlib; [p.write_text(p.read_text().replace('old.example.com', 'new.example.com')) "
        "for p in pathlib.Path('config').rglob('*') if p.is_file()]\""]),
    "delete-empty-then-chmod": ("delete-empty-files", ["find tmpdata -type f -empty -delete && chmod 600 "
                                                       "tmpdata/b.log"]),      # "keep" asks nothing of a mode
    "runner": ("fix-runner-path", [FIX_RUNNER]),
    "emails-crlf": ("distinct-emails", [EMAILS + " | sed 's/$/\\r/' > emails.txt"]),    # trailing space aside
    "window-no-final-newline": ("log-hour-window", ["awk '$2 >= \"10:00:00\" && $2 <= \"10:59:59\"' server.log "
                                                    "| head -c -1 > window.log"]),
}


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_doing_what_the_exercise_forbids_or_a_line_that_is_not_a_line_scores_0(case):
    exercise, commands = ATTACKS[case]
    assert score(exercise, commands) == 0.0


@pytest.mark.parametrize("case", sorted(HONEST))
def test_the_honest_variants_still_score_1(case):
    exercise, commands = HONEST[case]
    assert score(exercise, commands) == 1.0
