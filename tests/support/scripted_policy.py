"""A scripted policy for the multi-turn rollout loop (minigrpo/tasks/episodes.py): a `generate(prompts, seeds, n,
reuse, keep)` that keeps no sampler state (each prompt counted as prefilled whole), whose k-th episode of a chunk writes plans[k % len(plans)][t] at its turn
t. The turn is read from the prompt (the count of earlier assistant turns in it); a later turn's episode from its
seed (episodes.turn_seed)."""
from minigrpo.sampler import Sample
from minigrpo.tasks.episodes import turn_seed


def scripted(tok, plans, seeds=range(10), calls=None, turns=9, episodes=8):
    """`seeds`: the examples' seeds the rollout will use; `calls` (a list) records (rows, n, decoded prompts)."""
    episode_of = {turn_seed(s, t, k): k for s in seeds for t in range(1, turns) for k in range(episodes)}

    def generate(prompts, seeds, n, reuse=None, keep=False):
        if calls is not None:
            calls.append((len(prompts), n, [tok.decode(p) for p in prompts]))
        out = []
        for p, seed in zip(prompts, seeds):
            turn = tok.decode(p).count("<|im_start|>assistant") - 1          # the policy turns before this one
            group = []
            for j in range(n):
                text = plans[(j if n > 1 else episode_of[seed]) % len(plans)][turn]
                ids = tok.encode(text) + [tok.im_end_id]
                group.append(Sample(0, ids, [-0.1] * len(ids), "eos", text,
                                    prefilled=len(p) * (j == 0)))     # no reuse: every prompt prefilled whole
            out.append(group)
        return out
    return generate
