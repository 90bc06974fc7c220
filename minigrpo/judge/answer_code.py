"""The parts of an answer the checks grade: its ``` fenced blocks, and its graded Python (extract_code), which the
python checks (pychecks.py) run. Parsing only tells code from prose here: nothing the parser sees decides a
criterion (reading the source never pays)."""
import ast
import functools
import re

# Deeper than any real code. What counts as code must not depend on the interpreter's recursion limit: ast.parse
# and the recursive passes over a tree fail at a depth that follows it, and torch.compile raises it in a training
# process, so without a fixed bound of our own one answer would be told from prose differently before and after a
# compile.
MAX_DEPTH = 200


@functools.lru_cache(maxsize=16)
def parse_code(code):
    """ast.Module of `code`, or None if it does not parse: syntax errors, null bytes, the parser bombs that make
    ast.parse raise RecursionError or MemoryError (`-` * 3000 + `1`), and any tree deeper than MAX_DEPTH all count
    as "does not parse"."""
    try:
        tree = ast.parse(code)
    except Exception:
        return None
    return tree if _depth_at_most(tree, MAX_DEPTH) else None


def _depth_at_most(tree, limit):
    stack = [(tree, 1)]
    while stack:                                # iterative: the bound holds whatever the recursion limit is
        node, depth = stack.pop()
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return True

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
    """The answer's graded Python, for the python checks (never raises; linear time). Fenced: its blocks
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
