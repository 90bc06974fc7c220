"""Inputs and logits for comparing our model with transformers (the oracle, tests only) on the tiny configs."""
import torch


def ids(B=2, T=11, seed=0):
    """Random token ids below the tiny models' 261-token vocabulary."""
    return torch.randint(0, 261, (B, T), generator=torch.Generator().manual_seed(seed))


def hf_logits(model, x):
    """A transformers causal LM's logits for ids x, without a graph."""
    with torch.no_grad():
        return model(input_ids=x).logits
