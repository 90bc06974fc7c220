"""A run folder as the tiny mdp pipeline leaves it, for the eval.py tests: pipeline.json (seed 3) and a from-scratch
SFT model in sft/ (config.json and weights, no tokenizer.json)."""
import json

import torch

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 8}


def mdp_run(run, eval_per_cell):
    from minigrpo.experiments import mdp_pipeline as P     # on use: collecting the tests stays quick
    P.save_model(P.scratch_model(SMALL, 0, "cpu", torch.float32), str(run / "sft"))
    (run / "pipeline.json").write_text(json.dumps({"model": "tiny", "tokenizer": "tiny", "prompt": "compact",
                                                    "seed": 3, "eval_per_cell": eval_per_cell}))
    return run
