"""Python checks of the local judge: an answer's python criteria go to the check driver (minigrpo/judge/driver.py),
started confined by minigrpo/judge/driver_host.py, which runs each criterion's test with the answer in a fresh
sandbox (minigrpo/judge/sandbox/). A criterion passes only when its test ran to the end; anything the answer
causes fails it; "unchecked" (None) only for a declared environment gap (a package the check `requires` is not
installed) or a criterion only the answer's own process could observe ("evidence": "answer").
"""

import functools
import importlib.util

from minigrpo.judge.answer_code import extract_code

_DRIVER_MARGIN = 10.0     # seconds the driver process gets beyond its checks' own time limits (start-up, pandas)


def missing_packages(check):
    """Packages a python check `requires` that this interpreter cannot import: a declared environment gap."""
    return [m for m in check.get("requires", []) if importlib.util.find_spec(m) is None]


# A python check marked "evidence": "answer" decides its criterion from what the answer's own process reports (a
# harness snippet's counters, a fake living beside the answer): the answer can forge that, so it is no evidence.
# Such a criterion is unchecked here: the LLM grades it in hybrid and llm modes, local mode leaves it out.
ANSWER_EVIDENCE = "unchecked: only the answer's own process could observe this (left to an LLM grader)"


def run_python_checks(checks, answer):
    """[(True | False | None, reason), ...] for python checks on one answer, run by one driver process (each
    criterion in a fresh sandbox of its own). None only for a declared environment gap (a package in `requires`
    not installed); anything the answer causes -- or a driver that fails -- fails the criterion."""
    out = [None] * len(checks)
    todo = []
    for i, check in enumerate(checks):
        if check.get("evidence") == "answer":
            out[i] = (None, ANSWER_EVIDENCE)
        elif missing := missing_packages(check):
            out[i] = (None, f"unchecked: package {missing} not installed")
        elif not (code := _target_code(check, answer)).strip():
            out[i] = (False, "no code found (no python/untagged fenced block)")
        else:
            todo.append((i, check, code))
    by_code = {}
    for i, check, code in todo:
        by_code.setdefault(code, []).append((i, check))
    for code, items in by_code.items():
        for (i, _), result in zip(items, _run_driver(code, [check for _, check in items])):
            out[i] = result
    return out


def _run_driver(code, checks):
    from minigrpo.judge.driver_answer import wall_ceiling     # a criterion's timeout is CPU seconds
    from minigrpo.judge.driver_host import run_driver     # here: the driver's host imports the sandbox, which is heavy
    limit = sum(wall_ceiling(float(c.get("timeout", SANDBOX_DEFAULTS["timeout"]))) + 2 for c in checks) + _DRIVER_MARGIN
    try:
        results = run_driver(code, checks, limit)
    except (ValueError, OSError) as e:
        reason = f"the check driver failed ({type(e).__name__}); a failure of the judge never passes"
        return [(False, reason)] * len(checks)
    note = _weaker_note()
    return [(passed, reason + note) for passed, reason in results]


def _weaker_note():
    weak = sandbox_isolation()[1]
    return f" (weaker sandbox: {', '.join(weak)})" if weak else ""


@functools.lru_cache(maxsize=None)
def sandbox_isolation():
    """(level, weaknesses) of the answer sandbox on this machine (probed once)."""
    from minigrpo.judge.sandbox import isolation
    return isolation()


SANDBOX_DEFAULTS = {"timeout": 10.0, "memory_mb": 2048, "fsize_mb": 16, "nproc": 64}


def _target_code(check, answer):
    return extract_code(answer) if check.get("target", "code") == "code" else answer
