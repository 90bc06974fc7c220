"""The summary at the end of every pytest run (the project's addopts) names each test that failed and each that was
skipped, with why and what to install: a reason on each optional package's importorskip (tensorboard and pyarrow
are not in the dev requirements). Played with both packages blocked, as on a machine that lacks them, and with a
test that fails."""
import re
import subprocess
import sys

from repo_root import ROOT
from test_layering import run_with_packages_blocked

TESTS = ["tests/run/test_tracker.py::test_tensorboard_appends_on_resume_and_hides_steps_past_the_checkpoint",
         "tests/tasks/test_gsm8k.py::test_hub_path_with_a_fake_download"]


def test_each_skip_for_a_missing_package_names_it_and_the_pip_line_in_the_summary():
    code = f"import sys, pytest\nsys.exit(pytest.main(['-p', 'no:xdist', '-p', 'no:cacheprovider', *{TESTS!r}]))\n"
    out = run_with_packages_blocked(code, ["tensorboard", "pyarrow"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    skipped = re.findall(r"^SKIPPED \[1\] (tests/\S+?):\d+: (.*)$", out.stdout, re.M)
    assert [path for path, _ in skipped] == ["tests/run/test_tracker.py", "tests/tasks/test_gsm8k.py"], out.stdout
    for (_, reason), package in zip(skipped, ["tensorboard", "pyarrow"]):
        assert reason.startswith(f"{package} is not installed: pip install {package}"), reason


def test_a_failed_test_is_named_in_the_summary(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_fails():\n    assert 1 == 2\n\ndef test_passes():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-c", f"{ROOT}/pyproject.toml", "--rootdir", str(tmp_path),
                          "-p", "no:xdist", "-p", "no:cacheprovider", str(tmp_path / "test_one.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"^FAILED \S*test_one.py::test_fails", out.stdout, re.M), out.stdout[-2000:]
