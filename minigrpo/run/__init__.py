"""Run plumbing: train.py's flags and presets, the run folder, curves, the memory plan, what a resume may change,
export."""
