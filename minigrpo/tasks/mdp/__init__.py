"""The verifier MDP: its world (hidden programs, probes, the oracle), the exact planner, and the task train.py
trains on."""
