"""minigrpo/run/cli.py: how train.py and eval.py end. A usage error is one "<prog>: error:" line and exit code 2, a
refusal that keeps data from harm "<prog>: refused:" and 3, a run-policy stop its cause and what is kept with exit
code 4, a Ctrl-C what is kept with exit code 130, a SIGTERM the same with 143; any other error is raised as it is. `ended` sees every one of them first (it undoes what the command made)."""
import importlib.util
import os

import pytest

from minigrpo.errors import Refusal, StopRun, UsageError
from minigrpo.run import cli
from minigrpo.signals import Terminated

from repo_root import ROOT


def script(name):
    """The top-level script name.py as a module, loaded from its file: `import judge` may find the tests/judge
    package instead, by the order a worker ran its files in."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", os.path.join(ROOT, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ends(exc, capsys):
    """(exit code or the exception raised, stderr lines, what `ended` was called with) of a work that raises exc
    inside cli.ending."""
    seen = []

    def work():
        raise exc

    def ended(e):
        seen.append(e)
        return "the note"
    try:
        with cli.ending("prog.py", ended):
            work()
        code = None
    except SystemExit as e:
        code = e.code
    except Exception as e:            # noqa: BLE001 - what is not an exit code is returned as it was raised
        code = e
    return code, capsys.readouterr().err.splitlines(), seen


@pytest.mark.parametrize("exc, code, line", [
    (UsageError("--x 3: must be 2"), 2, "prog.py: error: --x 3: must be 2"),
    (SystemExit("--runs-dir r: is a file"), 2, "prog.py: error: --runs-dir r: is a file"),
    (Refusal("r already holds a run: pass --resume"), 3, "prog.py: refused: r already holds a run: pass --resume"),
    (StopRun("the judge is down"), 4, "prog.py: the judge is down; the note"),
    (KeyboardInterrupt(), 130, "prog.py: stopped by Ctrl-C; the note"),
    (Terminated(), 143, "prog.py: stopped by SIGTERM; the note"),
])
def test_each_ending_has_its_exit_code_and_one_line(exc, code, line, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    got, err, seen = ends(exc, capsys)
    assert got == code and [ln for ln in err if ln] == [line] and seen == [exc]


def test_another_error_is_raised_as_it_is_after_ended(capsys):
    exc = ValueError("a bug")
    got, err, seen = ends(exc, capsys)
    assert got is exc and err == [] and seen == [exc]


def test_a_ctrl_c_is_reported_by_rank_0_only(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    got, err, _ = ends(KeyboardInterrupt(), capsys)
    assert got == 130 and err == []


def test_work_that_ends_well_goes_on_as_it_was():
    with cli.ending("prog.py", lambda e: pytest.fail("ended called")):
        got = 7
    assert got == 7


def test_a_refused_flag_is_a_usage_line(capsys):
    def resolve(argv):
        raise SystemExit(f"--steps {argv[1]}: must be at least 1")
    with pytest.raises(SystemExit) as e:
        cli.parse("prog.py", resolve, ["--steps", "0"])
    assert e.value.code == 2 and capsys.readouterr().err == "prog.py: error: --steps 0: must be at least 1\n"
    with pytest.raises(SystemExit) as e:              # argparse's own exit (--help: 0) passes through
        cli.parse("prog.py", lambda argv: (_ for _ in ()).throw(SystemExit(0)), [])
    assert e.value.code == 0


@pytest.mark.parametrize("name", ["train", "eval"])
def test_a_typo_in_a_choice_is_one_line_with_the_nearest(name, capsys):
    main = script(name).main
    with pytest.raises(SystemExit) as e:
        main(["--task", "synthtic"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == [f"{name}.py: error: argument --task: invalid choice: 'synthtic' (choose "
                                         "from 'synthetic', 'soyuz', 'gsm8k', 'mdp', 'revise', 'terminal'); did you "
                                         "mean 'synthetic'?"]


def test_a_typo_of_a_built_in_model_names_it():
    from minigrpo.pretrained import local_folder
    with pytest.raises(FileNotFoundError, match=r"no such checkpoint folder .*; did you mean 'tiny'\?$"):
        local_folder("tinyy")


@pytest.mark.parametrize("name, shown", [
    ("train", ["G: samples per prompt (default: 8)", "--max-new-tokens MAX_NEW_TOKENS (default: 256)",
               "--beta BETA KL coefficient (0 = no reference forward) (default: 0.0)",
               "(default: bfloat16 on CUDA, float32 elsewhere)"]),
    ("eval", ["prompts per sampler call (default: 32)", "0 = greedy (default: 0.0)"]),
    ("judge", ["http(s)://host[:port] (default: local)", "seconds per grader call (default: 180.0)"])])
def test_help_shows_the_defaults(name, shown, capsys):
    """Every flag with a default names it, a default of 0 too."""
    with pytest.raises(SystemExit) as e:
        script(name).main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0
    assert [s for s in shown if s not in out] == []


def script_parsers():
    """{"script.py" or "script.py sub": parser} of every command-line script, each caught at its first parse."""
    import argparse
    judge, mdp, tooluse = script("judge"), script("mdp"), script("tooluse")
    from eval import build_parser as eval_parser
    from minigrpo.run.flags import build_parser as train_parser
    caught = {"train.py": train_parser(), "eval.py": eval_parser()}
    for name, call in (("judge.py", lambda: judge.parse_args([])), ("mdp.py", lambda: mdp.main([])),
                       ("tooluse.py", lambda: tooluse.main([]))):
        def catch(self, *a, name=name, **k):
            caught[name] = self
            raise SystemExit(0)
        with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit):
            mp.setattr(argparse.ArgumentParser, "parse_known_args", catch)
            call()
    for name, parser in list(caught.items()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                caught.update({f"{name} {sub}": p for sub, p in action.choices.items()})
    return caught


def test_every_option_with_a_value_says_its_default():
    """--help of every script: an option that takes a value and may be left out says what leaving it out means,
    argparse's default or the help's own words (a computed default, or 'none')."""
    import argparse
    parsers = script_parsers()
    silent = []
    for name, parser in parsers.items():
        for action in parser._actions:
            if action.nargs == 0 or action.required or action.help == argparse.SUPPRESS or \
                    isinstance(action, argparse._SubParsersAction):
                continue
            if "default" not in parser._get_formatter()._format_action(action):
                silent.append(f"{name} {action.option_strings[0]}")
    assert len(parsers) == 8 and silent == []
