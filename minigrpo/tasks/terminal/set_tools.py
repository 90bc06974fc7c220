"""Terminal exercises on tools: checksums, openssl, an encoded archive, and git in a scratch repository. A git
repository is the agent's data but also git's configuration (hooks, fsmonitor, aliases...): the verifier reads it
with git in verify.probe's sandbox, from a copy that holds only the repository's objects, refs and work tree
under a configuration of the verifier's own."""

import base64
import calendar
import gzip
import hashlib
import hmac
import re
import secrets

from minigrpo.tasks.terminal.exercise import Exercise, Transcript as T
from minigrpo.tasks.terminal.verify import MAX_ANSWER, last_digest, names_only, probe, text_lines

EXERCISES = []


def _add(**kw):
    EXERCISES.append(Exercise(**kw))


def _sha(data):
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


# --- which download fails its checksum -----------------------------------------------------------------------------

_DOWNLOADS = {"downloads/alpha.tar": "alpha release\n" * 40, "downloads/beta.tar": "beta release\n" * 35,
              "downloads/gamma.tar": "gamma release\n" * 30, "downloads/delta.tar": "delta release\n" * 25}
_BROKEN = "downloads/gamma.tar"
_SUMS = "".join(f"{_sha(c if p != _BROKEN else c + 'original tail')}  {p.split('/')[1]}\n"
                for p, c in _DOWNLOADS.items())     # gamma.tar's line is the sum of other bytes
_add(id="checksum-mismatch", category="checksums", needs=("sha256sum",),
     instruction="Exactly one file in downloads/ does not match its checksum in downloads/SHA256SUMS. Which one? "
                 "Finish your answer with its file name.",
     files={**_DOWNLOADS, "downloads/SHA256SUMS": _SUMS},
     verify=lambda f, a: names_only(a, "gamma.tar", [p.split("/")[1] for p in _DOWNLOADS]),
     reference=T(("cd downloads && sha256sum -c SHA256SUMS",), "gamma.tar does not match: gamma.tar FAILED."),
     wrong=T(("cd downloads && ls -S | head -1",), "The corrupted file is alpha.tar."))

# --- a manifest sha256sum -c accepts --------------------------------------------------------------------------------

_RELEASE = {"release/app.bin": "\x7fELF fake binary\n", "release/notes.txt": "v1.2\n", "release/logo.svg": "<svg/>\n",
            "release/config.json": "{}\n"}


def _manifest(f, a):
    # the files' contents, not their modes: the manifest's hashes read only the bytes, and the exercise asks
    # nothing of a mode
    unchanged = all(f.text(p) == c for p, c in _RELEASE.items()) and f.files("release") == sorted(_RELEASE)
    want = [f"{_sha(c)}  {p}" for p, c in sorted(_RELEASE.items())]
    got = f.lines("release.sha256")
    return 1.0 if unchanged and got is not None and [g.rstrip() for g in got] == want else 0.0


_add(id="checksum-manifest", category="checksums", needs=("sha256sum",),
     instruction="Write release.sha256: the SHA-256 checksums of every file in release/, in the format sha256sum "
                 "prints (`HASH  release/NAME`), one line per file, sorted by name, so that `sha256sum -c "
                 "release.sha256` passes from this folder.",
     files=_RELEASE, verify=_manifest,
     reference=T(("sha256sum release/* > release.sha256", "sha256sum -c release.sha256"),),
     wrong=T(("cd release && sha256sum * > ../release.sha256",),))

# --- openssl: decrypt with the right key derivation ----------------------------------------------------------------

_SECRET = "The vault code is 7731-ALPHA.\nKeep it safe.\n"
_add(id="openssl-decrypt", category="openssl", needs=("openssl",),
     instruction="secret.enc was encrypted with `openssl enc -aes-256-cbc -pbkdf2`, with the password in pass.txt. "
                 "Decrypt it into secret.txt.",
     files={"plain.tmp": _SECRET, "pass.txt": "correct horse battery\n"},
     setup="openssl enc -aes-256-cbc -pbkdf2 -salt -pass file:pass.txt -in plain.tmp -out secret.enc && rm plain.tmp",
     verify=lambda f, a: 1.0 if f.text("secret.txt") == _SECRET else 0.0,
     reference=T(("openssl enc -d -aes-256-cbc -pbkdf2 -pass file:pass.txt -in secret.enc -out secret.txt",
                  "cat secret.txt"),),
     wrong=T(("openssl enc -d -aes-256-cbc -pass file:pass.txt -in secret.enc -out secret.txt",),))

# --- openssl: an HMAC -----------------------------------------------------------------------------------------------

_MESSAGE, _KEY = "amount=120.00&to=acct-7\n", "s3cr3t-k3y"
_MAC = hmac.new(_KEY.encode(), _MESSAGE.encode(), hashlib.sha256).hexdigest()
_add(id="openssl-hmac", category="openssl", needs=("openssl",),
     instruction="Compute the HMAC-SHA256 of the exact bytes of message.txt, with the key written on the first "
                 "line of key.txt (without its newline). Finish your answer with the hex digest.",
     files={"message.txt": _MESSAGE, "key.txt": _KEY + "\n"},
     verify=lambda f, a: 1.0 if last_digest(a) == _MAC else 0.0,
     reference=T(("openssl dgst -sha256 -hmac \"$(head -1 key.txt)\" message.txt",), f"The HMAC is {_MAC}."),
     wrong=T(("sha256sum message.txt",), f"The HMAC is {_sha(_MESSAGE)}."))

# --- an encoded, compressed payload and a decoy -------------------------------------------------------------------

_CODE = "QX-4821"
_PAYLOAD = base64.encodebytes(gzip.compress(f"header\ncode: {_CODE}\nfooter\n".encode(), mtime=0)).decode()
_CODE_RE = re.compile(r"(?<![A-Z0-9-])[A-Z]{2}-\d{4}(?![0-9])")


def _code_is(answer):
    found = _CODE_RE.findall(answer[:MAX_ANSWER])
    return 1.0 if found and found[-1] == _CODE else 0.0


_add(id="decode-payload", category="files-and-text", needs=("base64", "gunzip"),
     instruction="payload.b64 holds a base64-encoded gzip file. What is the code on its `code:` line, once decoded? "
                 "Finish your answer with the code.",
     files={"payload.b64": _PAYLOAD, "README": "The payload carries one code line (example: code: AB-0000).\n"},
     verify=lambda f, a: _code_is(a),
     reference=T(("base64 -d payload.b64 | gunzip | grep 'code:'",), f"The code is {_CODE}."),
     wrong=T(("grep -r 'code:' .",), "The code is AB-0000."))

# --- git ------------------------------------------------------------------------------------------------------------

_AUTHOR = "Sam Doe <sam@example.org>"
# sha1 named: _commit_ids computes the ids as a sha1 repository's, whatever a newer git's default format
_GIT_INIT = ("git init -q --object-format=sha1 repo && cd repo && git symbolic-ref HEAD refs/heads/main && "
             "git config user.name 'Sam Doe' && git config user.email sam@example.org && ")


def _commits(steps):
    """Setup commands making one commit per (files {name: text}, subject), the n-th dated 2024-01-0n 10:00 UTC."""
    out = []
    for i, (files, subject) in enumerate(steps):
        if any("'" in x for x in [*files.values(), subject]):
            raise ValueError(f"terminal git setup {subject!r}: a single quote would end the shell's string")
        date = f"2024-01-0{i + 1}T10:00:00Z"
        writes = " && ".join(f"printf '%s' '{text}' > {name}" for name, text in files.items())
        out.append(f"{{ export GIT_AUTHOR_DATE={date} GIT_COMMITTER_DATE={date}; {writes} && git add -A && "
                   f"git commit -q -m '{subject}'; }}")
    return " && ".join(out)


def _object(kind, data):
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data).hexdigest()


def _commit_ids(steps):
    """The ids of the commits _commits(steps) makes, oldest first, computed as git does: its objects are named by
    their content, and the author, dates and files are fixed, so the setup's history is known before it runs. A
    history the agent rewrote and re-made has other ids, however alike its subjects and files."""
    tree, parent, ids = {}, None, []
    for i, (files, subject) in enumerate(steps):
        tree.update(files)
        entries = b"".join(b"100644 " + name.encode() + b"\0" + bytes.fromhex(_object("blob", text.encode()))
                           for name, text in sorted(tree.items()))
        who = f"{_AUTHOR} {calendar.timegm((2024, 1, i + 1, 10, 0, 0))} +0000"
        body = f"tree {_object('tree', entries)}\n" + (f"parent {parent}\n" if parent else "") + \
            f"author {who}\ncommitter {who}\n\n{subject}\n"
        parent = _object("commit", body.encode())
        ids.append(parent)
    return ids


_GIT_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
# no replacement refs, hooks, fsmonitor program or untracked cache; submodules neither recursed into nor summed up
_GIT_OPTIONS = ("--no-replace-objects -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.untrackedCache=false "
                "-c submodule.recurse=false -c status.submoduleSummary=false")


def _in_repo(name):
    # the work tree, and of .git only the history's data: HEAD, the index, refs and objects. Nothing git would read
    # as settings or run (config, hooks/, info/, commondir and gitdir pointers, objects/info/ alternates) comes
    # across; the config is the verifier's own (_git's extra). A .git that is a file (a gitdir pointer) is left out,
    # and so is every .git below the repository's own (a nested repository's settings and programs).
    if not name.startswith("repo/") or name == "repo/.git" or ".git" in name.split("/")[2:]:
        return False
    if not name.startswith("repo/.git/"):
        return True
    rest = name[len("repo/.git/"):]
    return rest in ("HEAD", "index", "packed-refs") or \
        (rest.startswith(("objects/", "refs/")) and not rest.startswith("objects/info/"))


def _git(folder, *queries):
    """The outputs of the git `queries` (argument strings), run in repo/ in the probe's sandbox; None when any
    query fails. Sections are split by a fresh random marker, which no commit message the agent wrote can know."""
    mark = secrets.token_hex(16)
    # refs/ and objects/ may be empty folders (git gc packs them), which a copy of files alone would not make
    script = "cd repo && mkdir -p .git/refs .git/objects && export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null" \
        + "".join(f" && echo {mark} && git {_GIT_OPTIONS} {q} 2>/dev/null" for q in queries)
    r = probe(folder, script, take=_in_repo, extra={"repo/.git/config": _GIT_CONFIG})
    parts = r.output.split(mark + "\n")
    if r.exit_code != 0 or len(parts) != len(queries) + 1:
        return None
    return [text_lines(p) for p in parts[1:]]


_HISTORY = [({"notes.txt": "a\n"}, "Start notes"), ({"notes.txt": "a\nb\n"}, "Add b")]
_HISTORY_IDS = _commit_ids(_HISTORY)


def _committed(f, a):
    # the new commit on top of the setup's own two (their ids), with the changes and nothing left over
    got = _git(f, "log --format=%H%n%s", "status --porcelain", "show --name-only --format= HEAD",
               "show HEAD:notes.txt", "show HEAD:todo.txt")
    return 1.0 if got is not None and got[0][1::2] == ["Add todo list", "Add b", "Start notes"] \
        and got[0][2::2] == _HISTORY_IDS[::-1] and got[1] == [] and sorted(got[2]) == ["notes.txt", "todo.txt"] \
        and got[3] == ["a", "b", "c"] and got[4] == ["ship"] else 0.0


_add(id="git-commit-all", category="git", needs=("git",),
     instruction="In the git repository repo/, commit all the current changes, the new file todo.txt included, as "
                 "one commit with the message `Add todo list`.",
     files={}, setup=_GIT_INIT + _commits(_HISTORY) + " && printf 'a\\nb\\nc\\n' > notes.txt && echo 'ship' > todo.txt",
     verify=_committed,
     reference=T(("cd repo && git status --short", "cd repo && git add -A && git commit -q -m 'Add todo list' && "
                  "git log --oneline"),),
     wrong=T(("cd repo && git commit -q -am 'Add todo list'",),))

_SETTINGS = [({"settings.ini": "[net]\nretries = 3\n"}, "Add settings"),
             ({"settings.ini": "[net]\nretries = 5\n"}, "Raise retries"),
             ({"settings.ini": "[net]\nretries = 5\ntimeout = 30\n"}, "Set a network timeout"),
             ({"README": "docs\n"}, "Write a readme"),
             ({"settings.ini": "[net]\nretries = 4\ntimeout = 30\n"}, "Lower retries")]
_SUBJECTS = [s for _, s in _SETTINGS]
_add(id="git-find-commit", category="git", needs=("git",),
     instruction="Which commit of the git repository repo/ added the line `timeout = 30` to settings.ini? Finish "
                 "your answer with that commit's subject line.",
     files={}, setup=_GIT_INIT + _commits(_SETTINGS),
     verify=lambda f, a: names_only(a, "Set a network timeout", _SUBJECTS),
     reference=T(("cd repo && git log -S'timeout = 30' --format='%h %s' -- settings.ini",),
                 "It was added by: Set a network timeout"),
     wrong=T(("cd repo && git log -1 --format=%s -- settings.ini",), "It was added by: Lower retries"))

_LIB = "def main():\n    return helper() + 1\n\n\ndef helper():\n    return 41\n"
_BROKEN_LIB = "def main():\n    return helper() + 1\n"
_REVERTS = [({"lib.py": _BROKEN_LIB}, "Add lib"), ({"lib.py": _LIB}, "Add helper"),
            ({"lib.py": _BROKEN_LIB}, "Tidy lib")]
_REVERT_IDS = _commit_ids(_REVERTS)


def _reverted(f, a):
    # the history kept: the setup's three commits themselves (their ids, not look-alikes re-made after a reset),
    # one new commit on top whose lib.py has helper back
    got = _git(f, "log --format=%H", "status --porcelain", "show HEAD:lib.py", "rev-parse HEAD~1")
    ok = got is not None and len(got[0]) == 4 and got[0][1:] == _REVERT_IDS[::-1] and got[3] == _REVERT_IDS[-1:] \
        and got[1] == [] and got[2] == _LIB.splitlines()
    return 1.0 if ok else 0.0


_add(id="git-undo-commit", category="git", needs=("git",),
     instruction="The last commit of the git repository repo/ removed the function helper from lib.py by mistake. "
                 "Undo that commit with a new commit; do not rewrite the history.",
     files={}, setup=_GIT_INIT + _commits(_REVERTS), verify=_reverted,
     reference=T(("cd repo && git log --oneline", "cd repo && git revert --no-edit HEAD && git log --oneline"),),
     wrong=T(("cd repo && git reset -q --hard HEAD~1",),))
