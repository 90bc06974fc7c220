"""Grade one answer against one task's criteria checklist and print the verdict: for debugging a criterion.

    python judge.py --task semver-compare --answer docs/examples/semver-compare.md    # local machine checks
    python judge.py --task haiku --answer a.txt --judge claude --model sonnet         # claude -p
    python judge.py --task haiku --answer a.txt --judge http://localhost:8000 --model Qwen/Qwen3-8B
    python judge.py --task haiku --answer a.txt --judge "cmd:ollama run qwen3" --judge-mode llm   # LLM grades all

Exit code 0 with a verdict, 2 for a usage error, 4 when the judge it was told to use never answered (after its
retries, in either --judge-mode): the codes of docs/training.md's "How a run ends".
"""

import argparse
import json
import logging
import os
import sys

from minigrpo.judge import make_judge, load_tasks
from minigrpo.judge.grader import GRADER_DOWN
from minigrpo.run.parsing import DefaultsShown

DEFAULT_TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minigrpo", "data", "soyuz_tasks.json")


def parse_args(argv):
    p = argparse.ArgumentParser(description="Grade one answer against a task's criteria checklist.",
                                formatter_class=DefaultsShown)
    p.add_argument("--task", required=True, help="task id in the tasks file")
    p.add_argument("--answer", required=True, help="file holding the answer text ('-' for stdin)")
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="tasks JSON file (default: the soyuz tasks)")
    p.add_argument("--judge", default="local", help="local | claude | cmd:<command line> | http(s)://host[:port]")
    p.add_argument("--model", default=None, help="grader model (claude --model, or the chat-completions model) "
                   "(default: claude's own; http: $MINIGRPO_JUDGE_MODEL, else 'default')")
    p.add_argument("--max-turns", type=int, default=None, help="claude --max-turns (default: claude's own)")
    p.add_argument("--claude-args", default="",
                   help="extra arguments for claude -p, one shell-quoted string (default: none)")
    p.add_argument("--judge-mode", choices=["hybrid", "llm"], default="hybrid",
                   help="LLM judges: hybrid (default) = machine checks decide their criteria, the LLM the rest; "
                        "llm = the LLM grades every criterion (the soyuz run's grading)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per grader call")
    p.add_argument("--retries", type=int, default=2, help="retries after an invalid or failed call")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return p.parse_args(argv)


def backend_options(args):
    if args.judge == "claude":
        return {"model": args.model, "max_turns": args.max_turns, "claude_args": args.claude_args}
    if args.judge.startswith(("http://", "https://")):
        return {"model": args.model}
    return {}


def print_verdict(verdict):
    for r in verdict.results:
        mark = {True: "PASS", False: "FAIL", None: "----"}[r.passed]
        print(f"{mark}  {r.id}: {r.reason}")
    score = "n/a (nothing checked)" if verdict.score is None else f"{verdict.score:.3f}"
    print(f"score {score}  ({verdict.passed} passed / {verdict.checked} checked / {verdict.total} criteria)")
    print(f"reason: {verdict.reason}")


def read_answer(path: str) -> str:
    """The answer's text (stdin for '-'); a file that cannot be read, or is not UTF-8 text, is a ValueError naming
    --answer and the file."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
        return data.decode("utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError as e:
        raise ValueError(f"--answer {path}: not UTF-8 text (byte {e.start} is {e.object[e.start]:#04x}); the judge "
                         "grades text answers") from None
    except OSError as e:
        raise ValueError(f"--answer {path}: cannot read it ({e.strerror or e})") from None


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        tasks = load_tasks(args.tasks)
        if args.task not in tasks:
            raise ValueError(f"{args.tasks}: no task with id {args.task!r} (have {', '.join(sorted(tasks))})")
        answer = read_answer(args.answer)
        judge = make_judge(args.judge, workers=1, timeout=args.timeout, retries=args.retries,
                           hybrid=args.judge_mode == "hybrid", **backend_options(args))
    except FileNotFoundError as e:
        print(f"judge.py: {e.filename}: no such file (check --tasks / --answer)", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"judge.py: {e}", file=sys.stderr)
        return 2
    verdict = judge.grade(tasks[args.task], answer)
    judge.close()
    if verdict is None:      # llm mode: no criterion was graded, so there is no verdict at all
        print(f"judge.py: the {args.judge} judge never answered; nothing was graded in {args.retries + 1} "
              "attempts: check the judge command or server", file=sys.stderr)
        return 4
    print(json.dumps(verdict.to_dict(), indent=2)) if args.json else print_verdict(verdict)
    down = [r.id for r in verdict.results if r.reason == GRADER_DOWN]
    if down:     # the score above leaves these out: not a grade of the answer by the judge that was asked for
        print(f"judge.py: the {args.judge} judge never answered; {', '.join(down)} unchecked, so the score is not its "
              "grade: check the judge command or server", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
