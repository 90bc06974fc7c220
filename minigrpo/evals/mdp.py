"""mdp: solve rate by probe budget (and per regime) of the model playing the verifier MDP's eval records, next to
the random / minimax / max-split / oracle baselines (minigrpo/tasks/mdp/world.py). A model saved by the mdp pipeline
(train.py --task mdp) is played the way it was trained: its run's pipeline.json names the prompt style, the
tokenizer and the eval records, and a stage adapter of a LoRA-SFT run goes onto the SFT weights."""
import json
import os

from minigrpo.evals import report
from minigrpo.evals.common import UsageError, complete, load_model, run_curves, write_outputs
from minigrpo.tasks.mdp.task import MDPTask, messages_for, parse_letter


def mdp_pipeline_run(args) -> dict:
    """pipeline.json of the mdp pipeline run that --model or --adapter was saved by, and "folder", the run's; else
    {}. The file sits in the run folder: above runs/<name>/sft or .../dpo_adapter, four levels above the GRPO stage's
    checkpoints (runs/<name>/grpo/checkpoints/step-N/adapter). It names the prompt style the model was trained on,
    its tokenizer (a from-scratch model's folder has no tokenizer.json) and the eval records (seed, eval_per_cell)."""
    for path in (args.model, args.adapter):
        if path and os.path.isdir(path):
            folder = os.path.abspath(path)
            for _ in range(5):
                if os.path.exists(os.path.join(folder, "pipeline.json")):
                    with open(os.path.join(folder, "pipeline.json")) as f:
                        return {**json.load(f), "folder": folder}
                folder = os.path.dirname(folder)
    return {}


def mdp_stage_base(args, run: dict) -> str | None:
    """The SFT adapter under a pipeline stage's adapter. A real-Qwen run (sft_lora) trains SFT as a LoRA adapter,
    folds it into the weights and trains its DPO and GRPO adapters on those: they mean nothing on the bare --model,
    so the run's sft_adapter is folded in first. None for a from-scratch run (--model is its sft/ folder, the
    weights themselves) and for sft_adapter itself."""
    if not (run.get("sft_lora") and args.adapter):
        return None
    sft = os.path.join(run["folder"], "sft_adapter")
    if os.path.abspath(args.adapter) == os.path.abspath(sft):
        return None
    if not os.path.exists(os.path.join(sft, "adapter_config.json")):
        raise UsageError(f"--adapter {args.adapter}: trained on the SFT weights of its run, but {sft} is missing "
                         "(restore it, or evaluate the run's sft_adapter alone)")
    return sft


def eval_mdp(args, out):
    run = mdp_pipeline_run(args)
    # a model reads the prompt style it was trained on: the tiny pipeline's is "compact", a real Qwen's "full"
    prompt = args.mdp_prompt or run.get("prompt", "full")
    # the run's eval records by default: its seed (resolve_defaults) and records per cell
    task = MDPTask(eval_per_cell=args.limit or run.get("eval_per_cell", 16), seed=args.seed, prompt=prompt)
    fold = mdp_stage_base(args, run)
    model, tok, columns = load_model(args, tokenizer=run.get("tokenizer"), fold=fold)
    results, invalid = {}, {}
    for label, ctx in columns:
        invalid[label] = [0, 0]

        def policy(texts, states, label=label):
            answers = complete(model, tok, args, [messages_for(t, task.prompt) for t in texts], (), f"{label} mdp")
            letters = [parse_letter(a) for a in answers]
            invalid[label][0] += sum(x is None for x in letters)
            invalid[label][1] += len(letters)
            return [x or "?" for x in letters]  # "?" = an invalid answer: the probe is spent on nothing
        with ctx():
            results[label] = task.evaluate(policy, "eval", batched=True)
    results.update(task.baselines("eval"))
    paths = report.write_mdp_report(results, out)
    tables = []
    names = ("overall_by_policy_budget", "regime_split", "probe_choices")
    for name in names + (("differences",) if "adapter" in results else ()):
        with open(paths[f"{name}.md"]) as f:
            tables.append((name.replace("_", " "), f.read()))
    source = "--mdp-prompt" if args.mdp_prompt else "pipeline.json" if "prompt" in run else "default"
    notes = [f"- prompt style: {prompt} ({source}); {len(task.records('eval'))} eval records, seed {args.seed} "
             f"(sampling seed {args.sample_seed})"]
    if fold:
        notes.append(f"- the adapter sits on its run's SFT weights: {fold} was folded into --model first, so "
                     "\"base\" is the SFT policy")
    notes += [f"- {label}: {n}/{total} answers were not a single letter A-H (spent on nothing)"
              for label, (n, total) in invalid.items()]
    write_outputs(args, out, {"results": results, "invalid_answers": invalid, "prompt": prompt}, tables,
                  [paths["solve_rate_vs_budget.png"]] + run_curves(args, out), notes)
    return {"results": results}
