"""A busy host never fails an honest answer: the stall and budget clocks measure the answer's own progress (its CPU
seconds; for a stall, the share of the driver's waits on it in which its threads ran or waited for a CPU, with no
reply of its waiting in the pipe), and wall time only as the last-resort ceiling.

The rule first, against a scripted broker (the readings a starved, a sleeping and a replied answer give); then
whole answers graded with three CPU burners per core beside them, against the same answers on the idle box."""

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from judging import TASKS, fenced, needs_full_sandbox, reference
from minigrpo.judge import driver_answer
from minigrpo.judge.sandbox.procs import demand

# -- the stall rule, on scripted readings ---------------------------------------------------------------------------


class ScriptedBroker:
    """Starts an 'answer' whose channel is two pipes held here, and answers `cpu` with the readings `reading(t)`
    gives for the seconds since the start."""

    def __init__(self, reading):
        self.reading, self.t0 = reading, time.monotonic()
        self.to_driver_r, self.to_driver_w = os.pipe()
        self.to_answer_r, self.to_answer_w = os.pipe()

    def ask(self, op, **request):
        if op == "start":
            return {"id": "s0-answer"}, [self.to_driver_r, self.to_answer_w]
        if op == "cpu":
            cpu, waited, runnable = self.reading(time.monotonic() - self.t0)
            if request.get("demand") is not True:
                return {"cpu": cpu}, []
            return {"cpu": cpu, "waited": waited, "runnable": runnable}, []
        return {}, []


def watched(monkeypatch, reading, seconds=1.2, reply=False, wait_every=None):
    """The failure the watch gives an awaited answer with these readings after `seconds` (STALL_S set to 0.4);
    `wait_every`: the driver ends one wait and begins the next every so many seconds (an answer that calls back)."""
    monkeypatch.setattr(driver_answer, "STALL_S", 0.4)
    broker = ScriptedBroker(reading)
    answer = driver_answer.Answer(broker, 0, cpu_s=100.0)
    answer.awaiting = True          # as while the driver blocks on the answer's pipe
    if reply:
        os.write(broker.to_driver_w, b"\0")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(wait_every or seconds)
        answer.waits += wait_every is not None
    failure = answer.failure
    answer.close()
    for fd in (broker.to_driver_w, broker.to_answer_r):
        os.close(fd)
    return failure


def test_a_sleeping_answer_stalls(monkeypatch):
    assert watched(monkeypatch, lambda t: (1.0, 5_000, False)).startswith("stalled")


def test_an_answer_that_sleeps_and_spins_stalls(monkeypatch):
    # 2 ms of CPU every 0.1 s: its readings change at every other look, yet it ran for 2% of the window
    assert watched(monkeypatch, lambda t: (1.0 + 0.002 * int(t / 0.1), 5_000, False)).startswith("stalled")


def test_an_answer_that_runs_most_of_the_window_is_not_stalled(monkeypatch):
    # 0.7 CPU seconds a second (it blocks on its own I/O for the rest): over the 50% the window asks
    assert watched(monkeypatch, lambda t: (1.0 + 0.7 * t, 5_000, False)) is None


def test_a_burst_of_threads_woken_together_buys_at_most_the_look_it_falls_in(monkeypatch):
    # every 0.2 s a hundred threads wake at once and queue behind each other: 2 s of run-queue wait summed over
    # them, at almost no CPU; counted in full, one burst would fill the window
    assert watched(monkeypatch, lambda t: (1.0, 5_000 + int(t / 0.2) * 2_000_000_000, False)).startswith("stalled")


def test_cpu_counts_where_the_kernel_keeps_no_run_queue_wait(monkeypatch):
    # no schedstat (waited is None): 0.7 CPU seconds a second still meets the share
    assert watched(monkeypatch, lambda t: (1.0 + 0.7 * t, None, False)) is None


def test_idle_time_between_the_drivers_waits_is_not_a_stall(monkeypatch):
    # an answer that polls a stand-in of the driver's every 20 ms and sleeps between (asyncio-bounded-fetch): each
    # wait of the driver is shorter than a look, and the driver's own time between them is not the answer's
    assert watched(monkeypatch, lambda t: (1.0, 5_000, False), wait_every=0.02) is None


def test_an_answer_waiting_for_a_cpu_is_not_stalled(monkeypatch):
    # no CPU gained: the host gives it none, but its threads wait in a run queue (schedstat grows)
    assert watched(monkeypatch, lambda t: (1.0, int(t * 1e9), False)) is None


def test_an_answer_runnable_at_each_look_is_not_stalled(monkeypatch):
    # a kernel without schedstat: the thread's state is R (runnable) at each look
    assert watched(monkeypatch, lambda t: (1.0, None, True)) is None


def test_a_reply_the_driver_has_not_read_is_not_the_answers_stall(monkeypatch):
    # the answer replied and sleeps; the driver is the one starved of CPU
    assert watched(monkeypatch, lambda t: (1.0, 5_000, False), reply=True) is None


def test_demand_is_read_from_the_hosts_proc():
    # what the broker reads for the watch: a busy loop is runnable (R) at every look, a sleeper never is and its
    # run-queue wait does not grow
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    sleeper = subprocess.Popen([sys.executable, "-c", "print(1, flush=True); import time; time.sleep(600)"],
                               stdout=subprocess.PIPE)
    try:
        sleeper.stdout.readline()
        quiet = False
        for _ in range(50):             # on a loaded host it may take a moment to reach its sleep
            first = demand([sleeper.pid])
            time.sleep(0.1)
            quiet = first[1] is False and demand([sleeper.pid]) == first
            if quiet:
                break
        assert quiet
        assert all(demand([busy.pid])[1] is True for _ in range(20))
    finally:
        for p in (busy, sleeper):
            p.kill()
            p.wait()


def test_the_wall_clock_is_only_a_ceiling_far_above_the_cpu_limit():
    # an honest answer near its CPU limit, on a host at ten runnable processes per core, still finishes under it
    for cpu_s in (0.05, 2.0, 6.0, 30.0):
        assert driver_answer.wall_ceiling(cpu_s) >= 10 * cpu_s


# -- whole answers beside burners -----------------------------------------------------------------------------------

@contextmanager
def burners(per_core=3):
    """per_core busy-loop processes per CPU of this host, ended by their own Popen objects."""
    procs = []
    try:
        for _ in range((os.cpu_count() or 1) * per_core):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def outcome(verdict):
    return verdict.score, [(r.id, r.passed, r.reason) for r in verdict.results]


# tasks whose references exercise the stall clock differently: many small calls (interval-merge), pandas' import
# and a CPU budget (pandas-sales-pivot), a memory budget on a 24 MB file (file-handle-leak-fix)
HONEST = ["interval-merge", "pandas-sales-pivot", "file-handle-leak-fix"]


@needs_full_sandbox
def test_honest_answers_score_on_a_busy_host_as_on_an_idle_one(judge):
    idle = {t: outcome(judge.grade(TASKS[t], reference(t))) for t in HONEST}
    with burners():
        busy = {t: outcome(judge.grade(TASKS[t], reference(t))) for t in HONEST}
    assert busy == idle


# interval-merge's correct answer that starts a pool of threads in each call (test_attacks.py's concurrent case)
THREADED_MERGE = """
def merge_intervals(intervals):
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(abs, range(64))) >= 0
    out = []
    for s, e in sorted((a, b) for a, b in intervals):
        if s > e:
            raise ValueError("start after end")
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out
"""
FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"


@needs_full_sandbox
def test_an_honest_answer_beside_a_fork_bomb_on_a_busy_host(judge):
    task = TASKS["interval-merge"]
    with burners():
        bomb = judge.submit(task, fenced(FORK_BOMB))
        time.sleep(0.5)
        honest = judge.submit(task, fenced(THREADED_MERGE))
        assert outcome(honest.result())[0] == 1.0, [r for r in outcome(honest.result())[1] if not r[1]]
        assert bomb.result().score == 0.0


@needs_full_sandbox
@pytest.mark.parametrize("body", ["import time\n    time.sleep(10 ** 6)", "import os\n    os.read(os.pipe()[0], 1)"],
                         ids=["sleep", "blocking_read"])
def test_a_stuck_answer_on_a_busy_host_is_ended_by_the_stall_rule(judge, body):
    # it uses no CPU, so only the stall rule's wall clock ends it: stalled, never the last-resort ceiling
    code = f"def merge_intervals(intervals):\n    {body}"
    with burners():
        verdict = judge.grade(TASKS["interval-merge"], fenced(code))
    reasons = [r.reason for r in verdict.results if r.passed is False and "spent its time budget" not in r.reason]
    assert verdict.score == 0.0 and reasons and all(r.startswith("stalled") for r in reasons), reasons
