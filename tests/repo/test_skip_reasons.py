"""A test that cannot run here says why in the summary line, with what to install: pytest's -rs in the project's
addopts, and a reason on each optional package's importorskip (tensorboard and pyarrow are not in the dev
requirements). Played with both packages blocked, as on a machine that lacks them."""
import re

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
