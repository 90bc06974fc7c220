"""tests/core/ is the loss-math tier: `python -m pytest tests/core` runs after only `pip install torch numpy pytest`.
Every file it loads (its test files, the root conftest, the helpers they import from tests/support/, and every
minigrpo module those reach, imports inside functions included) may import only the standard library, torch,
numpy, pytest, minigrpo and those helpers."""
import glob
import os
import re
import sys

from repo_root import ROOT
from test_layering import absolute_imports, library_files, minigrpo_imports, module_name

TIER = ["torch", "numpy", "pytest"]
SUPPORT = os.path.join(ROOT, "tests", "support")


def reached_files(start):
    """The files `start` load, followed through minigrpo modules (with their parent packages) and the helpers."""
    modules = {module_name(p): p for p in library_files()}
    helpers = {os.path.basename(p)[:-3]: p for folder in (SUPPORT, os.path.join(ROOT, "tests", "core"))
               for p in glob.glob(os.path.join(folder, "*.py"))}
    seen, todo = set(), list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += [helpers[name] for _, name in absolute_imports(path) if name in helpers]
        for m in minigrpo_imports(path, modules):
            parts = m.split(".")
            todo += [modules[".".join(parts[:i])] for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules]
    return seen


def test_the_loss_math_tier_imports_only_torch_numpy_and_pytest():
    start = glob.glob(os.path.join(ROOT, "tests", "core", "*.py")) + [os.path.join(ROOT, "tests", "conftest.py")]
    files = reached_files(start)
    helpers = {os.path.basename(p)[:-3] for p in files if not p.startswith(os.path.join(ROOT, "minigrpo"))}
    allowed = set(TIER) | {"minigrpo"} | helpers | set(sys.stdlib_module_names)
    bad = [f"{os.path.relpath(path, ROOT)}:{line} imports {name}" for path in sorted(files)
           for line, name in absolute_imports(path) if name not in allowed]
    assert not bad, "\n".join(bad)
    reached = {os.path.relpath(p, ROOT) for p in files}
    assert {"minigrpo/grpo.py", "minigrpo/losses.py", "minigrpo/logprobs.py", "tests/support/toy_lm.py"} <= reached


def readme_section(title):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read().split(f"\n## {title}\n")[1].split("\n## ")[0]


def test_the_readme_installs_the_tier_with_torchs_cpu_wheel():
    """On Linux PyPI's torch is the CUDA build (gigabytes): the README's loss-math install takes the CPU-only wheel
    from PyTorch's CPU index, pinned as scripts/setup.sh pins it, then the rest of the tier."""
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        pinned = re.search(r'torch_spec="\$\{MINIGRPO_TORCH:-(torch==[\d.]+)\}"', f.read()).group(1)
    section = readme_section("Unit-testing the loss math on a CPU")
    assert f"pip install {pinned} --index-url https://download.pytorch.org/whl/cpu\n" in section
    assert "pip install numpy pytest\n" in section and "python -m pytest tests/core" in section


def test_the_readme_cpu_times_name_their_thread_count():
    """train.py picks its CPU threads from the load (minigrpo/common.py pick_threads): a time means little without
    the count it was measured at."""
    assert re.search(r"with `--threads \d+`", readme_section("CPU demos"))
