"""The multi-stage experiments that drive train(): the verifier-MDP pipeline (SFT, DPO, GRPO), the revise
experiment, and the supervised trainers they use."""
