"""eval.py's evaluations: common.py holds what every task shares, <task>.py its metrics, tables and plots."""
