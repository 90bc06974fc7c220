"""The terminal verifiers check the property each exercise states, not a proxy of it. Each case is an attack that a
verifier paid 1.0 while it read a proxy (one bit of a mode, a file's name for its path, a probe that brings its own
copy of what the agent was told to leave alone, one table of a database, the rows without the table's shape), and
that now scores 0; beside it, the honest variants that still score 1.0. docs/agentic.md lists the proxies closed.

And the agent never sees the exercises: a second copy of the package (another checkout on sys.path, an install in
a prefix's site-packages) is hidden from its sandbox as the running one is."""

import os
import shutil
import sys
import tempfile

import pytest

from sandbox_probe import need_bwrap
from terminal_runs import TerminalTask, play

from minigrpo.judge.sandbox import mounts

TASK = TerminalTask()


def score(exercise_id, commands, answer="Done."):
    env = TASK.env({"id": exercise_id})
    try:
        final, _ = play(env, commands, answer)
    finally:
        env.close()
    return final.score


FIX_GREET = "sed -i 's/\\r$//' greet.sh"
FIX_RUNNER = "sed -i 's#data/sales.csv#input/sales.csv#' run.sh"
CANCEL = ("python3 -c \"import sqlite3; c = sqlite3.connect('shop.db'); c.execute(\\\"update orders set status = "
          "'cancelled' where customer_id = (select id from customers where name = 'dave')\\\"); {}c.commit()\"")
IMPORT = ("python3 -c \"import csv, sqlite3; c = sqlite3.connect('people.db'); c.execute('create table people "
          "(name text, age integer, city text{})'); c.executemany('insert into people (name, age, city) values "
          "(?, ?, ?)', [(r['name'], int(r['age']), r['city']) for r in csv.DictReader(open('people.csv'))]); "
          "c.commit()\"")

# (exercise, commands, answer): each scored 1.0 against a proxy
ATTACKS = {
    # the owner's x bit alone: everything made executable by all, then u-x on the non-scripts (-rw-r-xr-x)
    "non-scripts-executable-by-others": ("make-scripts-executable", [
        "chmod -R a+x bin && chmod u-x bin/README.txt bin/lib/data.csv"], "Done."),
    # x without r: the shell cannot read the script ("Permission denied" when run)
    "scripts-0100": ("make-scripts-executable", ["find bin -name '*.sh' -exec chmod 0100 {} +"], "Done."),
    # the probe made every owner-executable file 0755: a script its owner cannot read ran there
    "greet-0100": ("fix-greet-script", [f"{FIX_GREET} && chmod 0100 greet.sh"], "Done."),
    # the probe brought its own tools/ and input/: what the agent did to them went unseen
    "runner-edits-tools": ("fix-runner-path", [f"{FIX_RUNNER} && echo '# mine' >> tools/summarise.py"], "Done."),
    "runner-removes-input": ("fix-runner-path", [f"{FIX_RUNNER} && rm input/sales.csv"], "Done."),
    # only the orders were read back: the other customers deleted went unseen
    "cancel-deletes-customers": ("sqlite-cancel-orders", [CANCEL.format(
        "c.execute(\\\"delete from customers where name != 'dave'\\\"); ")], "Done."),
    "cancel-adds-a-trigger": ("sqlite-cancel-orders", [CANCEL.format(
        "c.execute('create table log (x)'); ")], "Done."),
    # the rows were read, not the table's columns
    "import-with-an-extra-column": ("csv-into-sqlite", [IMPORT.format(", note text")], "Done."),
    # a file's name for its path: a path that does not exist, ending in the right name
    "largest-wrong-path": ("largest-file", [], "The largest is data/b/blob.bin."),
    "codename-wrong-path": ("find-codename", [], "It is docs/old/c-release.md."),
}

HONEST = {
    "scripts-u+x": ("make-scripts-executable", ["find bin -name '*.sh' -exec chmod u+x {} +"], "Done."),
    "scripts-0500": ("make-scripts-executable", ["find bin -name '*.sh' -exec chmod 0500 {} +"], "Done."),
    "greet-0700": ("fix-greet-script", [f"{FIX_GREET} && chmod 0700 greet.sh"], "Done."),
    "runner": ("fix-runner-path", [FIX_RUNNER], "Done."),
    "cancel": ("sqlite-cancel-orders", [CANCEL.format("")], "Done."),
    "import": ("csv-into-sqlite", [IMPORT.format("")], "Done."),
    "largest-path": ("largest-file", [], "The largest is ./data/a/blob.bin"),
    "codename-path": ("find-codename", [], "It is docs/c-release.md."),
}


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_an_attack_on_a_proxy_scores_0(case):
    exercise, commands, answer = ATTACKS[case]
    assert score(exercise, commands, answer) == 0.0


@pytest.mark.parametrize("case", sorted(HONEST))
def test_the_honest_variants_still_score_1(case):
    exercise, commands, answer = HONEST[case]
    assert score(exercise, commands, answer) == 1.0


# --- a second copy of the package ------------------------------------------------------------------------------------

def _writable_outside_hidden():
    # a folder none of the sandbox's hidden paths holds (not /tmp, not home, not the project): where a second
    # checkout or a prefix could lie on a real machine
    for top in ("/srv", "/opt", "/var/lib", "/mnt"):
        if os.path.isdir(top) and os.access(top, os.W_OK):
            return tempfile.mkdtemp(prefix="minigrpo-copy-test-", dir=top)
    pytest.skip("no writable folder outside the sandbox's hidden paths (root makes one under /srv)")


def _plant_copy(site):
    here = os.path.dirname(os.path.abspath(mounts.__file__))            # minigrpo/judge/sandbox
    package = os.path.dirname(os.path.dirname(here))
    shutil.copytree(os.path.join(package, "tasks", "terminal"), os.path.join(site, "minigrpo", "tasks", "terminal"))
    os.makedirs(os.path.join(site, "minigrpo-0.1.dist-info"))
    with open(os.path.join(site, "minigrpo-0.1.dist-info", "RECORD"), "w") as f:
        f.write("minigrpo/tasks/terminal/verify.py,,\n")


@pytest.fixture
def fresh_paths():
    mounts.python_paths.cache_clear()
    mounts.hidden_copies.cache_clear()
    yield
    mounts.python_paths.cache_clear()
    mounts.hidden_copies.cache_clear()


@pytest.mark.parametrize("where", ["checkout on sys.path", "site-packages of a prefix"])
def test_no_copy_of_the_package_is_seen_by_the_agent(where, monkeypatch, fresh_paths):
    need_bwrap()
    top = _writable_outside_hidden()
    try:
        if where == "checkout on sys.path":         # PYTHONPATH=/srv/.../checkout: its tests hold the answers too
            site = os.path.join(top, "checkout")
            os.makedirs(os.path.join(site, "tests", "tasks"))
            shutil.copy(__file__, os.path.join(site, "tests", "tasks", "test_terminal_proxies.py"))
        else:                                       # an older non-editable install in a prefix the judge runs from
            site = os.path.join(top, "venv", "lib", "python3", "site-packages")
            monkeypatch.setattr(sys, "exec_prefix", os.path.join(top, "venv"))
        _plant_copy(site)
        monkeypatch.setattr(sys, "path", sys.path + [site])
        mounts.python_paths.cache_clear()           # read again with the copy on sys.path (need_bwrap read them)
        mounts.hidden_copies.cache_clear()
        assert mounts.package_copies([site]) == sorted(os.path.join(os.path.realpath(site), n)
                                                       for n in ("minigrpo", "minigrpo-0.1.dist-info"))
        env = TASK.env({"id": "largest-file"})
        try:
            bound = " ".join([top] + mounts.python_paths()[0])       # where a copy could be seen
            final, replies = play(env, [f"ls {site}; find {bound} -path '*tasks/terminal/*.py' -o -name "
                                        f"'test_terminal*' 2>/dev/null | head -3; cat {site}/minigrpo-0.1.dist-info"
                                        "/RECORD; echo searched"], "Done.")
        finally:
            env.close()
        out = replies[0].messages[0]["content"]
        assert "verify.py" not in out and "set_text" not in out and "test_terminal" not in out, out
        assert out.endswith("searched\n[exit code 0]"), out
    finally:
        shutil.rmtree(top)
