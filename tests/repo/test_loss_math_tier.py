"""The torch-only tier: after only `pip install torch numpy pytest`, `python -m pytest tests/core tests/model -m
"not oracle and not slow"` runs the loss math (tests/core) and the model tests that need no oracle (tests/model, less
those marked oracle or slow). Every file tests/core loads (its test files, the root conftest, the helpers they
import from tests/support/, and every minigrpo module those reach, imports inside functions included) may import
only the standard library, torch, numpy, pytest, minigrpo and those helpers; the whole tier collects the same tests
with every other package blocked."""
import glob
import os
import re
import sys

from repo_root import ROOT
from test_layering import (NOT_IN_THE_TIER, absolute_imports, library_files, minigrpo_imports, module_name,
                           run_with_packages_blocked)

TIER = ["torch", "numpy", "pytest"]
TIER_ARGS = ["tests/core", "tests/model", "-m", "not oracle and not slow"]
TIER_COMMAND = 'OMP_NUM_THREADS=1 python -m pytest tests/core tests/model -m "not oracle and not slow"'  # README
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


def collected(blocked):
    """The test ids the tier collects in a fresh interpreter in which importing any of `blocked` raises, with no
    pytest plugin loaded (as in a venv of torch, numpy and pytest): (returncode, ids, output)."""
    args = TIER_ARGS + ["--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider"]
    out = run_with_packages_blocked(f"import pytest\nsys.exit(pytest.main({args!r}))\n", blocked,
                                    env=dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
    return out.returncode, [line for line in out.stdout.splitlines() if "::" in line], out.stdout + out.stderr


def test_the_torch_only_tier_collects_its_tests_without_the_other_packages():
    """With transformers, peft, tokenizers, safetensors, ... blocked the tier collects without an error, and exactly
    the tests it collects when they are installed: a file that needs one is marked oracle as a whole (and skips
    itself with importorskip), never left half in the tier."""
    code, alone, output = collected(NOT_IN_THE_TIER)
    assert code == 0, output[-3000:]
    code, full, output = collected(set())
    assert code == 0, output[-3000:]
    assert alone == full
    files = {t.split("::")[0] for t in alone}
    assert {"tests/core/test_grpo.py", "tests/model/test_sampler.py", "tests/model/test_lora.py"} <= files
    assert "tests/model/test_model.py" not in files and "tests/run/test_signals.py" not in files
    assert len(alone) > 150


def readme_section(title):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read().split(f"\n## {title}\n")[1].split("\n## ")[0]


def test_the_readme_installs_the_tier_with_torchs_cpu_wheel():
    """On Linux PyPI's torch is the CUDA build (gigabytes): the README's loss-math install takes the CPU-only wheel
    from PyTorch's CPU index, pinned as scripts/setup.sh pins it, then the rest of the tier."""
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        pinned = re.search(r'torch_spec="\$\{MINIGRPO_TORCH:-(torch==[\d.]+)\}"', f.read()).group(1)
    section = readme_section("Testing the core with torch alone")
    assert f"pip install {pinned} --index-url https://download.pytorch.org/whl/cpu\n" in section
    assert "pip install numpy pytest\n" in section and TIER_COMMAND in section


def test_the_readme_cpu_times_name_their_thread_count():
    """train.py picks its CPU threads from the load (minigrpo/machine.py pick_threads): a time means little without
    the count it was measured at."""
    assert re.search(r"with `--threads \d+`", readme_section("CPU demos"))
