"""minigrpo: GRPO post-training for Qwen models in plain PyTorch."""
