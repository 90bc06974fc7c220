"""minigrpo.judge.sandbox with a caller's work folder: Sandbox(workdir=folder, slot=uid_slot) runs in a host folder
the caller keeps, as the uid of a slot the caller holds, so that sandboxes one after the other share both (what an
episode of shell commands needs, test_episode.py); hand_over gives the folder to the next uid without changing
the owner of anything a payload linked in; output_bytes counts the output that was cut."""

import os

import pytest

from minigrpo.judge.sandbox import Limits, Sandbox, remove_tree
from minigrpo.judge.sandbox.host import UidSlot
from minigrpo.judge.sandbox.mounts import hand_over, new_host_folder, walk_tree

from sandbox_probe import level

SH = ["/bin/sh", "-c"]


@pytest.fixture
def folder():
    path = new_host_folder()
    yield path
    assert remove_tree(path) == []


def sh(command, **kw):
    sb = Sandbox({}, Limits(timeout=20), **kw)
    with sb:
        sb.start(SH + [command])
        out, rc = sb.communicate()
    return rc, out.decode(), sb


def test_consecutive_sandboxes_share_the_folder_and_the_uid(folder):
    slot = UidSlot() if os.geteuid() == 0 else None
    try:
        rc, out, sb = sh("id -u; echo one > notes.txt; mkdir sub; echo two > sub/more.txt", workdir=folder, slot=slot)
        assert rc == 0 and sb.errors == [], (out, sb.errors)
        first_uid = out.split()[0]
        rc, out, sb = sh("id -u; cat notes.txt sub/more.txt; echo three >> notes.txt", workdir=folder, slot=slot)
        assert rc == 0 and out.split() == [first_uid, "one", "two"], out
        with open(os.path.join(folder, "notes.txt")) as f:
            assert f.read() == "one\nthree\n"       # kept after close, on the host
        if slot is not None and "pool-uid" in level()[0]:
            assert first_uid == str(slot.uid)       # the held slot's uid, not a fresh one
            assert slot.fd is not None              # close() left the caller's slot held
    finally:
        if slot is not None:
            slot.release()


def test_output_bytes_counts_what_was_cut():
    with Sandbox({}, Limits(timeout=20)) as sb:
        sb.start(SH + ["head -c 10000 /dev/zero"])
        out, rc = sb.communicate(max_output=100)
    assert rc == 0 and len(out) == 100 and sb.output_bytes == 10000


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_hand_over_changes_no_link_and_no_file_from_outside(folder, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    os.makedirs(os.path.join(folder, "sub"))
    with open(os.path.join(folder, "sub", "task.txt"), "w") as f:
        f.write("task")
    os.link(outside, os.path.join(folder, "hard"))                  # a second name of a file from outside
    os.symlink(str(outside), os.path.join(folder, "soft"))
    os.symlink(str(tmp_path), os.path.join(folder, "soft_dir"))
    hand_over(folder, 60999)
    owners = {os.path.relpath(p, folder): st.st_uid for p, st in walk_tree(folder)}
    assert owners["sub"] == owners["sub/task.txt"] == 60999 == os.stat(folder).st_uid
    assert owners["soft"] == owners["soft_dir"] == 0 and os.stat(outside).st_uid == 0 and os.stat(tmp_path).st_uid == 0
    assert sorted(owners) == ["hard", "soft", "soft_dir", "sub", "sub/task.txt"]   # nothing followed


def test_walk_tree_follows_nothing_and_stops_at_its_depth(folder):
    path = folder
    for _ in range(1200):                                           # deeper than Python's recursion limit
        path = os.path.join(path, "d")
        try:
            os.mkdir(path)
        except OSError:                                             # the path grew too long: deep enough
            break
    os.symlink("/", os.path.join(folder, "root"))
    missing = {}
    entries = list(walk_tree(folder, missing, max_depth=900))
    assert len(entries) == 901 and all(not p.startswith(os.path.join(folder, "root") + "/") for p, _ in entries)
    assert list(missing) == ["d/" * 900]
