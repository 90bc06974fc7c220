"""The layering rule (DESIGN.md): scripts at the top import the library; minigrpo/ never imports a top-level script.
Every module under minigrpo/ is parsed, imports inside functions included: each may import only the standard
library, the run-time dependencies and minigrpo itself."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(ROOT, "minigrpo")
RUNTIME = {"torch", "tokenizers", "safetensors", "huggingface_hub", "numpy", "tqdm", "matplotlib", "regex"}   # pyproject
OPTIONAL = {"pyarrow",   # gsm8k's parquet reader, imported on use with an actionable error when missing
            "pandas",    # the judge's wire decodes a DataFrame an answer returns, only when one crosses
            "wandb"}     # train.py --log-to wandb, imported on use; checked at start with an actionable error
TOP_LEVEL = {os.path.splitext(n)[0] for n in os.listdir(ROOT) if n.endswith(".py") or
             os.path.isdir(os.path.join(ROOT, n))} - {"minigrpo"}    # train, eval, judge, mdp, bench, tests, ...


def absolute_imports(path):
    """(line, top-level module name) of every absolute import in the file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.lineno, node.module.split(".")[0]


def library_files():
    for folder, _, files in os.walk(LIBRARY):
        yield from (os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))


def test_the_library_imports_no_script_and_nothing_undeclared():
    allowed = RUNTIME | OPTIONAL | {"minigrpo"} | set(sys.stdlib_module_names)
    bad = [f"{os.path.relpath(path, ROOT)}:{line} imports {name}" for path in library_files()
           for line, name in absolute_imports(path) if name in TOP_LEVEL or name not in allowed]
    assert not bad, "\n".join(bad)
    assert len(list(library_files())) > 20          # the walk found the package


def test_train_py_runs_once_for_the_mdp_pipeline():
    """`python train.py --task mdp` hands the pipeline this very file's train(): no second copy imported as `train`
    (the pipeline itself is replaced by a probe here; tests/test_mdp_pipeline.py runs it)."""
    probe = ("import runpy, sys\n"
             "import minigrpo.tasks.mdp_pipeline as P\n"
             "P.run_pipeline = lambda args, trainer: print(trainer.__module__, 'train' in sys.modules)\n"
             "sys.argv = ['train.py', '--task', 'mdp', '--model', 'tiny', '--quiet']\n"
             "runpy.run_path('train.py', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["__main__", "False"]
