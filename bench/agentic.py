"""Agentic episodes through the real training loop: tokens prefilled, tokens the trainer forwards and trains, and
time per step, against an anchor checkout in the same run.

    python bench/agentic.py                                    # this checkout only
    python bench/agentic.py --anchor ../minigrpo-795f886       # and an older checkout (`git worktree add DIR 795f886`)
    python bench/agentic.py --exercises 2 --group 4 --steps 3 --repeats 2 --threads 1    # the defaults

The workload is terminal-shaped and scripted, so that both checkouts see the same environment: --exercises
exercises x --group episodes a step, on the tiny hybrid model (`--model tiny-qwen3.5`: random weights, byte-level
tokenizer, 3 Gated DeltaNet layers and 1 attention layer), 7 policy turns an episode, each turn at most
--max-new-tokens (48) new tokens (the random policy ends a turn by length or EOS). The environment ignores what the
policy wrote and answers every turn with 200-320 bytes of shell-like output derived from the exercise, the episode
and the turn; the seventh turn ends the episode with a score that differs across the G episodes of an exercise
(so the advantages are not zero and the trainer runs a real backward). The task renders a shell tool in its system
turn, as --task terminal does.

Each checkout runs in a fresh process (sys.path starts with its root, then its own code is imported): its own
flags (minigrpo/run/flags.py resolve_args of `--task synthetic --model tiny-qwen3.5` with LoRA r=8, beta 0.04,
micro-batch 1 as --task terminal's preset, fp32 on the CPU), its own train.train(args, task=...) loop, and the
scripted task's rollout handing its own minigrpo/tasks/episodes.py rollout a sampler that counts. Per step:

- prefilled: per sampler call, each prompt's length minus the tokens its first Sample took from a kept state
  (Sample.reused, where the checkout has it); the G samples of a prompt share one prefill at both commits.
- forwarded (policy / reference): attention-mask ones of every trainer log-prob call (minigrpo/update.py's
  token_logprobs, patched where update.py looks it up); a call under no_grad is the reference's (beta > 0).
- trained: loss-mask ones over the step's micro-batches (train.py's collate, wrapped); sequences: how many.
- time: the loop's own metrics.jsonl phases: time_sample (rollout, time_generate of it in the sampler) and
  time_reference + time_policy + time_optimizer (the update). Step 1 pays one-time costs; the time columns are the
  median of steps 2..S (step 1 if S = 1), the counts the mean over all S steps.

The runs alternate (anchor, ours, anchor, ours, ...) so that a load change on a shared machine hits both; the table
gives each checkout's median over --repeats and the ratio ours / anchor. Each checkout's memory plan for the real
terminal run (`python train.py --task terminal --plan`: Qwen3.5-4B) is run once, and its **peak, checkpointing**
line printed beside the table. Numbers measured on a 2-core CPU are in docs/benchmarks.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TURNS = 7
SYSTEM = ("You are working in a Linux shell. You have one tool, `shell`, which runs a bash command in your working "
          "folder and returns its output (stdout and stderr together) and its exit code. Work step by step, one or "
          "a few commands per turn, and check your work. When the task is done, reply without any tool call.")
SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a bash command in the working folder and return its output and exit code.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"]}}}
NAMES = ["access.log", "config.yaml", "data.csv", "main.py", "notes.txt", "report.md", "run.sh", "util.py"]


# ----------------------------------------------------------------------------------------------------------------
# the scripted workload (the same bytes for every checkout)


def tool_output(exercise, episode, turn) -> str:
    """A listing-like tool reply of 200-320 bytes, a function of (exercise, episode, turn) only."""
    h = zlib.crc32(f"{exercise}/{episode}/{turn}".encode())
    lines, n = [f"$ ls -l src/{turn}"], 0
    while sum(len(x) + 1 for x in lines) < 200 + h % 120:
        size = zlib.crc32(f"{h}/{n}".encode()) % 100000
        lines.append(f"-rw-r--r-- 1 agent agent {size:6d} Dec  3 16:{(h + n) % 60:02d} {NAMES[(h + n) % len(NAMES)]}")
        n += 1
    return "\n".join(lines)[:200 + h % 120] + f"\n[exit code {h % 3}]"


class ScriptedEnv:
    """One episode: the prompt, then a tool reply to every turn; the last turn scores episode / (G - 1)."""

    def __init__(self, exercise, episode, group):
        self.exercise, self.episode, self.group, self.turn = exercise, episode, group, 0

    def messages(self):
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Exercise {self.exercise}: count the lines of every file under src/ "
                                            f"and write the total to total.txt."}]

    def step(self, text, last):
        from minigrpo.tasks.episodes import Reply       # the checkout's own, imported after its root is on sys.path
        self.turn += 1
        if last or self.turn >= TURNS:
            return Reply(done=True, score=self.episode / (self.group - 1), info={"ended": "turn cap"})
        return Reply(messages=[{"role": "tool", "content": tool_output(self.exercise, self.episode, self.turn)}])

    def close(self):
        pass


class ScriptedTask:
    """The task the loop trains on: `exercises` examples, TURNS-turn episodes through the checkout's episodes.rollout,
    one exercise per sampler call (as --task terminal), a trajectory reward. `counts` gets one record per rollout."""
    name = "agentic-bench"
    max_turns = turns = TURNS
    tools = [SHELL]
    stop_strings: list = []
    chunk = 1
    workers = None
    per_turn_advantage = False

    def __init__(self, exercises, group):
        self.n, self.group, self.opened, self.counts = exercises, group, {}, []

    def examples(self, split):
        return [{"id": f"{split}-{i}"} for i in range(self.n)]

    def env(self, ex, family=None):
        k = self.opened.get(ex["id"], 0)                 # the loop opens an exercise's G episodes in order
        self.opened[ex["id"]] = k + 1
        return ScriptedEnv(ex["id"], k % self.group, self.group)

    def rollout(self, generate, tok, examples, seeds, args):
        from minigrpo.tasks import episodes
        self.counts.append(new_record())
        seqs = episodes.rollout(self, counting_sampler(generate, self.counts[-1]), tok, examples, seeds, args)
        count_continuing(seqs, self.counts[-1])
        return seqs

    def details(self, ex, completion):
        return {}

    def step_metrics(self, seqs):
        return {}


# ----------------------------------------------------------------------------------------------------------------
# counting


def new_record():
    return {"sampler_calls": 0, "prompts": 0, "prompt_tokens": 0, "prefilled": 0, "policy_forwarded": 0,
            "reference_forwarded": 0, "trained": 0, "sequences": 0, "later_turns": 0, "continuing": 0}


def counting_sampler(generate, rec):
    """`generate` (the sampler callable a rollout gets), counting each prompt's prefill into rec: its length, less
    what its first Sample continued from a kept state (a checkout without `reused` prefills it all)."""
    def sampler(prompts, seeds, n, **kw):
        groups = generate(prompts, seeds, n, **kw)
        rec["sampler_calls"] += 1
        for prompt, group in zip(prompts, groups):
            rec["prompts"] += 1
            rec["prompt_tokens"] += len(prompt)
            rec["prefilled"] += len(prompt) - getattr(group[0], "reused", 0)
        return groups
    return sampler


def count_continuing(seqs, rec):
    """How many turns after the first have a prompt that starts with the previous turn's prompt + sampled tokens:
    the turns a kept state could continue (a re-rendered conversation may change earlier tokens)."""
    last = {}
    for s in seqs:                                      # an episode's turns are in order
        if getattr(s, "trained", None) is not None:     # one Seq per episode: its later turns, less those prefilled
            later = len(s.info["turns"]) - 1            # from their start (the loop counts them)
            rec["later_turns"] += later
            rec["continuing"] += later - s.info["fresh_prefills"]
            continue
        key = (s.example_id, s.episode)
        if key in last:
            ids = last[key].prompt_ids + last[key].completion_ids
            rec["later_turns"] += 1
            rec["continuing"] += s.prompt_ids[:len(ids)] == ids
        last[key] = s


def counting_logprobs(token_logprobs, records):
    """token_logprobs, counting attention-mask ones into records[-1]: under no_grad the reference's, else the
    policy's (with mu = 1 the trainer computes no old log-probs)."""
    import torch

    def wrapped(model, input_ids, attention_mask=None, *a, **kw):
        ones = int(attention_mask.sum()) if attention_mask is not None else input_ids.numel()
        records[-1]["policy_forwarded" if torch.is_grad_enabled() else "reference_forwarded"] += ones
        return token_logprobs(model, input_ids, attention_mask, *a, **kw)
    return wrapped


def counting_collate(collate, records):
    """train.py's collate, counting each micro-batch's sequences and loss-mask ones into records[-1]."""
    def wrapped(seqs, *a, **kw):
        b = collate(seqs, *a, **kw)
        records[-1]["sequences"] += len(seqs)
        records[-1]["trained"] += int(b.mask.sum())
        return b
    return wrapped


# ----------------------------------------------------------------------------------------------------------------
# one checkout in one process


def flags(args, runs_dir):
    return ["--task", "synthetic", "--model", "tiny-qwen3.5", "--lora-r", "8", "--beta", "0.04", "--micro-batch", "1",
            "--steps", str(args.steps), "--group-size", str(args.group), "--tasks-per-step", str(args.exercises),
            "--max-new-tokens", str(args.max_new_tokens), "--device", "cpu", "--dtype", "float32", "--runs-dir",
            runs_dir, "--run-name", "agentic", "--save-every", str(args.steps), "--quiet"]


def child(root, args):
    """Train args.steps steps of the scripted task with root's code; {"steps": [record per step]}."""
    sys.path.insert(0, root)
    import torch
    torch.set_num_threads(args.threads)
    import train
    import minigrpo.update as update
    from minigrpo.run.flags import resolve_args
    task = ScriptedTask(args.exercises, args.group)
    update.token_logprobs = counting_logprobs(update.token_logprobs, task.counts)
    train.collate = counting_collate(train.collate, task.counts)
    with tempfile.TemporaryDirectory(prefix="minigrpo-agentic-") as runs:
        out = train.train(resolve_args(flags(args, runs)), task=task)
        with open(os.path.join(out["run"], "metrics.jsonl")) as f:
            metrics = [json.loads(line) for line in f]
    for rec, m in zip(task.counts, metrics):
        rec["time_generate"], rec["time_sample"] = m["time_generate"], m["time_sample"]
        rec["time_train"] = m["time_reference"] + m["time_policy"] + m["time_optimizer"]
    return {"steps": task.counts}


def plan_peak(root):
    """root's memory plan of `train.py --task terminal --plan` at G=8 (the preset's group at 795f886): the **peak,
    checkpointing** line's GiB."""
    out = subprocess.run([sys.executable, "train.py", "--task", "terminal", "--plan", "--group-size", "8"], cwd=root,
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("| **peak, checkpointing**"):
            return float(line.split("|")[2].split()[0])
    sys.exit(f"bench/agentic.py: no '**peak, checkpointing**' line in {root}'s train.py --task terminal --plan "
             f"(exit {out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")


def run(root, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", root, "--exercises", str(args.exercises), "--group",
           str(args.group), "--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens), "--threads",
           str(args.threads)]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench/agentic.py: the run with {root} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------------
# the table

COLUMNS = [("prefilled", "tokens prefilled"), ("prompt_tokens", "prompt tokens"), ("sampler_calls", "sampler calls"),
           ("later_turns", "turns after the first"), ("continuing", "of them continuing the last prompt + sample"),
           ("policy_forwarded", "policy fwd tokens"), ("reference_forwarded", "reference fwd tokens"),
           ("trained", "tokens trained"), ("sequences", "sequences"), ("time_sample", "rollout s"),
           ("time_generate", "in sampler s"), ("time_train", "update s")]


def per_step(result):
    """One run's row: counts averaged over its steps, times the median of its steps after the first."""
    steps = result["steps"]
    timed = steps[1:] or steps
    return {k: (statistics.median(s[k] for s in timed) if k.startswith("time") else
                sum(s[k] for s in steps) / len(steps)) for k, _ in COLUMNS}


def table(rows, plans):
    """rows: {checkout: [row per run]} -> markdown, the medians over runs, and ours / anchor."""
    names = list(rows)
    med = {n: {k: statistics.median(r[k] for r in rows[n]) for k, _ in COLUMNS} for n in names}
    lines = [f"| per step | {' | '.join(names)}{' | ours / anchor' if len(names) == 2 else ''} |",
             "|---" * (len(names) + 1 + (len(names) == 2)) + "|"]
    for k, label in COLUMNS:
        cells = [f"{med[n][k]:.2f}" if k.startswith("time") else f"{med[n][k]:,.{0 if med[n][k] % 1 == 0 else 1}f}"
                 for n in names]       # a count is a mean over steps: a fraction shows its first decimal
        if len(names) == 2:
            cells.append(f"{med['ours'][k] / med['anchor'][k]:.2f}x" if med["anchor"][k] else "-")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    cells = [f"{plans[n]:.1f} GiB" for n in names] + ([f"{plans['ours'] / plans['anchor']:.2f}x"] if len(names) == 2
                                                     else [])
    lines.append(f"| terminal --plan peak, checkpointing (Qwen3.5-4B, G=8) | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--anchor", help="another checkout of this repository to run in the same way")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--exercises", type=int, default=2, help="exercises per step")
    p.add_argument("--group", type=int, default=4, help="episodes per exercise (G); at least 2")
    p.add_argument("--steps", type=int, default=3, help="training steps per run")
    p.add_argument("--max-new-tokens", type=int, default=48, help="new tokens per policy turn, at most")
    p.add_argument("--threads", type=int, default=1, help="torch threads in each run")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.group < 2 or min(args.exercises, args.steps, args.repeats, args.max_new_tokens, args.threads) < 1:
        p.error("--group must be >= 2 (the scores must differ inside a group); the other counts >= 1")
    if args.child:
        print(json.dumps(child(os.path.abspath(args.child), args)))
        return
    load0 = os.getloadavg()
    roots = ([("anchor", os.path.abspath(args.anchor))] if args.anchor else []) + [("ours", ROOT)]
    rows = {name: [] for name, _ in roots}
    for i in range(args.repeats):
        for name, root in roots:
            rows[name].append(per_step(run(root, args)))
            r = rows[name][-1]
            print(f"run {i + 1} {name}: prefilled {r['prefilled']:,.0f}, trained {r['trained']:,.0f} in "
                  f"{r['sequences']:.0f} sequences, rollout {r['time_sample']:.2f} s, update {r['time_train']:.2f} s",
                  flush=True)
    plans = {name: plan_peak(root) for name, root in roots}
    print(f"\n{args.exercises} exercises x G={args.group} x {TURNS} turns, <= {args.max_new_tokens} new tokens a "
          f"turn, {args.steps} steps a run, tiny-qwen3.5 fp32, LoRA r=8, beta 0.04, {args.threads} thread(s); "
          f"median of {args.repeats} alternating runs; " + ", ".join(f"{n} = {r}" for n, r in roots))
    print(f"machine: {os.cpu_count()} CPUs, load average {load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end\n")
    print(table(rows, plans))


if __name__ == "__main__":
    main()
