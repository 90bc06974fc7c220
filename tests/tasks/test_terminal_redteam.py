"""A red team against the terminal exercises: transcripts played through the real TerminalEnv that score more
than the exercise's own wrong transcript. Each test asserts the secure behaviour, so it FAILS while the attack
works; `works(reason)` marks it a strict xfail on AssertionError until the environment or the verifier is fixed.

Groups:
  not scored     an episode the verifier cannot score (`None`) leaves its group: GRPO gives it no advantage, where
                 the 0 of a wrong answer would be pushed down. docs/agentic.md: "a failure the agent can provoke
                 must never take its sample out of the group"
"""

import functools

import pytest

from sandbox_probe import need_bwrap
from terminal_runs import TerminalTask, play, score_of

TASK = TerminalTask()


def works(reason):
    """The mark of an attack that works today: its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


@functools.lru_cache(maxsize=None)
def wrong_score(exercise_id):
    score, _ = score_of(TASK, exercise_id, TASK.by_id[exercise_id].wrong)
    return score


def attack(exercise_id, commands, answer="Done."):
    env = TASK.env({"id": exercise_id})
    try:
        return play(env, commands, answer)
    finally:
        env.close()


# =================================================================================================================
# Not scored: an agent fills its own folder's inodes (Episode's folder_files, 4096) with entries the probe takes
# (all under the package's folder: 512 files, the rest folders above them, within every cap of the snapshot, the
# listing and the probe). Were the probe's folder a tmpfs of as many inodes as the agent's, its own _probe.py would
# find none: the copy-in would fail with ENOSPC and the episode would not be scored (None), whatever the fix was.

FILL_THE_PACKAGE = r"""python3 - <<'EOF'
import os
os.remove('tests/test_textstats.py'); os.rmdir('tests')
folders_left = 4095 - 1 - 512       # the folder's inodes but its root: textstats/, its 512 files, folders above them
for i in range(511):                # beside __init__.py
    depth = folders_left // (511 - i)
    folders_left -= depth
    d = os.path.join('textstats', f'f{i}', *['d'] * (depth - 1))
    os.makedirs(d)
    open(os.path.join(d, 'x.txt'), 'w').close()
EOF
df -i . | tail -1"""


def test_filling_the_folders_inodes_does_not_take_the_episode_out_of_its_group():
    need_bwrap()
    ex = TASK.by_id["package-word-count"]
    final, replies = attack(ex.id, list(ex.wrong.commands) + [FILL_THE_PACKAGE], "Fixed.")
    assert "100%" in replies[-1].messages[0]["content"], replies[-1].messages[0]["content"]   # the folder is full
    assert final.score is not None and final.score <= wrong_score(ex.id), final.info


# The git exercises take repo/ (its work tree, and of .git the history's data): the agent removes what of .git the
# probe does not take (config, hooks, logs: the probe would not make room for them), then fills the rest of the
# folder's inodes under repo/; the probe's own .git/config finds no inode.
FILL_THE_REPO = r"""python3 - <<'EOF'
import os, shutil
g = 'repo/.git'
for name in os.listdir(g):
    if name not in ('HEAD', 'index', 'packed-refs', 'objects', 'refs'):
        p = os.path.join(g, name)
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
for top, dirs, files in os.walk(g, topdown=False):    # empty folders are not made in the probe
    if not os.listdir(top):
        os.rmdir(top)
files = sum(len(f) for _, _, f in os.walk('.'))
entries = sum(len(d) + len(f) for _, d, f in os.walk('.'))
budget = 4095 - entries                    # inodes left in the folder
new_files = 512 - files
folders = budget - new_files - 1          # repo/junk itself
for i in range(new_files):
    depth = folders // (new_files - i)
    folders -= depth
    d = os.path.join('repo', 'junk', f'f{i}', *['d'] * (depth - 1))
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, f'x{i}.txt'), 'w').close()
EOF
df -i . | tail -1"""


def test_filling_the_repositorys_inodes_does_not_take_the_episode_out_of_its_group():
    need_bwrap()
    ex = TASK.by_id["git-undo-commit"]
    final, replies = attack(ex.id, list(ex.wrong.commands) + [FILL_THE_REPO])
    assert "100%" in replies[-1].messages[0]["content"], replies[-1].messages[0]["content"]   # the folder is full
    assert final.score is not None and final.score <= wrong_score(ex.id), final.info
