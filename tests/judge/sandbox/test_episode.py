"""minigrpo.judge.sandbox.episode: the shell tool of an agent's episode, attacked from inside.

Each test is an episode whose commands try to get out: read the project, /root, the judge's files or another
episode's folder; outlive their command (a background process, a file outside the folder); fork-bomb or fill
memory; reach the network; write past the file and folder limits; plant symlinks, fifos and setuid files for the
verifier's snapshot to trip on. Each must be contained, and the episode must go on (or end with a clear status).
Tests that need bubblewrap or per-sandbox cgroups skip with the machine's weaknesses as the reason where those are
missing."""

import os
import stat
import sys
import time

import pytest

from minigrpo.judge.sandbox import Limits, launch as sandbox_launch
from minigrpo.judge.sandbox.episode import Episode
from minigrpo.judge.sandbox.host import pids_of_uid
from minigrpo.judge.sandbox.mounts import WALK_DEPTH, walk_tree
from minigrpo.tasks.terminal.verify import Folder, Incomplete

from repo_root import ROOT
from sandbox_probe import level, need_bwrap, need_cgroup

FAST = Limits(timeout=5, memory_mb=256, nproc=32, fsize_mb=1)


def episode(files=None, **kw):
    return Episode(files or {}, kw.pop("limits", FAST), **kw)


def test_the_folder_persists_across_commands():
    with episode({"data/in.csv": "a,b\n1,2\n"}) as ep:
        r = ep.run("cat data/in.csv; echo hi > a.txt; echo oops >&2; exit 3")
        assert (r.output, r.exit_code, r.status) == ("a,b\n1,2\noops\n", 3, "exited"), r
        r = ep.run("cat a.txt; pwd")
        assert r.exit_code == 0 and r.output.split() == ["hi", ep_workdir(ep)]
        assert r.observation().endswith("[exit code 0]")
        folder = ep.folder
        assert os.path.isdir(folder)
    assert not os.path.exists(folder) and ep.errors == []


def ep_workdir(ep):
    return "/sandbox" if ep.mode.startswith("bwrap") else ep.folder


def test_output_is_cut_to_its_budget_and_says_so():
    with episode(output_bytes=1000) as ep:
        r = ep.run("head -c 100000 /dev/zero | tr '\\0' a")
        assert r.output == "a" * 1000 and r.cut_bytes == 99000
        assert "[99000 more bytes of output cut]" in r.observation()


def test_the_folder_is_removed_on_an_exception():
    with pytest.raises(RuntimeError):
        with episode() as ep:
            ep.run("echo x > a; mkdir -p d/e; echo y > d/e/f")
            folder = ep.folder
            raise RuntimeError("the caller fails mid-episode")
    assert not os.path.exists(folder)


def test_reads_outside_the_folder_fail():
    need_bwrap()
    with episode() as other, episode() as ep:
        other.run("echo TOP-SECRET-42 > note.txt")
        targets = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "minigrpo", "judge", "grader.py"),
                   os.path.join(other.folder, "note.txt"), os.path.join(ep.folder, "..")]
        for path in targets:
            r = ep.run(f"cat {path!r} || ls {path!r}")
            assert r.exit_code != 0 and r.output.count("No such file or directory") == 2, (path, r.output)
        assert "TOP-SECRET-42" in other.run("cat note.txt").output  # it is there, for its own episode
        with other.snapshot() as snap:                      # nor is the verifier's copy of another episode
            r = ep.run(f"cat {snap.path}/note.txt || ls {snap.path}")
            assert r.exit_code != 0 and "TOP-SECRET-42" not in r.output, r.output
        r = ep.run("ls -A /root /home")
        assert r.output.strip() in ("/home:\n\n/root:", "/root:\n\n/home:") or r.exit_code != 0, r.output
        r = ep.run("ls /proc | grep -c '^[0-9]'")
        assert int(r.output) <= 5, r.output                 # only its own few processes: a pid namespace of its own


def test_a_background_process_dies_with_its_command():
    with episode() as ep:
        r = ep.run("(sleep 0.4; echo late > late.txt) & nohup setsid sleep 60 >/dev/null 2>&1 & echo started")
        assert r.exit_code == 0 and r.output == "started\n" and r.seconds < 3
        time.sleep(0.8)
        assert not os.path.exists(os.path.join(ep.folder, "late.txt"))
        if ep.slot is not None and "pool-uid" in level()[0]:
            assert pids_of_uid(ep.slot.uid) == []           # nothing of the episode runs between its commands
        assert ep.run("ls").output.split() == []


def test_writes_outside_the_folder_do_not_persist():
    need_bwrap()
    with episode() as ep:
        marker = f"minigrpo-escape-{os.getpid()}"
        r = ep.run(f"for d in /tmp /var/tmp /dev/shm; do echo x > $d/{marker}; done; echo y > /{marker}; "
                   f"echo z > /usr/{marker}; ls /tmp/{marker}")
        assert f"/tmp/{marker}" in r.output                 # it could write its private /tmp...
        r = ep.run(f"ls /tmp/{marker} /var/tmp/{marker} /dev/shm/{marker} /{marker} /usr/{marker}")
        assert r.exit_code != 0 and r.output.count("No such file") == 5, r.output     # ...gone with the command
        for d in ("/tmp", "/var/tmp", "/dev/shm", "/", "/usr"):
            assert not os.path.exists(os.path.join(d, marker))


def test_a_fork_bomb_is_contained_and_the_episode_goes_on():
    need_cgroup()
    with episode(limits=Limits(timeout=2, memory_mb=256, nproc=16)) as ep:
        r = ep.run(":(){ :|:& };:")
        assert r.status in ("timeout", "exited"), r                  # ended by the episode's own limits
        r = ep.run("echo still here")
        assert (r.output, r.exit_code) == ("still here\n", 0)


def test_filling_memory_is_contained_and_the_episode_goes_on():
    need_cgroup()
    with episode(limits=Limits(timeout=10, memory_mb=128, nproc=16)) as ep:
        r = ep.run(f"{sys.executable} -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * (1 << 18); print(len(b))'")
        assert r.exit_code not in (0, None) and "1073741824" not in r.output, r
        assert r.memory_peak_mb is None or r.memory_peak_mb <= 128 + 8
        assert ep.run("echo ok").output == "ok\n"


def test_the_network_is_unreachable():
    need_bwrap()
    with episode() as ep:
        for target in ("1.1.1.1/53", "8.8.8.8/443", "10.0.0.1/80"):
            r = ep.run(f"exec 3<>/dev/tcp/{target} && echo connected")
            assert r.exit_code != 0 and "connected" not in r.output, (target, r.output)
        r = ep.run("tail -n +3 /proc/net/dev | cut -d: -f1")
        assert r.output.split() == ["lo"], r.output          # a network namespace with loopback only


def test_files_and_the_folder_are_capped():
    with episode(folder_mb=3) as ep:
        r = ep.run("head -c 5M /dev/zero > big; stat -c %s big")
        assert r.output.split()[-1] == str(1 << 20)        # the file size limit (fsize_mb=1) cut it
        r = ep.run("for i in 1 2 3 4 5 6; do head -c 900K /dev/zero > f$i; done; echo done")
        size, _ = ep.usage()
        if ep._mounted:                                     # a tmpfs of its own: writes past the cap fail
            assert "No space left on device" in r.output and size <= 3 << 20
            assert ep.ended is None and ep.run("rm f*; echo ok").output == "ok\n"
        else:                                               # a host folder: the episode ends after the command
            assert ep.ended and ep.run("echo ok").status == "ended"


def test_per_command_timeout_and_the_episode_budget():
    with episode(limits=Limits(timeout=0.5), budget_s=1.5) as ep:
        r = ep.run("sleep 5")
        assert r.status == "timeout" and r.exit_code is None and r.seconds < 2.5
        assert "time limit" in r.observation()
        assert ep.run("echo ok").output == "ok\n"
        r = ep.run("sleep 5")
        assert r.status in ("timeout", "budget")
        r = ep.run("sleep 5")
        assert r.status in ("budget", "ended") and ep.ended == "time budget spent"
        assert ep.run("echo too late").status == "ended" and ep.used_s < 3
    with episode(budget_s=0) as ep:
        assert ep.run("echo never").status == "ended" and ep.ended == "time budget spent"


PLANT = """
ln -s /etc/passwd leak; ln -s / rootlink; ln -s "$PWD/../.." up; mkdir -p d/e; ln -s /root d/e/home
mkfifo pipe; cp /bin/true tool; chmod 6755 tool; ln tool tool2; truncate -s 900K sparse
echo report > d/e/out.txt; chmod 0666 d/e/out.txt
"""


def test_the_snapshot_copies_only_plain_files_read_only():
    with episode() as ep:
        ep.run(PLANT)
        with ep.snapshot() as snap:                     # returns: the fifo, never opened, did not block it
            got = {}
            for top, dirs, files in os.walk(snap.path):
                for name in dirs + files:
                    p = os.path.join(top, name)
                    st = os.lstat(p)
                    got[os.path.relpath(p, snap.path)] = st
                    assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode), p
                    assert st.st_uid == os.geteuid() and not st.st_mode & (stat.S_ISUID | stat.S_ISGID | 0o222), p
            assert sorted(got) == ["d", "d/e", "d/e/out.txt", "sparse", "tool", "tool2"]
            assert {stat.S_IMODE(st.st_mode) for rel, st in got.items() if rel != "d" and rel != "d/e"} == {0o444}
            # the modes the agent gave them, whole: type, setuid, setgid and every permission bit
            assert snap.modes["tool"] == snap.modes["tool2"] == stat.S_IFREG | 0o6755
            assert snap.modes["d/e/out.txt"] == stat.S_IFREG | 0o666 and stat.S_ISDIR(snap.modes["d/e"])
            assert sorted(snap.modes) == sorted(got)
            with open(os.path.join(snap.path, "d/e/out.txt")) as f:
                assert f.read() == "report\n"
            skipped = "\n".join(snap.skipped)
            for what in ("leak: symlink to '/etc/passwd'", "rootlink: symlink", "up: symlink", "d/e/home: symlink",
                         "pipe: a fifo"):
                assert what in skipped, snap.skipped
            assert not snap.cut
            path = snap.path
        assert not os.path.exists(path)
        assert ep.run("ls d/e").output == "home\nout.txt\n"  # the episode's own folder is untouched


def test_the_snapshot_caps_the_number_of_entries():
    with episode() as ep:
        ep.run("for i in $(seq 1 20); do echo $i > f$i; done")
        with ep.snapshot(max_files=5) as snap:
            assert snap.files == 5 and len(os.listdir(snap.path)) == 5
            assert snap.cut.endswith("over the snapshot's 5 entries") and snap.skipped == [snap.cut]


def test_the_byte_cap_stops_the_copy_at_the_first_file_past_it_and_sparse_files_count():
    with episode() as ep:
        ep.run("truncate -s 900K a-sparse; echo small > b-small; echo small > c-small")
        with ep.snapshot(max_bytes=600 << 10) as snap:
            assert snap.cut == "a-sparse: 921600 bytes, over the snapshot's 614400 bytes in all"
            assert os.listdir(snap.path) == [] and snap.skipped == [snap.cut]    # nothing after it either


@pytest.mark.parametrize("mode,lacks", [("bwrap-userns", "user namespace"), ("unshare", "no mount namespace"),
                                        ("plain", "no mount namespace")])
def test_a_weaker_mode_still_runs_and_names_what_it_lacks(mode, lacks):
    if not sandbox_launch._mode_ok(mode) or (mode == "bwrap-userns" and os.geteuid() != 0):
        pytest.skip(f"{mode} cannot start here (or is the best mode, tested above)")
    with Episode({"in.txt": "x"}, Limits(timeout=5), _mode=mode) as ep:
        ep.run("echo y > out.txt")
        r = ep.run("cat in.txt out.txt")
        assert r.output == "xy\n" and r.exit_code == 0, (r, ep.weaknesses)
        assert any(lacks in w for w in ep.weaknesses), ep.weaknesses
        folder = ep.folder
    assert not os.path.exists(folder) and ep.errors == []


def chain(top, depth):
    """`depth` nested folders d/d/..., each holding a file f, made from the host (relative to open folders)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


def test_a_2000_deep_chain_costs_the_host_a_bounded_walk_and_says_what_it_left_out():
    with episode() as ep:
        chain(ep.folder, 2000)
        missing = {}
        walked = [os.path.relpath(p, ep.folder) for p, _ in walk_tree(ep.folder, missing)]
        assert len(walked) == 2 * WALK_DEPTH and max(p.count("/") for p in walked) == WALK_DEPTH - 1
        assert missing == {"d/" * WALK_DEPTH: f"more than {WALK_DEPTH} folders deep: not walked"}
        assert ep.run("cd d/d && echo ok > g && cat g").output == "ok\n"     # handed over, walked as far
        assert ep.host_s > 0 and ep.used_s > sum(r.seconds for r in ep.results)     # the host's part charged
        with ep.snapshot() as snap:
            assert snap.files == 2 * WALK_DEPTH + 1 and snap.missing == missing and not snap.cut
            with pytest.raises(Incomplete, match="more than 32 folders deep"):
                Folder(snap.path, snap.missing, snap.cut).files("d")
