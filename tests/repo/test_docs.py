"""README.md and docs/*.md point only at what the repository has: every path they name exists, every flag of a
train.py / eval.py / judge.py / mdp.py command is one that script's parser takes, every local markdown link (and
its #anchor) resolves, the README stays a front page (at most 15,000 bytes), a core module's docstring stays a
first screen (at most 12 lines), a file of code a one-sitting read (at most 450 lines), and no file of the code, the tests or the docs refers to a document outside the
repository. No model is built and nothing is trained."""
import argparse
import ast
import glob
import importlib.util
import os
import re

import pytest

from repo_root import ROOT
SCRIPTS = ("train.py", "eval.py", "judge.py", "mdp.py")
README_LIMIT = 15_000
DOCSTRING_LIMIT = 12   # lines, the quotes included
FILE_LIMIT = 450      # lines of a library, bench or script file
PATH_ROOTS = ("minigrpo", "tests", "bench", "scripts", "docs", ".ci")
SKIP_DIRS = {".git", "__pycache__", "runs", "node_modules"}
# other programs' flags the docs quote: tensorboard's, torchrun's
FOREIGN_FLAGS = {"--logdir", "--nproc_per_node", "--dist", "--index-url"}  # tensorboard, torchrun, pytest-xdist, pip


def markdown_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def repo_files(exts):
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        for f in files:
            if f.endswith(exts):
                yield os.path.join(dirpath, f)


def rel(path):
    return os.path.relpath(path, ROOT)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def split_fences(text):
    """(prose, [fenced block lines]) of a markdown text: fenced code blocks are cut out of the prose."""
    prose, blocks, block = [], [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                blocks.append(block)
                block = None
        elif block is None:
            prose.append(line)
        else:
            block.append(line)
    return "\n".join(prose), blocks


def code_snippets(text):
    """Every piece of code a markdown text holds: its inline code spans (which may wrap across lines) and each
    command of its fenced blocks (backslash continuations joined, shell comments dropped)."""
    prose, blocks = split_fences(text)
    out = [m.replace("\n", " ") for m in re.findall(r"`([^`]+)`", prose)]
    for block in blocks:
        joined = "\n".join(block).replace("\\\n", " ")
        out += [line.split(" #")[0] for line in joined.splitlines() if not line.lstrip().startswith("#")]
    return out


# ----------------------------------------------------------------------------------------------------------------
# the scripts' flags, from their own parsers


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def _load(script):
    spec = importlib.util.spec_from_file_location(f"_docs_{script[:-3]}", os.path.join(ROOT, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _captured_parser(call):
    """The parser a script's entry point builds: it is caught at its first parse, before anything runs."""
    def capture(self, *a, **k):
        raise _Captured(self)
    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = capture
    try:
        call()
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise AssertionError("the entry point never parsed its arguments")


def _options(parser):
    """{subcommand or None: set of option strings}; options hidden from --help do not count."""
    out = {None: set()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = _options(sub)[None]
        elif action.help != argparse.SUPPRESS:
            out[None].update(s for s in action.option_strings if s.startswith("--"))
    return out


@pytest.fixture(scope="module")
def parsers():
    from minigrpo.run.flags import build_parser
    judge, mdp = _load("judge.py"), _load("mdp.py")
    return {"train.py": _options(build_parser()),
            "eval.py": _options(_load("eval.py").build_parser()),
            "judge.py": _options(_captured_parser(lambda: judge.parse_args([]))),
            "mdp.py": _options(_captured_parser(lambda: mdp.main([])))}


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
COMMAND = re.compile(r"(?:^|[\s(])(?:python3?\s+|torchrun\s.*?)((?:train|eval|judge|mdp)\.py)\b(.*)")


def commands(text):
    """(script, subcommand or None, flags) of every train.py / eval.py / judge.py / mdp.py command in a text;
    scripts/quickstart is train.py."""
    for snippet in code_snippets(text):
        snippet = re.sub(r"(^|\s)scripts/quickstart\b", r"\1python train.py", snippet)
        for part in re.split(r"&&|;|\|", snippet):
            m = COMMAND.search(part)
            if m:
                words = m.group(2).split()
                sub = words[0] if words and not words[0].startswith("-") else None
                yield m.group(1), sub, FLAG.findall(m.group(2))


def test_every_flag_of_a_script_command_is_in_its_parser(parsers):
    bad, seen = [], 0
    for path in markdown_files():
        for script, sub, flags in commands(read(path)):
            known = parsers[script].get(sub if sub in parsers[script] else None)
            seen += len(flags)
            bad += [f"{rel(path)}: {script}{' ' + sub if sub else ''} {f}" for f in flags if f not in known]
    assert seen > 50, f"only {seen} flags found in the docs' commands: the command parser lost them"
    assert not bad, "flags no parser takes:\n" + "\n".join(bad)


def test_every_flag_named_anywhere_exists_somewhere(parsers):
    """A flag named outside a command (`--recovery-coef` in prose) is one of the four scripts' or is spelled in
    the code of some other command line of the repository (bench/, python -m minigrpo.run.export, ...)."""
    known = set().union(*(opts for p in parsers.values() for opts in p.values())) | FOREIGN_FLAGS
    sources = "\n".join(read(p) for p in repo_files((".py", "quickstart", "test", "run", ".sh")))
    bad = []
    for path in markdown_files():
        for snippet in code_snippets(read(path)):
            for f in FLAG.findall(snippet):
                if f not in known and f'"{f}"' not in sources and f"'{f}'" not in sources:
                    bad.append(f"{rel(path)}: {f}")
    assert not bad, "flags nothing in the repository takes:\n" + "\n".join(sorted(set(bad)))


# ----------------------------------------------------------------------------------------------------------------
# paths and links

PATH = re.compile(r"(?<![\w./~<-])((?:%s)/[\w./*-]*)" % "|".join(re.escape(r) for r in PATH_ROOTS))
BARE_PY = re.compile(r"(?<![\w./\"'-])([A-Za-z_][\w-]*\.py)\b")


def named_paths(text):
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".,:;")
        if p.endswith("/*") or "<" in text[m.end():m.end() + 1]:
            continue
        yield p


def test_every_path_the_docs_name_exists():
    names = {os.path.basename(p) for p in repo_files((".py",))}
    bad, seen = [], 0
    for path in markdown_files():
        text = read(path)
        for p in named_paths(text):
            seen += 1
            if not glob.glob(os.path.join(ROOT, p)):
                bad.append(f"{rel(path)}: {p}")
        for m in BARE_PY.finditer(text):   # a file named alone: a top-level script, or a file somewhere in the tree
            seen += 1
            if m.group(1) not in names:
                bad.append(f"{rel(path)}: {m.group(1)}")
    assert seen > 100, f"only {seen} paths found: the path pattern lost them"
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    prose, _ = split_fences(read(path))
    return {slug(m) for m in re.findall(r"^#+\s+(.*)$", prose, flags=re.M)}


def test_every_local_markdown_link_resolves():
    bad, seen = [], 0
    for path in markdown_files():
        prose, _ = split_fences(read(path))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            seen += 1
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                bad.append(f"{rel(path)}: ({target}) -> no {rel(dest)}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{rel(path)}: ({target}) -> no heading #{anchor} in {rel(dest)}")
    assert seen > 20, f"only {seen} links found"
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)


def test_the_readme_links_every_docs_page():
    readme = read(os.path.join(ROOT, "README.md"))
    missing = [rel(p) for p in markdown_files()[1:] if f"({rel(p)})" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_readme_is_a_front_page():
    size = os.path.getsize(os.path.join(ROOT, "README.md"))
    assert size <= README_LIMIT, f"README.md is {size} bytes; at most {README_LIMIT}: move the detail to docs/"


def test_core_module_docstrings_are_a_first_screen():
    """A core module (minigrpo/*.py) opens with what it is and where the rest is told, in at most 12 lines: the
    detail belongs in docs/ or beside the line it explains, so that a reader meets the code on the first screen."""
    long = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "minigrpo", "*.py"))):
        body = ast.parse(read(path)).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            lines = body[0].end_lineno - body[0].lineno + 1
            if lines > DOCSTRING_LIMIT:
                long[rel(path)] = lines
    assert not long, f"module docstrings over {DOCSTRING_LIMIT} lines: {long}; move the detail to docs/ or to its line"


def test_every_file_of_code_is_a_one_sitting_read():
    """One idea per file, each read in one sitting: a file of minigrpo/, bench/, scripts/ or the top-level scripts
    that grows past 450 lines holds more than one idea; split it by idea (not by line count)."""
    paths = [*glob.glob(os.path.join(ROOT, "minigrpo", "**", "*.py"), recursive=True),
             *glob.glob(os.path.join(ROOT, "bench", "*.py")), *glob.glob(os.path.join(ROOT, "scripts", "*.py")),
             *glob.glob(os.path.join(ROOT, "*.py"))]
    long = {rel(p): n for p in sorted(paths) if (n := read(p).count("\n")) > FILE_LIMIT}
    assert not long, f"files over {FILE_LIMIT} lines: {long}; split each by what it is for"


# ----------------------------------------------------------------------------------------------------------------
# nothing points outside the repository

# spelled in pieces so that this file does not match itself
OUTSIDE = re.compile("|".join(["shar" + r"ed/", "PIT" + "FALLS", "QW" + r"EN\.md", "DES" + r"IGN\.md",
                               "STY" + r"LE\.md", r"\biss" + r"ue \d"]))


def test_nothing_refers_to_a_document_outside_the_repository():
    bad = []
    for path in repo_files((".py", ".md")):
        for n, line in enumerate(read(path).splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{rel(path)}:{n}: {line.strip()[:100]}")
    assert not bad, "references to documents a user does not have:\n" + "\n".join(bad)


def test_the_walk_finds_what_it_should():
    """The patterns themselves: a missing path, a wrong flag and an outside reference are each seen."""
    text = ("Run `python train.py --task synthetic --no-such-flag` and read minigrpo/no_such.py, "
            "[a link](docs/missing.md).\n```bash\npython mdp.py baselines \\\n  --per-cell 64  # a comment --x\n```")
    assert list(commands(text)) == [("train.py", None, ["--task", "--no-such-flag"]),
                                    ("mdp.py", "baselines", ["--per-cell"])]
    assert list(named_paths(text)) == ["minigrpo/no_such.py", "docs/missing.md"]
    assert OUTSIDE.search("see " + "PIT" + "FALLS 9") and not OUTSIDE.search("derive_seed(seed, 9)")
