"""What a run adds up for its logs: a mean that skips missing values, and the seconds spent in each phase of a step."""
import contextlib
import time


def mean(xs):
    """Mean of the values that are not None; None when there are none (a metric with nothing to average)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


class PhaseClock:
    """Seconds spent in each named phase since the last reset(), added up over its stretches (`with clock("policy"):
    ...`): train.py's one clock, used by its loop and by the functions that run inside a phase of it."""

    def __init__(self):
        self.times, self.opened = {}, {}

    def reset(self):
        """Start a new record (`times` of the one before stays as it was)."""
        self.times, self.opened = {}, {}

    def open(self, name):
        """Start a stretch of `name` that close(name) ends: one that begins in a callback and ends in its caller."""
        self.opened[name] = time.perf_counter()

    def close(self, name):
        t0 = self.opened.pop(name, None)
        if t0 is not None:          # never opened (the callback did not run): nothing spent
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def __call__(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
