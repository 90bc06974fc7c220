"""The layering rules: scripts at the top import the library; minigrpo/ never imports a top-level script; the core
(the modules directly in minigrpo/) imports no wing (the subpackages: judge, tasks, experiments, run, evals); and no
two modules import each other, through any chain. Every module under minigrpo/ is parsed, imports inside functions
included: each may import only the standard library, the run-time dependencies and minigrpo itself."""
import ast
import os
import subprocess
import sys

from repo_root import ROOT

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


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def minigrpo_imports(path, modules):
    """The minigrpo modules the file imports, anywhere in it: `from a.b import c` names module a.b.c when that is a
    module, else a.b; relative imports are resolved against the file's package."""
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:           # an imported name inside a module: the module
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def import_graph():
    modules = {module_name(p): p for p in library_files()}
    return {m: minigrpo_imports(p, modules) for m, p in modules.items()}


def circles(graph):
    """Every import circle, each as the chain of modules that closes it (depth-first search)."""
    found, state = [], {}

    def visit(m, chain):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                found.append(chain[chain.index(n):] + [n])
            elif n not in state:
                visit(n, chain + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_no_import_circle_not_even_through_a_function_level_import():
    graph = import_graph()
    assert not circles(graph), "\n".join(" -> ".join(c) for c in circles(graph))
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]      # the search finds one


def test_the_core_imports_no_wing():
    graph = import_graph()
    core = {m for m in graph if m.count(".") == 1 and not os.path.isdir(os.path.join(LIBRARY, m.split(".")[1]))}
    wings = {m.split(".")[1] for m in graph if m.count(".") >= 1} - {m.split(".")[1] for m in core}
    assert {"judge", "tasks", "experiments", "run", "evals"} <= wings and {"model", "grpo", "sampler"} <= \
        {m.split(".")[1] for m in core}
    bad = [f"{m} imports {n}" for m in sorted(core) for n in sorted(graph[m]) if n not in core and n != "minigrpo"]
    assert not bad, "\n".join(bad)


def test_train_py_runs_once_for_the_mdp_pipeline():
    """`python train.py --task mdp` hands the pipeline this very file's train(): no second copy imported as `train`
    (the pipeline itself is replaced by a probe here; tests/experiments/test_mdp_pipeline.py runs it)."""
    probe = ("import runpy, sys\n"
             "import minigrpo.experiments.mdp_pipeline as P\n"
             "P.run_pipeline = lambda args, trainer: print(trainer.__module__, 'train' in sys.modules)\n"
             "sys.argv = ['train.py', '--task', 'mdp', '--model', 'tiny', '--quiet']\n"
             "runpy.run_path('train.py', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["__main__", "False"]


# The core a reader starts with: it imports with torch and numpy alone (the files, the tokenizer, the hub and the
# plots are other modules), so a learner can run it, and its tests, after `pip install torch numpy`; pretrained
# with it, which builds the tiny models those tests run on.
TORCH_ONLY_CORE = ["model", "lora", "sampler", "static_decode", "logprobs", "attention", "deltanet", "grpo", "losses",
                   "pretrained"]
NOT_IN_THE_TIER = sorted(RUNTIME - {"torch", "numpy"} | OPTIONAL | {"transformers", "peft"})


def run_with_packages_blocked(code, blocked, env=None):
    """Run `code` in a fresh interpreter in which any of `blocked` is missing (importing it raises
    ModuleNotFoundError, as when it is not installed)."""
    blocker = ("import importlib, importlib.abc, sys\n"
               f"BLOCKED = {sorted(blocked)!r}\n"
               "class Blocker(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in BLOCKED:\n"
               "            raise ModuleNotFoundError(f'{name} is blocked: not torch, numpy or the standard library')\n"
               "sys.meta_path.insert(0, Blocker())\n")
    return subprocess.run([sys.executable, "-c", blocker + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_core_imports_with_torch_and_numpy_alone():
    modules = [f"minigrpo.{m}" for m in TORCH_ONLY_CORE]
    out = run_with_packages_blocked(f"for m in {modules!r}:\n    importlib.import_module(m)\n    print(m)\n",
                                    NOT_IN_THE_TIER)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == modules
    # the probe does block: the files of LoRA need safetensors
    out = run_with_packages_blocked("import minigrpo.run.lora_files\n", NOT_IN_THE_TIER)
    assert out.returncode != 0 and "safetensors is blocked" in out.stderr, out.stderr[-2000:]
