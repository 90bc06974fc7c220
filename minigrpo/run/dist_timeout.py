"""How long a rank may wait in a collective for the others under torchrun (the process group's timeout): set from
the run's longest expected phase.

A rank waits while another still works: in the step's rollouts (the ranks' shares of sampling and judging take
different times), in the greedy validation (each rank validates its share of the val examples), and while rank 0
writes a checkpoint. torch's default timeout is 10 minutes under NCCL: a soyuz step whose LLM judge retries, or a
validation decoded eagerly, can take longer, and the healthy run is then killed. What the timeout is for is a hang,
a rank that will never come; torchrun already ends the run when a rank dies, so a generous timeout costs little.

The bound of a phase, from the run's settings (seconds), for the largest share a rank gets:

    sampling   per turn, max_new_tokens decode steps (DECODE_STEP_S, pessimistic: an eager step of a 4B model
               with a long cache; the fast path's is ~25x shorter, FAST_STEP_S 5x its own) per sampler call. A
               single-turn task samples its share in one call; a multi-turn one makes a call per `chunk` examples
               for a task that sets its chunk (terminal), else per a step's examples (run/callsize.py: a step's
               turn is one call, a validation's calls take as many examples); a GPU on which the memory plan
               splits a soyuz turn into two calls stays within the margin
    judging    soyuz: per turn, the share's answers in waves of --judge-workers, each answer at most --judge-timeout
               per try over --judge-retries + 1 tries, with the judge's backoff of 2 s, 4 s, ... between them

timeout = max(MIN_S, MARGIN x the longest phase: a step's rollouts, or with --eval-every the validation).
"""
import math
from datetime import timedelta

from minigrpo.run.dist import world_size
from minigrpo.tasks import task_class

DECODE_STEP_S = 0.25    # seconds per decode step, --decode eager
FAST_STEP_S = 0.05      # the fast path (static shapes, compiled), CUDA's default
MIN_S = 30 * 60         # gloo's own default; never below it
MARGIN = 2


def phase_seconds(args, world, examples, samples) -> float:
    """The bound of one rollout phase over `examples` (the step's or the validation's) with `samples` each."""
    share = math.ceil(examples / world)
    cls = task_class(args.task)
    per_call = (getattr(cls, "chunk", None) or math.ceil(args.tasks_per_step / world)) if cls.turns > 1 else share
    calls = math.ceil(share / per_call) if share else 0
    step_s = DECODE_STEP_S if getattr(args, "decode", None) == "eager" else FAST_STEP_S
    sampling = cls.turns * calls * args.max_new_tokens * step_s
    if args.task != "soyuz" or not share:
        return sampling
    waves = math.ceil(share * samples / args.judge_workers)
    tries = args.judge_retries + 1
    answer = tries * args.judge_timeout + 2 * (2 ** args.judge_retries - 1)
    return sampling + cls.turns * waves * answer


def longest_phase(args, world) -> tuple[str, float]:
    """(its name, its bound in seconds): a step's rollouts, or with --eval-every possibly the validation."""
    phases = {"a step's rollouts": phase_seconds(args, world, args.tasks_per_step, args.group_size)}
    if args.eval_every:
        phases["the validation"] = phase_seconds(args, world, args.eval_limit, 1)
    return max(phases.items(), key=lambda kv: kv[1])


def collective_timeout(args, world=None) -> timedelta | None:
    """The process group's timeout for `world` ranks (default: torchrun's); None for one process, which has no
    group (and may train a task train.py does not name: the pipelines hand it theirs)."""
    world = world or world_size()
    if world == 1:
        return None
    return timedelta(seconds=max(MIN_S, MARGIN * longest_phase(args, world)[1]))


def timeout_note(args, world=None) -> str:
    """The start-up line's words for the timeout ('' for one process: there is no group)."""
    world = world or world_size()
    if world == 1:
        return ""
    name, longest = longest_phase(args, world)
    minutes = collective_timeout(args, world).total_seconds() / 60
    return (f"collective timeout {minutes:.0f} min ({MARGIN}x the longest expected phase, {name}: "
            f"<= {longest / 60:.0f} min)")
