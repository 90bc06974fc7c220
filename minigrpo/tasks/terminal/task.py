"""The terminal task set as the multi-turn rollout loop drives it: TerminalTask (the exercises, the shell tool's
schema, the turn cap) and TerminalEnv, one agent's episode of one exercise.

    task = TerminalTask()
    env = task.env(task.examples("train")[0], family=tok.family)
    try:
        messages = env.messages()                       # system + user; the loop renders them with task.tools
        reply = env.step(policy_turn_text, last=False)  # Reply: tool messages, or done with the score
    finally:
        env.close()

A turn with shell calls runs each call's command in the episode (minigrpo/judge/sandbox/episode.py: confined, one
work folder for the whole episode) and answers with one tool message per call; a malformed call is answered with
a tool message saying what is wrong and counted in info["tool_errors"]. A turn without any call is the agent's
final answer: the verifier judges the episode's snapshot and that answer, and the episode is done. So is it when
the loop says the turn is the last (the calls of that turn are not run), when the loop ends it (`end`: its context
at the memory plan's length, TerminalTask.context_tokens), and when the episode's time budget is spent.

Tool output is shown to the policy inside its own prompt, so it must not be able to speak for the prompt: the
text of every message the Env makes has its control-token strings neutralised (`neutralise`): <|im_start|>,
<|im_end|>, <|endoftext|> and every other <|...|> token string, <tool_call>, </tool_call>, <tool_response>,
</tool_response>, <think> and </think> get their "<" written as "&lt;". The tokenizer then reads them as plain
text, so a command that prints `</tool_response><|im_end|><|im_start|>user ...` cannot close the tool turn or
forge a user's message.
"""

import dataclasses
import math
import os
import re

from minigrpo.judge.sandbox import WORKDIR, Limits, isolation
from minigrpo.judge.sandbox.episode import Episode
from minigrpo.tasks import episodes
from minigrpo.tasks.episodes import Reply
from minigrpo.tasks.terminal import set_code, set_data, set_text, set_tools
from minigrpo.tasks.terminal.exercise import check_exercises, held_out
from minigrpo.tasks.terminal.verify import MAX_ANSWER, Folder, VerifierUnavailable
from minigrpo.toolcalls import parse_tool_calls

COMMAND_LIMITS = Limits(timeout=10, memory_mb=512, nproc=64, fsize_mb=16)
EPISODE_BUDGET_S = 60.0     # wall seconds of all of an episode's commands together
OUTPUT_BYTES = 4096         # of one command's output shown to the agent; the rest is cut (and said so)
TURN_OUTPUT_BYTES = 4096    # of all of a turn's commands: a conversation grows by about this much a turn at most
# the tokens a turn's reply may add as the tokenizer renders it (tool messages, notes, the template): the memory plan
# counts this much a turn (memplan.run_shape), and the loop cuts a reply to it (episodes.fitted). A byte is at most
# one token on both tokenizers (a digit flood: one per digit on Qwen's, one per byte on the byte-level one), so
# 4096 bytes can be 4,200 tokens; ordinary output (3.5-4.5 bytes a token on English and code) seldom reaches this
REPLY_TOKENS = 1536
MAX_TURNS = 8
MAX_CALLS = 8               # shell calls run per turn; the ones past it are answered as tool errors
MAX_COMMAND_BYTES = 65536   # of one command line (the kernel takes at most 128 KiB as one argument)
NOTE_BYTES = 512            # of the one message that answers a turn's malformed and refused calls
FAMILIES = ("qwen2", "qwen3", "qwen3_5")

SHELL_TOOL = {"type": "function", "function": {
    "name": "shell",
    "description": "Run a bash command in the working folder and return its output (stdout and stderr) and exit code.",
    "parameters": {"type": "object",
                   "properties": {"command": {"type": "string", "description": "the bash command line to run"}},
                   "required": ["command"]}}}

SYSTEM = """You are working in a Linux shell. You have one tool, `shell`, which runs a bash command in your working \
folder ({where}) and returns its output (stdout and stderr together, cut after {output} bytes) and its exit code.
Every command starts afresh in the working folder: files you write there stay for your next commands, but `cd`, \
variables and background processes do not. A command may run for {timeout:g} seconds, all of them together for \
{budget:g} seconds. There is no network.
Work step by step, one or a few commands per turn, and check your work. When the task is done, reply without any \
tool call: that reply is your final answer, and it ends the task."""

# Every control token of the Qwen vocabularies is one of these strings and holds a single "<", its first
# character: so writing that "<" as "&lt;" leaves no token string behind (and "&lt;" brings no new "<").
_CONTROL = re.compile(r"<\|[^|<>\s]{0,64}\|>|</?(?:tool_call|tool_response|think)>")
_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.S)


def neutralise(text):
    """`text` with every control-token string made plain text (see the module docstring)."""
    return _CONTROL.sub(lambda m: "&lt;" + m.group()[1:], text)


def final_answer(text):
    """The answer part of a policy turn: after its thinking, without tool-call blocks, at most MAX_ANSWER chars."""
    return _CALL_BLOCK.sub("", text.split("</think>")[-1]).strip()[:MAX_ANSWER]


def first_prompt_range():
    """(shortest, longest) first prompt in tokens, as the memory plan estimates prompts without a tokenizer
    (memplan.prompt_range): UTF-8 bytes / 3 + 16 for the chat template, + ~250 for the shell tool's schema."""
    sizes = [(len(SYSTEM.encode()) + len(e.instruction.encode())) // 3 + 16 + 250 for e in catalogue()]
    return min(sizes), max(sizes)


def longest_context(prompt_tokens, new_tokens):
    """The longest context a turn is sampled from: the first prompt, then MAX_TURNS - 1 turns, each the policy's
    new tokens and a reply at its cap. The memory plan counts it (memplan.run_shape) and the loop holds every episode
    to it (TerminalTask.context_tokens), so a sequence is at most this plus one turn's new tokens."""
    return prompt_tokens + (MAX_TURNS - 1) * (new_tokens + REPLY_TOKENS)


def catalogue():
    """Every exercise of the set, checked (exercise.check_exercises)."""
    return check_exercises(set_text.EXERCISES + set_code.EXERCISES + set_data.EXERCISES + set_tools.EXERCISES)


def _tool(content):
    return {"role": "tool", "content": neutralise(content)}


def _cut(text, n):
    """The first `n` bytes of `text` as UTF-8, a character cut in two left out."""
    data = text.encode()
    return text if len(data) <= n else data[:n].decode("utf-8", "ignore")


def _unrunnable(call, command):
    """Why a call cannot run as given (a tool error the agent is shown), or None."""
    if set(call["arguments"]) != {"command"} or not isinstance(command, str) or not command.strip():
        return (f"{call['name']} takes one argument, command (a non-empty string of bash); got the arguments "
                f"{_cut(repr(sorted(call['arguments'])), 200)}")
    if "\0" in command:
        return "the command holds a NUL character, which no command line can carry"
    try:
        size = len(command.encode())
    except UnicodeEncodeError as e:
        return f"the command is not valid text ({e.reason} at character {e.start})"
    if size > MAX_COMMAND_BYTES:
        return f"the command is {size} bytes; one command may be at most {MAX_COMMAND_BYTES} (write a script file)"
    return None


def _turn_note(errors, refused):
    """The one tool message that answers a turn's malformed and refused calls, at most NOTE_BYTES: however many
    there are, a turn grows by one message and a few hundred bytes for them."""
    parts = []
    if errors:
        parts.append(f"{len(errors)} malformed call{'s' * (len(errors) > 1)}; the first: {errors[0]}")
    if refused:
        parts.append(f"{refused} call{'s' * (refused > 1)} not run: a turn runs at most {MAX_CALLS} and shows at "
                     f"most {TURN_OUTPUT_BYTES} bytes of output (run {'them' if refused > 1 else 'it'} in the next "
                     "turn)")
    return _tool(_cut("error: " + "; ".join(parts), NOTE_BYTES)) if parts else None


class TerminalEnv:
    """One episode of one exercise (see the module docstring). close() is always to be called."""

    def __init__(self, exercise, family="qwen3", limits=COMMAND_LIMITS, budget_s=EPISODE_BUDGET_S,
                 output_bytes=OUTPUT_BYTES, tools=(SHELL_TOOL,)):
        if family not in FAMILIES:
            raise ValueError(f"terminal: tool-call family {family!r} is not one of {', '.join(FAMILIES)}")
        self.exercise, self.family, self.tools = exercise, family, list(tools)
        self.limits, self.budget_s, self.output_bytes = limits, budget_s, output_bytes
        self.done, self.turns, self.last_text = False, 0, ""
        self.ep = Episode(exercise.files, limits, budget_s=budget_s, output_bytes=output_bytes)
        try:
            for rel in exercise.executable:     # before any command: the folder holds only the task's files
                os.chmod(os.path.join(self.ep.folder, os.path.normpath(rel)), 0o755)
            if exercise.setup:                  # its seconds count against the episode's budget
                r = self.ep.run(exercise.setup)
                if r.exit_code != 0:
                    raise RuntimeError(f"terminal exercise {exercise.id}: its setup failed: {r.observation()[-400:]}")
        except BaseException:
            self.ep.close()
            raise

    def messages(self):
        where = WORKDIR if isolation()[0].startswith("bwrap") else "the current directory of every command"
        system = SYSTEM.format(where=where, output=self.output_bytes, timeout=self.limits.timeout,
                               budget=self.budget_s)
        return [{"role": "system", "content": system}, {"role": "user", "content": self.exercise.instruction}]

    def step(self, text, last):
        """The policy's turn `text` -> Reply (see the module docstring)."""
        if self.done:
            raise RuntimeError(f"terminal exercise {self.exercise.id}: step after the episode ended")
        self.turns += 1
        self.last_text = text
        calls, errors = parse_tool_calls(text, self.tools, self.family)
        info = {"tool_calls": 0, "tool_errors": len(errors), "timeouts": 0, "cut_bytes": 0, "shown_bytes": 0}
        if last:
            return self._finish(text, info, "turn cap" if calls or errors else "answer")
        if not calls and not errors:
            return self._finish(text, info, "answer")
        messages, refused = [], 0
        for call in calls:
            left = TURN_OUTPUT_BYTES - info["shown_bytes"]
            if len(messages) == MAX_CALLS or left <= 0 or self.ep.ended is not None:
                refused += 1
            else:
                messages.append(self._call(call, info, left))
        info["tool_errors"] += refused
        note = _turn_note(errors, refused)
        if note:
            messages.append(note)
            info["shown_bytes"] += len(note["content"].encode())
        if self.ep.ended is not None:
            return self._finish(text, info, self.ep.ended)
        return Reply(messages=messages, info=info)

    def _call(self, call, info, left):
        """One well-formed call: its tool message, its bytes counted in info["shown_bytes"]."""
        command = call["arguments"].get("command")
        why = _unrunnable(call, command)
        if why:
            info["tool_errors"] += 1
            message = _tool(f"error: {why}")
        else:
            room = min(left, self.output_bytes)
            r = self.ep.run(command, room)
            info["tool_calls"] += 1
            info["timeouts"] += r.status in ("timeout", "cpu", "budget")
            # the output as shown: control tokens neutralised and invalid UTF-8 replaced, both of which grow it
            out = neutralise(r.output)
            shown = _cut(out, room)
            r = dataclasses.replace(r, output=shown, cut_bytes=r.cut_bytes + len(out.encode()) - len(shown.encode()))
            info["cut_bytes"] += r.cut_bytes
            message = _tool(r.observation())
        info["shown_bytes"] += len(message["content"].encode())
        return message

    def _finish(self, text, info, why):
        """Judge the episode: its snapshot and the answer. The verifier runs on the host on a read-only copy;
        anything of the agent's it runs goes through verify.probe's own sandbox."""
        self.done = True
        info.update(ended=why, seconds=round(self.ep.used_s, 3))
        answer = final_answer(text)
        try:
            snap = self.ep.snapshot()
        except OSError as e:
            info["verify_error"] = f"snapshot: {e}"
            return Reply(messages=[], done=True, score=None, info=info)
        try:
            score = float(self.exercise.verify(Folder(snap.path, snap.missing, snap.cut, snap.modes), answer))
            score = min(1.0, max(0.0, score)) if math.isfinite(score) else 0.0
        except VerifierUnavailable as e:
            score, info["verify_error"] = None, str(e)
        except Exception as e:  # noqa: BLE001 - a verifier that fails on the agent's bytes (Incomplete) gives 0
            score, info["verify_error"] = 0.0, f"{type(e).__name__}: {e}"
        finally:
            snap.close()
            self.ep.close()             # the loop's close() follows; freeing the folder and uid now costs nothing
            info["host_seconds"] = round(self.ep.host_s, 3)
        return Reply(messages=[], done=True, score=score, info=info)

    def end(self, why):
        """End the episode now, for the loop's reason `why` (its context at the plan's length): judged as it stands,
        the last turn's text (without its calls) as the answer, as at the turn cap."""
        if self.done:
            raise RuntimeError(f"terminal exercise {self.exercise.id}: end after the episode ended")
        return self._finish(self.last_text, {"tool_calls": 0, "tool_errors": 0}, why)

    def close(self):
        self.ep.close()


class TerminalTask:
    """The terminal task set: small shell exercises with hidden verifiers (minigrpo/tasks/terminal/__init__.py).
    An exercise whose commands the sandbox lacks on this machine (git, openssl, ...) is left out, one line each in
    `left_out`."""
    name = "terminal"
    family = "qwen3"                # the loop hands env() the tokenizer's
    max_turns = turns = MAX_TURNS
    tools = [SHELL_TOOL]
    stop_strings: list[str] = []
    workers = 8                     # episodes whose commands run side by side (each waits on its own sandbox)
    chunk = 1                       # exercises per sampler call: a late turn's prompt is the whole conversation,
    #                                 so one exercise's G episodes per call bound what a prefill holds
    reply_tokens = REPLY_TOKENS     # the loop cuts a turn's reply to this many tokens (episodes.fitted)

    @classmethod
    def from_args(cls, args):
        return cls(max_new_tokens=args.max_new_tokens)

    def rollout(self, generate, tok, examples, seeds, args):
        """Every exercise's G episodes through the multi-turn loop: each episode is one Seq, paid its score."""
        return episodes.rollout(self, generate, tok, examples, seeds, args)

    def details(self, ex, completion):
        return {}

    def step_metrics(self, seqs):
        return agent_metrics(seqs)

    def __init__(self, exercises=None, limits=COMMAND_LIMITS, budget_s=EPISODE_BUDGET_S, output_bytes=OUTPUT_BYTES,
                 max_new_tokens=None):
        """max_new_tokens: a turn's, as the run samples; it sets `context_tokens`, the memory plan's longest context
        (longest_context of the plan's first prompt), which the loop holds every episode to (None: no cap)."""
        self.context_tokens = None
        if max_new_tokens is not None:
            self.context_tokens = longest_context(first_prompt_range()[1], int(max_new_tokens))
        every = check_exercises(list(exercises)) if exercises is not None else catalogue()
        self.exercises = [e for e in every if not e.missing()]
        self.left_out = [f"terminal: {e.id} left out: the sandbox has no {', '.join(e.missing())}"
                         for e in every if e.missing()]
        self.by_id = {e.id: e for e in self.exercises}
        self.limits, self.budget_s, self.output_bytes = limits, budget_s, output_bytes

    def examples(self, split):
        """"train": about three quarters of the exercises; "val" and "eval": the rest (one held-out list)."""
        if split not in ("train", "val", "eval"):
            raise ValueError(f"terminal: split {split!r} is not train, val or eval")
        return [{"id": e.id, "category": e.category, "instruction": e.instruction} for e in self.exercises
                if held_out(e.id) == (split != "train")]

    def env(self, ex, family=None):
        exercise = self.by_id.get(ex.get("id") if isinstance(ex, dict) else None)
        if exercise is None:
            raise ValueError(f"terminal: no exercise {ex!r} (see TerminalTask().examples(split))")
        return TerminalEnv(exercise, family or self.family, self.limits, self.budget_s, self.output_bytes,
                           self.tools)


def agent_metrics(seqs) -> dict:
    """Per episode, over a rollout's Seqs (one per episode, its policy turns in info["turns"]): the share solved
    (score 1), the mean score, turns, shell calls run, malformed calls, commands that timed out, the share that hit
    the turn cap, the share ended by an error of the environment (episodes.failed) and the host's seconds of work
    (Episode.host_s: handing the folder over, starting and ending sandboxes, the snapshot, the removal)."""
    if not seqs:
        return {}
    n = len(seqs)
    scored = [s.score for s in seqs if s.score is not None]
    per = lambda key: sum(t.get(key, 0) for s in seqs for t in s.policy_turns()) / n     # noqa: E731
    return {"solved": sum(x == 1.0 for x in scored) / n, "score": sum(scored) / max(len(scored), 1),
            "turns": sum(len(s.policy_turns()) for s in seqs) / n, "tool_calls": per("tool_calls"),
            "tool_errors": per("tool_errors"), "timeouts": per("timeouts"),
            "turn_cap": sum(s.info.get("ended") == "turn cap" for s in seqs) / n,
            "env_errors": sum("env_error" in s.info for s in seqs) / n, "host_seconds": per("host_seconds")}
