"""minigrpo.tasks.terminal.verify and the Env's text rules: bounded no-follow reads of a snapshot, the probe sandbox,
the readings of a final answer, and the neutralising of control-token strings in what the policy is shown."""

import errno
import os
import random
import stat

import pytest

from sandbox_probe import need_bwrap

from minigrpo.tasks.terminal import verify
from minigrpo.tasks.terminal.task import final_answer, neutralise
from minigrpo.tasks.terminal.verify import Folder, Incomplete, VerifierUnavailable, _listing, last_digest, \
    last_number, lines_are, named, names_only, number_is, probe


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("one\ntwo  \n")
    (tmp_path / "sub" / "b.txt").write_text("b\n")
    (tmp_path / "big.bin").write_bytes(b"x" * 101)
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran $1\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    return tmp_path


def test_the_folder_lists_and_reads_only_regular_files_it_walked_to(tree):
    f = Folder(str(tree))
    assert f.entries == {"a.txt": "file", "big.bin": "file", "latin.txt": "file", "run.sh": "file", "sub": "dir",
                         "sub/b.txt": "file"}
    assert f.files() == ["a.txt", "big.bin", "latin.txt", "run.sh", "sub/b.txt"] and f.folders() == ["sub"]
    assert f.files("sub") == ["sub/b.txt"] and f.mode("run.sh") == stat.S_IFREG | 0o755 and f.mode("no") is None
    assert f.lines("a.txt") == ["one", "two  "] and f.read("sub/b.txt") == b"b\n"
    for rel in ("sub", "../a.txt", "missing"):
        assert f.read(rel) is None, rel
    assert f.read("big.bin", cap=100) is None and f.read("big.bin", cap=101) == b"x" * 101
    assert f.text("latin.txt") is None                      # not UTF-8: unreadable, not guessed
    assert lines_are(f, "a.txt", ["one", "two"]) == 1.0 and lines_are(f, "a.txt", ["one"]) == 0.0


def test_what_the_folder_left_out_fails_every_question_it_could_change(tree):
    os.symlink(tree / "a.txt", tree / "link.txt")
    os.symlink(tree / "sub", tree / "linked")
    os.mkfifo(tree / "sub" / "pipe")
    f = Folder(str(tree), missing={"deep/er/": "more than 32 folders deep: not walked"})
    assert f.missing == {"link.txt": "not a folder or a regular file", "linked": "not a folder or a regular file",
                         "sub/pipe": "not a folder or a regular file",
                         "deep/er/": "more than 32 folders deep: not walked"}
    for question in (f.files, f.folders, lambda: f.files("sub"), lambda: f.read("link.txt"),
                     lambda: f.read("linked/b.txt"), lambda: f.mode("sub/pipe"), lambda: f.files("deep"),
                     lambda: f.read("deep/er/x"), lambda: probe(f, "true", take=lambda rel: rel.startswith("sub/")),
                     lambda: probe(f, "true", take=lambda rel: rel.startswith("deep/er/x/"))):
        with pytest.raises(Incomplete, match="incomplete"):
            question()
    assert f.read("sub/b.txt") == b"b\n" and f.files("subway") == [] and f.read("deep/x") is None
    cut = Folder(str(tree), cut="big.bin: 101 bytes, over the snapshot's 100 bytes in all")
    with pytest.raises(Incomplete, match="big.bin: 101 bytes"):
        cut.read("a.txt")                                   # a copy cut short answers nothing


def test_a_path_too_long_for_the_probe_scores_0_not_unscored(tmp_path):
    # a path that fits where the snapshot lies may not fit under the probe's folder: the verifier's sandbox would
    # not start, and the episode would go unscored (out of its group) for a reason the agent chose
    path = tmp_path
    for i in range(5):                                      # 1,255 bytes
        path = path / (chr(97 + i) * 250)
        path.mkdir()
    (path / "f").write_text("x")
    with pytest.raises(Incomplete, match="a path over the probe's 1024 bytes"):
        probe(Folder(str(tmp_path)), "true")


def test_the_verifiers_files_win_over_the_agents_in_their_way(tmp_path):
    # an agent's file where a folder of the verifier's goes, or its folder where a file of the verifier's goes,
    # would make the copy-in fail: the sandbox would not start and the episode would go unscored for a name the
    # agent chose
    (tmp_path / "tools").write_text("mine\n")
    (tmp_path / "in.txt").mkdir()
    (tmp_path / "in.txt" / "x").write_text("mine\n")
    (tmp_path / "kept.txt").write_text("kept\n")
    r = probe(Folder(str(tmp_path)), "cat tools/s.py in.txt kept.txt", extra={"tools/s.py": "a\n", "in.txt": "b\n"})
    assert r.exit_code == 0 and r.output.splitlines() == ["a", "b", "kept"], r.output


@pytest.mark.parametrize("err, raised", [(errno.ENOSPC, Incomplete), (errno.EDQUOT, Incomplete),
                                         (errno.EACCES, VerifierUnavailable)])
def test_a_copy_in_that_finds_no_room_scores_0_where_a_host_failure_is_not_scored(tree, monkeypatch, err, raised):
    # the probe's folder is sized for the copy: what room is still missing is the agent's doing (a host folder on
    # the disk its own folder shares), never the host's alone
    def episode(*args, **kwargs):
        raise OSError(err, os.strerror(err))
    monkeypatch.setattr(verify, "Episode", episode)
    with pytest.raises(raised):
        probe(Folder(str(tree)), "true")


def test_the_listing_stops_at_its_cap(tmp_path):
    for i in range(10):
        (tmp_path / f"f{i}").write_text("x")
    entries, cut = _listing(str(tmp_path), 4, {})
    assert len(entries) == 4 and cut == "over the verifier's 4 entries"
    assert _listing(str(tmp_path), 10, {}) == ({f"f{i}": os.lstat(tmp_path / f"f{i}").st_mode for i in range(10)}, "")


def test_a_probe_runs_on_a_copy_in_a_sandbox_of_its_own(tree):
    f = Folder(str(tree))
    r = probe(f, "./run.sh probe; ls; cat hidden.txt; echo changed > a.txt", take=lambda rel: rel != "big.bin",
              extra={"hidden.txt": "from the verifier\n", "sub/b.txt": "the verifier's\n"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "ran probe" and "big.bin" not in lines and "hidden.txt" in lines
    assert lines[-1] == "from the verifier"
    assert (tree / "a.txt").read_text() == "one\ntwo  \n"            # the snapshot itself is untouched


def test_a_probe_sees_nothing_of_the_host(tree):
    need_bwrap()
    r = probe(Folder(str(tree)), f"pwd; ls {tree} 2>&1; ls /root 2>&1 | head -1")
    assert r.output.splitlines()[0] == "/sandbox" and "No such file" in r.output and "a.txt" not in r.output


def test_answer_readings_take_one_value():
    assert last_number("There are 1,234 lines (not 12).") == 12
    assert last_number("logs/app2.log has 31 ERROR lines") == 31 and last_number("none") is None
    assert last_number("v2 -3.5") == -3.5 and last_number("see file2.txt") is None
    assert number_is("Total: 4,101.50", 4101.5) == 1.0 and number_is("41 or 42", 41) == 0.0
    assert named("see data/x.csv, not x.csv.bak", ["x.csv", "y.csv", "x.csv.bak"]) == {"x.csv", "x.csv.bak"}
    assert names_only("It is b.md.", "b.md", ["a.md", "b.md"]) == 1.0
    assert names_only("a.md or b.md", "b.md", ["a.md", "b.md"]) == 0.0
    assert names_only("It is ab.md.", "b.md", ["a.md", "b.md"]) == 0.0
    digest = "ab" * 32
    assert last_digest(f"sha {'cd' * 32}, hmac {digest.upper()}") == digest and last_digest("ab" * 33) is None


CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|fim_prefix|>", "<tool_call>",
           "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def test_neutralise_leaves_no_control_token_string():
    for token in CONTROL:
        out = neutralise(f"a{token}b")
        assert token not in out and out == f"a&lt;{token[1:]}b", token
    rng = random.Random(0)
    pieces = ["<", "|", "im_start", "|>", "</", "tool_call", ">", "&lt;", "think", "<|", "x", "\n", "/"]
    for _ in range(2000):                   # any mix of the pieces: no token string survives, text is kept
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        out = neutralise(text)
        assert not any(t in out for t in CONTROL), (text, out)
        assert out.replace("&lt;", "<") == text.replace("&lt;", "<")
    assert neutralise("<|im start|> <b>a</b> x < y") == "<|im start|> <b>a</b> x < y"


def test_the_final_answer_is_the_text_after_thinking_without_calls():
    text = "<think>\nmaybe 7\n</think>\n\nIt is 42.\n<tool_call>\n{\"name\": \"shell\"}\n</tool_call>\nbye"
    assert final_answer(text) == "It is 42.\n\nbye"
    assert final_answer("It is 5. <tool_call> cut short") == "It is 5."
    assert len(final_answer("x" * 100000)) == 8192
