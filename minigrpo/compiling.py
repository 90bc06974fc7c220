"""torch.compile's one way to fail in minigrpo: a compiled function that raises (no C compiler, no Python headers, a
Triton or inductor error, torch's recompile limit passed) prints one warning line naming the error, and the run goes
on with the uncompiled code, the same math. The failure is remembered per (what, device type, backend), so later
calls do not try again. The static decode step (static_decode.py) and the Gated DeltaNet chunk loop of training
(deltanet.py) both fail this way."""

import sys

import torch

_failed = {}  # (what, device type, backend) -> "Type: message" of the error that stopped it


def failure(what, device, backend="inductor"):
    """The error ("Type: message") that stopped the compiled `what` on this device type, or None."""
    return _failed.get((what, torch.device(device).type, backend))


def give_up(what, device, backend, error, instead):
    """Remember that the compiled `what` failed with `error` and print the one warning line: what failed, where, the
    error, and what runs `instead`. Returns the error as failure() gives it."""
    kind = torch.device(device).type
    _failed[what, kind, backend] = why = describe(error)
    print(f"warning: the compiled {what} failed on {kind} ({why}); {instead}", file=sys.stderr, flush=True)
    return why


def strict():
    """Around a compiled call: past torch's recompile limit a shape was not bucketed or marked dynamic. That is an
    error (give_up's warning), not torch's silent fallback to eager for the rest of the run."""
    return torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)


def describe(error):
    """'Type: first line' of the innermost cause (dynamo wraps a backend's error in BackendCompilerFailed)."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    line = next((x.strip() for x in str(error).splitlines() if x.strip()), "")
    return f"{type(error).__name__}: {line[:200]}"
