"""The parts of an answer the checks grade: its ``` fenced blocks, and its graded Python (extract_code), which the
ast checks (astcheck.py) and the python checks (pychecks.py) both read."""
import functools
import re

from minigrpo.judge.astcheck import parse_code

PY_TAGS = {"", "python", "py", "python3"}
_TAG = re.compile(r"[\w+#.-]*")


@functools.lru_cache(maxsize=64)
def _fenced(answer):
    # One pass over the lines. An opening line is [ \t]*```[ \t]*TAG<anything> followed by a newline; its block ends
    # at the next line that is exactly [ \t]*```[ \t]*; an opener with no closing line after it is not a block, and
    # then no later line can open one either (what the regex ^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$
    # with re.M | re.S found, in linear instead of quadratic time).
    lines = answer.split("\n")
    starts, pos = [], 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    closer = [None] * (len(lines) + 1)     # closer[i]: the first closing line at or after line i
    for i in range(len(lines) - 1, -1, -1):
        closer[i] = i if lines[i].strip(" \t") == "```" else closer[i + 1]
    blocks, i = [], 0
    while i < len(lines) - 1:              # the last piece has no newline after it, so it cannot open a block
        head = lines[i].lstrip(" \t")
        if head.startswith("```"):
            j = closer[i + 1]
            if j is None:
                break
            tag = _TAG.match(head[3:].lstrip(" \t")).group(0)
            blocks.append((tag.lower(), answer[starts[i + 1]:starts[j]]))
            i = j + 1
        else:
            i += 1
    return tuple(blocks)


def fenced_blocks(answer):
    """[(lang, body), ...] of the answer's ``` fenced blocks, lang lower-cased ('' when untagged)."""
    return list(_fenced(answer))


@functools.lru_cache(maxsize=64)
def extract_code(answer):
    """The answer's graded Python, for the ast and python checks (never raises; linear time). Fenced: its blocks
    tagged python/py/python3 and its untagged blocks that parse, in order; other tags (bash, console, text, output,
    pycon, ...) and untagged blocks that do not parse (`>>>` transcripts, output) are not code. Beside a block that
    defines something, a usage example (only bare expressions: `print(f(1))`; it would only run at import, where one
    that shows an error fails the answer) is left out. If the join does not parse, only the blocks that parse on
    their own are joined. No fences: the whole answer if it parses (a bare code reply), else ''."""
    blocks = _fenced(answer)
    if not blocks:
        return answer if answer.strip() and parse_code(answer) is not None else ""
    code = [(b, parse_code(b)) for lang, b in blocks if lang in PY_TAGS and (lang or parse_code(b) is not None)]
    examples = [None if t is None else all(type(s).__name__ in ("Expr", "Assert", "Pass") for s in t.body)
                for _, t in code]    # None: does not parse
    if False in examples:
        code = [c for c, example in zip(code, examples) if example is not True]
    for kept in (code, [(b, t) for b, t in code if t is not None]):
        if parse_code(joined := "\n\n".join(b for b, _ in kept)) is not None:
            return joined
    return next((b for b, t in code if t is not None), "")
