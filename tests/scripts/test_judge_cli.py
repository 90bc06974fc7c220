"""judge.py names the answer file it cannot use: a binary file (not UTF-8 text) or one it cannot read, in one line
with exit code 2, before any judge starts."""
import importlib.util
import os

import pytest

from repo_root import ROOT


@pytest.fixture(scope="module")
def cli():
    # by its path: `import judge` may find bench/judge.py, which a bench test put on sys.path
    spec = importlib.util.spec_from_file_location("judge_cli", os.path.join(ROOT, "judge.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_line(cli, answer, capsys):
    assert cli.main(["--task", "semver-compare", "--answer", str(answer)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_binary_answer_is_named(cli, tmp_path, capsys):
    answer = tmp_path / "answer.bin"
    answer.write_bytes(b"def f():\n    return 1\n\x89PNG\x00\xff")
    assert one_line(cli, answer, capsys) == (f"judge.py: --answer {answer}: not UTF-8 text (byte 22 is 0x89); the "
                                              "judge grades text answers")


def test_an_unreadable_answer_is_named(cli, tmp_path, capsys):
    assert one_line(cli, tmp_path, capsys) == f"judge.py: --answer {tmp_path}: cannot read it (Is a directory)"


@pytest.mark.parametrize("judge, mode", [("cmd:false", "hybrid"), ("http://127.0.0.1:9", "hybrid"),
                                         ("cmd:false", "llm")])
def test_a_judge_that_never_answered_is_not_a_score(cli, judge, mode, tmp_path, capsys):
    """The judge the user named is down (a command that fails, a port nobody listens on): exit code 4 and one line
    saying which criteria it left unchecked (hybrid), or that nothing was graded (llm), not a score of the
    deterministic checks alone with exit code 0, nor a bug's exit code 1."""
    answer = tmp_path / "answer.py"
    answer.write_text("def compare(a, b):\n    return 0\n")
    code = cli.main(["--task", "semver-compare", "--answer", str(answer), "--judge", judge, "--retries", "0",
                     "--timeout", "5", "--judge-mode", mode])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4 and err[-1].startswith(f"judge.py: the {judge} judge never answered; "), err[-3:]
