"""The reference runs' settings, one preset per task (soyuz, gsm8k and mdp on a GPU; synthetic and revise on a CPU).
train.py applies a task's preset as its parser defaults (any flag overrides it); eval.py takes the model and
max_new_tokens from it. docs/presets.md says why each value a reference run leaves open was chosen. The mdp task's
stage settings are its pipeline's own (minigrpo/experiments/mdp_pipeline.py PIPELINES)."""

PRESETS = {
    # The CPU quickstart (bench/synthetic.py measures it; the letters: tasks/synthetic.py). Groups of 32 keep
    # sampling a rarer right letter; lr 3e-3 lets the policy sharpen no faster than it learns; the cosine to 0
    # stops it moving once it has learned (docs/presets.md has the runs behind each value).
    "synthetic": dict(model="tiny", lora_r=0, group_size=32, tasks_per_step=4, steps=160, lr=3e-3, warmup=2,
                      schedule="cosine", max_new_tokens=8, temperature=1.0, micro_batch=64, save_every=20),
    "soyuz": dict(model="Qwen/Qwen3.5-4B", lora_r=32, lora_alpha=32, group_size=6, tasks_per_step=4, epochs=2,
                  lr=1e-5, warmup=2, beta=0.04, max_new_tokens=1024, temperature=1.0, micro_batch=4,
                  save_every=5, judge="local",
                  grad_checkpoint=True),   # its revision turn's activations fit no GPU without it (docs/memory.md)
    "gsm8k": dict(model="Qwen/Qwen3-1.7B-Base", lora_r=32, lora_alpha=32, group_size=4, tasks_per_step=1,
                  epochs=1, lr=5e-6, warmup=0.1, schedule="cosine", weight_decay=0.1, adam_beta2=0.99,
                  max_grad_norm=0.1, beta=0.001, agg="token", temperature=0.8, max_new_tokens=512,
                  eps_high=0.2, micro_batch=4, save_every=500),
    "mdp": dict(model="tiny"),
    # agentic: the shell exercises of tasks/terminal/, 12 episodes of up to 8 turns per exercise (docs/presets.md:
    # why 12); an episode trains as one sequence of its whole conversation (up to ~13k tokens), hence the micro-batch
    # of one and the checkpointing
    "terminal": dict(model="Qwen/Qwen3.5-4B", lora_r=32, lora_alpha=32, group_size=12, tasks_per_step=4, epochs=4,
                     lr=2e-5, warmup=2, beta=0.04, max_new_tokens=384, temperature=1.0, micro_batch=1,
                     save_every=5, grad_checkpoint=True),
    # the revise experiment's GRPO arms (minigrpo/experiments/revise_pipeline.py): full fine-tune of the pretrained tiny
    # base; 4 letters-to-sort prompts x G=8 per step, two turns each; an answer is at most 6 letters + <|im_end|>
    "revise": dict(model="tiny", lora_r=0, group_size=8, tasks_per_step=4, steps=100, lr=3e-4, warmup=2,
                   schedule="constant", max_new_tokens=8, temperature=1.0, micro_batch=64, save_every=100),
}

QUICKSTART = "python train.py --task synthetic --model tiny"


def gpu_preset_note(task: str, model: str, device_type: str) -> str | None:
    """On a device other than CUDA, for a preset sized for a GPU (its model a hub checkpoint) run with that model:
    a sentence that says so and what runs on a CPU instead; None otherwise."""
    preset_model = PRESETS.get(task, {}).get("model", "")
    if device_type == "cuda" or model != preset_model or "/" not in preset_model:
        return None
    return (f"the {task} preset is sized for a GPU ({preset_model}); on a CPU run the quickstart (`{QUICKSTART}`), "
            f"or this task's code on the tiny model (`python train.py --task {task} --model tiny`)")
