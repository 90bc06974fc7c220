"""Terminal exercises on files and text: find, count, rename, extract, sort. Each verifier's expectation is
computed here from the exercise's own files, never typed in."""

import random
import re
import stat

from minigrpo.tasks.terminal.exercise import Exercise, Transcript as T
from minigrpo.tasks.terminal.verify import as_given, lines_are, names_only, number_is

EXERCISES = []


def _add(**kw):
    EXERCISES.append(Exercise(category="files-and-text", **kw))


# --- count the ERROR lines: a level field, and "error" in some messages -----------------------------------------------

def _app_log():
    rng = random.Random(7)
    msgs = ["request served", "cache miss", "connection error, retrying", "slow query", "user login",
            "disk quota near", "timeout error from upstream", "job finished"]
    return "".join(f"2024-05-{1 + i // 40:02d} 10:{i % 60:02d}:{i % 7:02d} "
                   f"{rng.choice(['INFO'] * 6 + ['WARN'] * 2 + ['ERROR'])} worker-{rng.randint(1, 4)}: "
                   f"{rng.choice(msgs)}\n" for i in range(240))


_LOG = _app_log()
_ERRORS = sum(line.split()[2] == "ERROR" for line in _LOG.splitlines())
_add(id="count-error-lines",
     instruction="How many lines of logs/app.log have the level ERROR (the third field of the line)? "
                 "Finish your answer with the number.",
     files={"logs/app.log": _LOG},
     verify=lambda f, a: number_is(a, _ERRORS),
     reference=T(("head -3 logs/app.log", "awk '$3 == \"ERROR\"' logs/app.log | wc -l"),
                 f"{_ERRORS} lines have the level ERROR."),
     wrong=T(("grep -ci error logs/app.log",),
             f"{sum('error' in line.lower() for line in _LOG.splitlines())} lines."))

# --- the largest file: bytes, not lines -------------------------------------------------------------------------------

_SIZES = {"data/a/notes.txt": "x\n" * 900, "data/a/blob.bin": "B" * 2500, "data/b/list.csv": "1,2\n" * 500,
          "data/b/c/dump.json": "{}" * 1100, "data/readme.md": "hello\n" * 50}
_BIGGEST = max(_SIZES, key=lambda p: len(_SIZES[p]))
_add(id="largest-file",
     instruction="Which file under data/ (at any depth) is the largest in bytes? Finish your answer with its path.",
     files=_SIZES,
     verify=lambda f, a: names_only(a, _BIGGEST, list(_SIZES)),        # its path, not its name alone
     reference=T(("find data -type f -printf '%s %p\\n' | sort -n | tail -1",), f"The largest is {_BIGGEST}."),
     wrong=T(("find data -type f | xargs wc -l | sort -n",), "The largest is data/a/notes.txt."))

# --- rename .txt to .md in one folder, names with spaces, a subfolder left alone --------------------------------------

_NOTES = {"notes/todo.txt": "buy milk\n", "notes/meeting notes.txt": "10:00 standup\n", "notes/ideas.txt": "x\n",
          "notes/keep.txt.bak": "old\n", "notes/draw.svg": "<svg/>\n", "notes/archive/2023.txt": "gone\n"}


def _renamed(f, a):
    want = {(p[:-4] + ".md" if p.endswith(".txt") and p.count("/") == 1 else p): c for p, c in _NOTES.items()}
    return 1.0 if as_given(f, want, "notes") else 0.0      # names, contents and modes


_add(id="rename-txt-to-md",
     instruction="Rename every file directly in notes/ whose name ends in .txt so that it ends in .md instead "
                 "(todo.txt becomes todo.md). Leave every other file as it is, files in notes/archive/ included.",
     files=_NOTES, verify=_renamed,
     reference=T(("ls -R notes", "cd notes && for f in *.txt; do mv -- \"$f\" \"${f%.txt}.md\"; done && ls"),),
     wrong=T(("find notes -name '*.txt' | while read -r f; do mv \"$f\" \"${f%.txt}.md\"; done",),))

# --- distinct e-mail addresses, lower-cased and sorted ----------------------------------------------------------------

_MAILS = {"inbox/1.eml": "From: Ana Diaz <ana@example.org>\nTo: team@corp.example\n\nPing Bob@Example.org please.\n",
          "inbox/2.eml": "From: bob@example.org\nTo: ana@example.org\nCc: Lee <lee.k@mail.example.net>\n\nok\n",
          "inbox/3.eml": "From: TEAM@corp.example\nTo: ana@example.org\n\nNew address: zoe+news@mail.example.net\n",
          "inbox/notes.txt": "not mail: nobody at example dot org\n"}
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
_ADDRESSES = sorted({m.lower() for text in _MAILS.values() for m in _EMAIL.findall(text)})
_add(id="distinct-emails",
     instruction="Write every distinct e-mail address that appears anywhere in the files of inbox/ to emails.txt: "
                 "one per line, in lower case, sorted, each once.",
     files=_MAILS, verify=lambda f, a: lines_are(f, "emails.txt", _ADDRESSES),
     reference=T(("grep -rhoE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}' inbox | tr A-Z a-z | sort -u "
                  "> emails.txt", "cat emails.txt"),),
     wrong=T(("grep -rhoE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}' inbox | sort -u > emails.txt",),))

# --- unique lines in order of first appearance (not sort -u) ----------------------------------------------------------

_NAMES = "\n".join(["mia", "liam", "ava", "mia", "noah", "ava", "emma", "liam", "zoe", "mia", "ben"]) + "\n"
_FIRST = list(dict.fromkeys(_NAMES.split()))
_add(id="unique-in-order",
     instruction="names.txt has repeated lines. Write unique.txt holding each distinct line of names.txt once, "
                 "in the order of its first appearance.",
     files={"names.txt": _NAMES}, verify=lambda f, a: lines_are(f, "unique.txt", _FIRST),
     reference=T(("awk '!seen[$0]++' names.txt > unique.txt", "cat unique.txt"),),
     wrong=T(("sort -u names.txt > unique.txt",),))

# --- replace a host name in a whole tree ------------------------------------------------------------------------------

_CONF = {"config/app.conf": "host = old.example.com\nbackup = old.example.com, old.example.com\n",
         "config/db/replica.conf": "primary = old.example.com:5432\n",
         "config/notes.md": "We moved off old-example-com and oldXexampleYcom long ago.\n",
         "config/proxy/rules/edge.conf": "upstream old.example.com;\n"}


def _replaced(f, a):
    want = {p: c.replace("old.example.com", "new.example.com") for p, c in _CONF.items()}
    return 1.0 if as_given(f, want, "config") else 0.0


_add(id="replace-hostname",
     instruction="Replace every occurrence of old.example.com with new.example.com in every file under config/ "
                 "(subfolders included). Change nothing else.",
     files=_CONF, verify=_replaced,
     reference=T(("grep -rl 'old\\.example\\.com' config | xargs sed -i 's/old\\.example\\.com/new.example.com/g'",
                  "grep -rn example config"),),
     wrong=T(("sed -i 's/old.example.com/new.example.com/' config/*.conf",),))

# --- which file names the codename, in capitals, as a word ------------------------------------------------------------

_DOCS = {"docs/a-intro.md": "Project bluebird started as a side project.\n",
         "docs/b-plan.md": "The BLUEBIRDS list is archived.\n",
         "docs/c-release.md": "Release train: BLUEBIRD ships in May.\n",
         "docs/d-faq.md": "Nothing here about birds.\n"}
_CODENAME = next(p for p, c in _DOCS.items() if re.search(r"\bBLUEBIRD\b", c))
_add(id="find-codename",
     instruction="One file under docs/ mentions the codename BLUEBIRD (in capitals, as a whole word). Which one? "
                 "Finish your answer with its path.",
     files=_DOCS, verify=lambda f, a: names_only(a, _CODENAME, list(_DOCS)),
     reference=T(("grep -rlw BLUEBIRD docs",), f"It is {_CODENAME}."),
     wrong=T(("grep -rli bluebird docs | head -1",), "It is docs/a-intro.md."))

# --- the most frequent word, case-insensitively -----------------------------------------------------------------------


def _story():
    rng = random.Random(3)
    words = ["river"] * 12 + ["stone"] * 7 + ["Stone"] * 7 + ["fox", "moon", "reed", "path"] * 4 + ["owl"] * 5
    rng.shuffle(words)
    return "\n".join(" ".join(words[i:i + 8]) + "." for i in range(0, len(words), 8)) + "\n"


_STORY = _story()
_COUNTS = {}
for _w in re.findall(r"[A-Za-z]+", _STORY):
    _COUNTS[_w.lower()] = _COUNTS.get(_w.lower(), 0) + 1
_TOP = max(_COUNTS, key=_COUNTS.get)
_add(id="most-frequent-word",
     instruction="Which word occurs most often in story.txt? Count case-insensitively (Stone and stone are one "
                 "word); a word is a run of letters. Finish your answer with the word in lower case.",
     files={"story.txt": _STORY}, verify=lambda f, a: names_only(a.lower(), _TOP, list(_COUNTS)),
     reference=T(("tr -cs 'A-Za-z' '\\n' < story.txt | tr A-Z a-z | sort | uniq -c | sort -rn | head -3",),
                 f"The most frequent word is {_TOP}."),
     wrong=T(("tr -cs 'A-Za-z' '\\n' < story.txt | sort | uniq -c | sort -rn | head -1",),
             "The most frequent word is river."))

# --- delete empty files, keep empty folders ---------------------------------------------------------------------------

_TMP = {"tmpdata/a.log": "", "tmpdata/b.log": "data\n", "tmpdata/space.txt": " \n", "tmpdata/x/y/empty.dat": "",
        "tmpdata/x/keep.dat": "1\n"}
_KEPT = sorted(p for p, c in _TMP.items() if c)
_DIRS = ["tmpdata/cache", "tmpdata/cache/old", "tmpdata/x", "tmpdata/x/y"]
_add(id="delete-empty-files",
     instruction="Delete every empty (0-byte) file under tmpdata/, at any depth. Keep every other file and every "
                 "folder, even the empty ones.",
     files=_TMP, setup="mkdir -p tmpdata/cache/old",
     verify=lambda f, a: 1.0 if f.files("tmpdata") == _KEPT and f.folders("tmpdata") == _DIRS
     and all(f.text(p) == _TMP[p] for p in _KEPT) else 0.0,
     reference=T(("find tmpdata -type f -empty -print -delete",),),
     wrong=T(("find tmpdata -empty -delete",),))

# --- an INI value from the right section ------------------------------------------------------------------------------

_INI = "[server]\nhost = 0.0.0.0\nport = 8080\n\n[database]\nuser = app\nport = 5432\n\n[cache]\nport = 6379\n"
_add(id="ini-section-value",
     instruction="What is the port of the [database] section of settings.ini? Finish your answer with the number.",
     files={"settings.ini": _INI}, verify=lambda f, a: number_is(a, 5432),
     reference=T(("awk -F' *= *' '/^\\[/{s=$0} s==\"[database]\" && $1==\"port\"{print $2}' settings.ini",),
                 "The database port is 5432."),
     wrong=T(("grep port settings.ini | head -1",), "The port is 8080."))

# --- make the .sh files executable, and nothing else ------------------------------------------------------------------

_BIN = {"bin/build.sh": "#!/bin/sh\necho build\n", "bin/deploy.sh": "#!/bin/sh\necho deploy\n",
        "bin/README.txt": "scripts\n", "bin/lib/helpers.sh": "#!/bin/sh\necho help\n", "bin/lib/data.csv": "a\n"}
_SCRIPTS = sorted(p for p in _BIN if p.endswith(".sh"))


def _executable_scripts(f, a):
    # the whole mode, not one bit of it: a script runs for its owner only if the owner may read it (the shell
    # reads it) and execute it; "no other file executable" means by no one, group and others included
    if f.files("bin") != sorted(_BIN) or any(f.text(p) != c for p, c in _BIN.items()):
        return 0.0
    runs = all(stat.S_IMODE(f.mode(p)) & 0o500 == 0o500 for p in _SCRIPTS)
    others = any(stat.S_IMODE(f.mode(p)) & 0o111 for p in _BIN if p not in _SCRIPTS)
    return 1.0 if runs and not others else 0.0


_add(id="make-scripts-executable",
     instruction="Make every file under bin/ (at any depth) whose name ends in .sh executable. No other file may "
                 "become executable.",
     files=_BIN, verify=_executable_scripts,
     reference=T(("find bin -type f -name '*.sh' -exec chmod +x {} +", "ls -lR bin"),),
     wrong=T(("chmod +x bin/*",),))

# --- count .py files, leaving a vendored folder out -------------------------------------------------------------------

_SRC = {"src/app.py": "", "src/util.py": "", "src/pkg/__init__.py": "", "src/pkg/core.py": "", "src/pkg/core.pyc": "",
        "src/pkg/setup.py.orig": "", "src/vendor/six.py": "", "src/vendor/lib/attr.py": "", "src/tests/test_app.py": ""}
_PY = sum(p.endswith(".py") and not p.startswith("src/vendor/") for p in _SRC)
_add(id="count-python-files",
     instruction="How many files ending in .py are there under src/, at any depth, leaving out everything under "
                 "src/vendor/? Finish your answer with the number.",
     files=_SRC, verify=lambda f, a: number_is(a, _PY),
     reference=T(("find src -path src/vendor -prune -o -type f -name '*.py' -print | wc -l",),
                 f"There are {_PY} such files."),
     wrong=T(("find src -name '*.py' | wc -l",), f"There are {sum(p.endswith('.py') for p in _SRC)}."))

# --- top three scores: a numeric sort, not a text one -----------------------------------------------------------------

_SCORES = {"ana": 9, "ben": 87, "cai": 100, "dee": 12, "eli": 95, "fay": 8, "gus": 101}
_TOP3 = sorted(_SCORES, key=_SCORES.get, reverse=True)[:3]
_add(id="top-three-scores",
     instruction="scores.txt has one `name score` pair per line. Write top3.txt with the names of the three "
                 "highest scores, highest first, one name per line.",
     files={"scores.txt": "".join(f"{n} {s}\n" for n, s in _SCORES.items())},
     verify=lambda f, a: lines_are(f, "top3.txt", _TOP3),
     reference=T(("sort -k2,2nr scores.txt | head -3 | cut -d' ' -f1 > top3.txt", "cat top3.txt"),),
     wrong=T(("sort -k2 -r scores.txt | head -3 | cut -d' ' -f1 > top3.txt",),))

# --- lines of one hour of a log ---------------------------------------------------------------------------------------

_SERVER = "".join(f"2024-06-01 {h:02d}:{m:02d}:{m:02d} GET /p{h}{m}\n" for h in (8, 9, 10, 11) for m in (5, 10, 59))
_HOUR = [line for line in _SERVER.splitlines() if line.split()[1].startswith("10:")]
_add(id="log-hour-window",
     instruction="Copy the lines of server.log whose time (the second field) lies from 10:00:00 to 10:59:59 into "
                 "window.log, in their order.",
     files={"server.log": _SERVER}, verify=lambda f, a: lines_are(f, "window.log", _HOUR),
     reference=T(("awk '$2 >= \"10:00:00\" && $2 <= \"10:59:59\"' server.log > window.log", "cat window.log"),),
     wrong=T(("grep '10:' server.log > window.log",),))
