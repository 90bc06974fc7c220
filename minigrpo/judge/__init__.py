"""The criteria-checklist judge: the reward of the soyuz run, and a trust boundary.

Public names (what the rest of minigrpo and the scripts import): make_judge, Judge, Verdict, CriterionResult,
load_tasks, validate_task, build_prompt, parse_verdict, InvalidVerdict, BackendError, run_check,
missing_packages, sandbox_isolation. Everything else is the package's own.

    grader.py         the Judge: machine checks first, an LLM grader (backends.py) for the rest, the cache
    backends.py       claude -p, any command, an OpenAI-compatible server
    checks.py         machine checks: text checks; pychecks.py hands python checks to the driver
    driver_host.py    the judge's side of python checks: it starts the driver confined and brokers its sandboxes
    driver.py         the check driver: runs the hidden tests; driver_answer.py is its end of one answer
    standins.py       what a test hands an answer instead of its own objects (a database stays in the driver)
    wire*.py          the plain-data channel between the driver and an answer (wire.py: its codec; wire_rpc.py:
                      requests and the answer's server; wire_values.py, wire_shared.py: library values, shared
                      containers)
    sandbox/          the sandbox: one process tree, contained (host.py, launch.py, mounts.py)

The policy writes the answers, so it is an adversary. The design: three processes, each seeing only what it needs.

    judge (the trainer's uid, often root)   holds the task file, the run folder, the verdict cache, the checkout;
                                            runs no test and no answer code; serves the broker; reads one result
                                            line per criterion, and passes on only the reasons a driver may give
    driver (a pool uid of its own)          runs the hidden tests with its own builtins and globals, in a sandbox
                                            of its own: no checkout, no run folder, no judge environment, a
                                            memory cap; talks to the judge only through its pipes and the broker
    answer (another pool uid, per criterion) runs the answer's code behind the channel, with the criterion's
                                            CPU, memory, process and file limits

Why this design: the answer never runs where anything is decided (so no patch, frame walk or exit of its can
change a verdict); nothing of the driver is reachable from it (plain data by value, call-only functions,
step-only iterators, stand-ins), so the answer cannot run code in the driver; and the driver is confined anyway,
so that a bug in the channel would let an answer decide at most its own grades -- never another sample's, the
checkout, the cache or the host. What decides a criterion is observed outside the answer's process; what only the
answer's process could observe is left to an LLM grader ("evidence": "answer"). docs/judge.md has the whole
threat model: what is contained, and what is not.
"""

from minigrpo.judge.checks import missing_packages, run_check, sandbox_isolation
from minigrpo.judge.grader import (BackendError, CriterionResult, InvalidVerdict, Judge, Verdict, build_prompt,
                                   load_tasks, make_judge, parse_verdict, validate_task)

__all__ = ["make_judge", "Judge", "Verdict", "CriterionResult", "load_tasks", "validate_task", "build_prompt",
           "parse_verdict", "InvalidVerdict", "BackendError", "run_check", "missing_packages", "sandbox_isolation"]
