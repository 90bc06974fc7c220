"""A library error says what is wrong and what to do, not where it was raised: the traceback already names the file
and the function, so no message raised in minigrpo/ starts with "sampler.py: " or "grpo.loss_normalizer: ". (The
scripts' one-line usage errors, "train.py: error: ...", are printed, not raised, and keep their CLI format.)"""
import ast
import re

from test_layering import library_files

WHERE = re.compile(r"^([A-Za-z_]\w*\.py|[a-z_]+\.[a-z_]\w*): ")     # file.py: or module.function:


def leading_text(node):
    """The literal text a raised exception's message starts with ('' when it starts with a value)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return ""


def raised_messages(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            yield node.lineno, leading_text(node.exc.args[0])


def test_no_raised_message_starts_with_where_it_was_raised():
    found = [(path, line, text) for path in library_files() for line, text in raised_messages(path)]
    bad = [f"{path}:{line}: {text[:60]!r}" for path, line, text in found if WHERE.match(text)]
    assert not bad, "\n".join(bad)
    assert len([t for *_, t in found if t]) > 100                                 # the walk found the messages
    assert WHERE.match("sampler.py: x") and WHERE.match("grpo.kl: x") and not WHERE.match("stopping: x")
