"""Helpers the sandbox tests share (tests/judge/sandbox/): the isolation level, skips that name the machine's
weaknesses, and a Python payload run through minigrpo.judge.sandbox.run."""

import json
import sys
import textwrap

import pytest

from minigrpo.judge import sandbox
from minigrpo.judge.sandbox import Limits, run

PY = [sys.executable, "-I", "-c"]


def level():
    return sandbox.isolation()


def need_bwrap():
    name, weak = level()
    if not name.startswith("bwrap"):
        pytest.skip(f"needs bubblewrap (isolation here: {name}; {weak})")


def need_cgroup():
    name, weak = level()
    if "cgroup" not in name:
        pytest.skip(f"needs per-sandbox cgroups (isolation here: {name}; {weak})")


def py(code, files=None, **limits):
    """Run a Python payload; returns (rc, stdout text, cpu, weaknesses)."""
    rc, out, cpu, weak = run(PY + [textwrap.dedent(code)], files or {}, Limits(**{"timeout": 20, **limits}))
    return rc, out.decode("utf-8", "replace"), cpu, weak


def probe_json(code, **limits):
    rc, out, _, _ = py(code, **limits)
    assert rc == 0, out
    return json.loads(out.strip().splitlines()[-1])
