"""The lookup task: the answer is held by a tool, so a policy scores only if it calls the tool before it answers.

    user       what is qx?                                  a key of two letters; its value is in no prompt
    assistant  <tool_call>                                  the policy calls lookup in Qwen's JSON format
               {"name": "lookup", "arguments": {"key": "qx"}}
               </tool_call>
    tool       417                                          the environment answers from its table
    assistant  417                                          a turn without a call is the final answer

Reward 1 for a final answer equal to the asked key's value, else 0. Every key has a value of three digits drawn
for it alone, and the splits share neither keys nor values (`split_tables`): a policy that answers without
calling can only guess, and a pretraining on the "pretrain" split cannot teach a single eval answer. A call
with another key gets that key's value (a wrong answer, if the policy copies it); a key no table holds gets
"no such key". Malformed calls (bad JSON, an unknown tool, arguments other than one string "key") are answered
with what is wrong and counted; the turn cap (`last`) ends the episode at once, with 0 unless that turn is an
answer.

Everything is short on purpose: the demonstration model reads bytes, so every character is a token, and a
whole episode is 168 of them. That is also why the Qwen `# Tools` block (570 bytes of schema and instructions in
the system turn) is not rendered by default (`show_tools=False`): the pretraining teaches the tiny model the call
format instead. A real Qwen should see it: LookupTask(show_tools=True).

Tool results go back into the prompt, so what the environment shows is neutralised (`neutral`): a key the policy
made up cannot spell a control token or a tool tag there. The environment follows the multi-turn loop's interface
(minigrpo/tasks/episodes.py): task.env(example, family) -> an episode with messages(), step(text, last) -> Reply,
close(); it parses calls in the format of the tokenizer's `family` (Qwen3's JSON, the tiny model's; Qwen3.5's
XML). The CPU demonstration that GRPO teaches a tiny model to use the tool: minigrpo/experiments/tool_pipeline.py.
"""
import itertools
import json

import numpy as np

from minigrpo.metrics import mean
from minigrpo.seeds import derive_seed
from minigrpo.tasks import episodes
from minigrpo.tasks.episodes import Reply
from minigrpo.toolcalls import calls_json, calls_xml, parse_tool_calls

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPLITS = {"eval": 128, "val": 32, "train": 192}     # keys per split; the other 324 of 676 are "pretrain"
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "The value of a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
TOOLS = [LOOKUP]
ECHO = 12           # at most this many characters of a policy's key are echoed back in "no such key"


def split_tables(seed: int = 0) -> dict:
    """{split: {key: value}}: a seeded partition of the 676 two-letter keys into eval, val, train and pretrain,
    and of the 1000 three-digit values likewise, one value per key; no key or value is in two splits."""
    keys = ["".join(p) for p in itertools.product(LETTERS, repeat=2)]
    key_order = np.random.default_rng(derive_seed(seed, "lookup keys")).permutation(len(keys))
    value_order = np.random.default_rng(derive_seed(seed, "lookup values")).permutation(1000)
    sizes = {**SPLITS, "pretrain": len(keys) - sum(SPLITS.values())}
    tables, start = {}, 0
    for split, n in sizes.items():
        tables[split] = {keys[k]: f"{v:03d}" for k, v in zip(key_order[start:start + n], value_order[start:start + n])}
        start += n
    return tables


def question(key: str) -> str:
    return f"what is {key}?"


def call_text(key, family: str = "qwen3") -> str:
    """The lookup call for `key` as a policy turn writes it in `family`'s format (and the template renders it)."""
    call = [{"name": "lookup", "arguments": {"key": key}}]
    return calls_xml(call, "") if family == "qwen3_5" else calls_json(call, False, raw_strings=True)


def neutral(text: str) -> str:
    """An observation that cannot fake a turn or a tool result: control-token strings and the tool tags are
    broken with a space (the tokenizer would read "<|im_end|>" in a tool message as the real control token)."""
    for tag in ("<|", "|>", "<tool_", "</tool_"):
        text = text.replace(tag, tag[0] + " " + tag[1:])
    return text


class LookupEnv:
    """One episode of one example: the split's table, the asked key, and what the policy did so far."""

    def __init__(self, ex: dict, table: dict, family: str = "qwen3"):
        if family not in ("qwen2", "qwen3", "qwen3_5"):
            raise ValueError(f"lookup env: family {family!r}: expected qwen2, qwen3 or qwen3_5")
        self.ex, self.table, self.family = ex, table, family
        self.turns = self.calls = self.right_calls = self.errors = 0
        self.done, self.score = False, None              # the score, once done

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": question(self.ex["key"])}]

    def step(self, text: str, last: bool):
        if self.done:
            raise RuntimeError("lookup env: step() after the episode ended")
        self.turns += 1
        calls, errors = parse_tool_calls(text, TOOLS, "qwen3_5" if self.family == "qwen3_5" else "qwen3")
        if not calls and not errors:                    # no call: the final answer
            return self.end(Reply([], done=True, score=float(text.strip() == self.ex["value"])), True)
        replies, made = [], 0
        for call in calls:
            args = call["arguments"]
            if set(args) != {"key"} or not isinstance(args["key"], str):
                errors.append(f"lookup takes one argument, a string 'key'; got {json.dumps(args)[:40]}")
                continue
            made += 1
            self.right_calls += args["key"] == self.ex["key"]
            found = self.table.get(args["key"])
            replies.append(found if found is not None else f"no such key {args['key'][:ECHO]!r}")
        self.calls, self.errors = self.calls + made, self.errors + len(errors)
        replies += [f"error: {e}" for e in errors]
        messages = [{"role": "tool", "content": neutral(r)} for r in replies]
        reply = Reply(messages, done=last, score=0.0 if last else None)   # the cap, a call pending: no answer, 0
        return self.end(reply, False, made, len(errors))

    def end(self, reply, answered: bool, calls: int = 0, errors: int = 0):
        """`reply` with this turn's info: its calls and malformed calls, and the episode's totals so far (the
        metrics read them from the last turn, info["done"])."""
        self.done, self.score = reply.done, reply.score
        reply.info.update(tool_calls=calls, tool_errors=errors, answered=answered, done=reply.done,
                          episode_turns=self.turns, episode_calls=self.calls, episode_right_calls=self.right_calls,
                          episode_errors=self.errors)
        return reply

    def close(self):
        self.done = True                                # nothing to free: the table is the task's


class LookupTask:
    name = "lookup"
    stop_strings: list[str] = []
    chunk = None                    # every episode of a step in one sampler call per turn: the tool answers at once
    per_turn_advantage = False      # an episode is one trained sequence, one member of its key's group

    def __init__(self, seed: int = 0, max_turns: int = 3, show_tools: bool = False):
        self.tables = split_tables(seed)               # fixed by `seed` alone: every run sees one eval set
        self.max_turns = max_turns                     # call, perhaps a second call, answer
        self.tools = TOOLS if show_tools else None     # rendered into the system turn by the loop (module doc)

    def examples(self, split: str) -> list[dict]:
        if split not in self.tables:
            raise ValueError(f"lookup task split {split!r}: expected train, val, eval or pretrain")
        return [{"id": f"{split}-{k}", "split": split, "key": k, "value": v} for k, v in self.tables[split].items()]

    def env(self, ex: dict, family: str = "qwen3") -> LookupEnv:
        return LookupEnv(ex, self.tables[ex["split"]], family)

    def rollout(self, generate, tok, examples, seeds, args):
        return episodes.rollout(self, generate, tok, examples, seeds, args)

    def step_metrics(self, seqs) -> dict:
        return episode_metrics(seqs)


def episode_metrics(seqs) -> dict:
    """Per episode (its last turn's info holds the totals): success, the share that made a well-formed call,
    the share that called with the asked key, malformed calls and turns per episode."""
    last = [s for s in seqs if s.info.get("done")]
    if not last:
        return {}
    return {"success": mean([s.score for s in last]),
            "called": mean([float(s.info["episode_calls"] > 0) for s in last]),
            "right_key": mean([float(s.info["episode_right_calls"] > 0) for s in last]),
            "tool_errors": mean([s.info["episode_errors"] for s in last]),
            "turns": mean([s.info["episode_turns"] for s in last])}
