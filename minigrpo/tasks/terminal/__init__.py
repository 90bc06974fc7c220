"""The terminal task set: small shell exercises in the terminal-bench spirit, each with a hidden verifier, for GRPO
on multi-turn tool use. The policy calls one tool, `shell`, whose commands run behind the judge's sandbox in one
work folder per episode; when it answers without a tool call, a verifier judges the folder and the answer.

    task.py       TerminalTask (what the rollout loop drives) and TerminalEnv (one episode)
    exercise.py   Exercise and Transcript: the shape of one exercise, the catalogue's checks, the split
    verify.py     what verifiers stand on: bounded reads of the snapshot, the probe sandbox, answer readings
    set_text.py   files and text: find, count, rename, extract, sort
    set_code.py   code: scripts made to run, a package's tests made to pass
    set_data.py   data: SQLite (through python3's sqlite3) and CSV reports
    set_tools.py  tools: checksums, openssl, an encoded payload, git in a scratch repository

Every exercise ships a reference transcript (shell commands and a final answer) that its verifier scores 1.0,
and a wrong one, a plausible mistake, that it scores below 0.5; tests/tasks/test_terminal.py runs both through
the real sandbox. docs/agentic.md describes the set, how far its verifiers trust what they read, and its limits.
This package is not imported by minigrpo/tasks/__init__.py: import minigrpo.tasks.terminal.task for the task.
"""
