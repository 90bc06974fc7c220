"""The reference runs' settings, one preset per task (DESIGN.md's table, shared/seeds). train.py applies a task's
preset as its parser defaults (any flag overrides it); eval.py takes the model and max_new_tokens from it. Where a
seed is silent, the README says why each value was chosen. The mdp task's stage settings are its pipeline's own
(minigrpo/experiments/mdp_pipeline.py PIPELINES)."""

PRESETS = {
    # The CPU quickstart (README "Preset choices"; bench/synthetic.py measures it; the letters: tasks/synthetic.py).
    # Before: lr 5e-3 constant, 8 letters x G=8. Adam moves every weight of a full fine-tune by ~lr a step whatever
    # the gradient's size, so the entropy fell from 5.5 to ~1.5-2 in 40 steps, onto letters picked before the model
    # could read the prompt; the prompts whose letter it stopped writing gave zero-spread groups (25-45% of them,
    # no gradient), noisy 8-sample groups kept pushing it around (grad-norm spikes) and the reward climbed to ~0.5,
    # then fell. Now: each of 4 letters once a step in a group of 32, so a rarer right letter still gets sampled
    # and the group's noise averages out; lr 3e-3 (5e-3 still froze a prompt on a wrong letter in 2 of 8 seeds)
    # so that the policy sharpens no faster than it learns; a cosine to 0, so that it stops moving once it has
    # learned: the reward is >= 0.9 by step ~80 and the last third of the run only holds it.
    "synthetic": dict(model="tiny", lora_r=0, group_size=32, tasks_per_step=4, steps=160, lr=3e-3, warmup=2,
                      schedule="cosine", max_new_tokens=8, temperature=1.0, micro_batch=64, save_every=20),
    "soyuz": dict(model="Qwen/Qwen3.5-4B", lora_r=32, lora_alpha=32, group_size=6, tasks_per_step=4, epochs=2,
                  lr=1e-5, warmup=2, beta=0.04, max_new_tokens=1024, temperature=1.0, micro_batch=4,
                  save_every=5, judge="local",
                  grad_checkpoint=True),   # the memory plan: a 175 GiB peak without it, 25 GiB with it
    "gsm8k": dict(model="Qwen/Qwen3-1.7B-Base", lora_r=32, lora_alpha=32, group_size=4, tasks_per_step=1,
                  epochs=1, lr=5e-6, warmup=0.1, schedule="cosine", weight_decay=0.1, adam_beta2=0.99,
                  max_grad_norm=0.1, beta=0.001, agg="token", temperature=0.8, max_new_tokens=512,
                  eps_high=0.2, micro_batch=4, save_every=500),
    "mdp": dict(model="tiny"),
    # the revise experiment's GRPO arms (minigrpo/experiments/revise_pipeline.py): full fine-tune of the pretrained tiny
    # base; 4 letters-to-sort prompts x G=8 per step, two turns each; an answer is at most 6 letters + <|im_end|>
    "revise": dict(model="tiny", lora_r=0, group_size=8, tasks_per_step=4, steps=100, lr=3e-4, warmup=2,
                   schedule="constant", max_new_tokens=8, temperature=1.0, micro_batch=64, save_every=100),
}
