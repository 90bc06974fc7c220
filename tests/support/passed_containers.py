"""Which containers a criterion's test hands the answer and uses again after the call (a static reading of the
test's source, for tests/judge/test_shared_inputs.py).

By default the driver hands the answer copies, so what a test reads after the call is its own data. A criterion
marked `"shared": true` (one about mutation or aliasing) keeps reference semantics: there the answer can change
what the test reads, so the test may only compare such a container with what it took before the call (`==`,
`is`) or write into it. Outside such a criterion, comparing a passed container after the call is a mutation check
that copies make vacuous: that criterion must be marked shared.

The reading is by name and conservative about what a container is: a name bound to a list, dict or set display or
comprehension, to list(...) / dict(...) / a copy, or one the test subscripts into or calls a mutating method on.
"""
import ast
import builtins

HELPERS = {"raises", "deadline", "memory_peak_mb", "stand_in", "sqlite_stand_in"}
TO_ANSWER = {"in_sandbox", "implementation", "solution"}       # helpers whose calls reach the answer's process
_MAKERS = {"list", "dict", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deepcopy", "copy", "deque"}
_MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "pop", "clear", "remove", "sort"}


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound(tree):
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def answer_objects(tree):
    """Names that stand for the answer: its free names, the helpers that reach it, and what is bound to their
    results (`s = WeightedSampler(...)`)."""
    free = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free -= _bound(tree) | HELPERS | set(dir(builtins))
    names = free | TO_ANSWER
    grew = True
    while grew:
        grew = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(c, ast.Call) and _root(c.func) in names
                                                    for c in ast.walk(node.value)):
                for target in node.targets:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name) and n.id not in names:
                            names.add(n.id)
                            grew = True
    return names


def containers(tree):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            v = node.value
            made = isinstance(v, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or \
                isinstance(v, ast.Call) and (getattr(v.func, "id", None) or getattr(v.func, "attr", None)) in _MAKERS
            if made:
                found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            found.add(node.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Name):
            found.add(node.func.value.id)
    return found


def _pos(node):
    return node.lineno, node.col_offset


def _end(node):
    return node.end_lineno, node.end_col_offset


def _kind(node, parents):
    """'compare' (the container itself compared: `==`, `is`), 'write' (a write into it: `weights[0] = 1`) or
    'read' (anything else: iterating it, indexing it, handing it on)."""
    up = parents.get(node)
    if isinstance(up, ast.Compare):
        return "compare"
    if isinstance(up, ast.Subscript) and up.value is node and isinstance(up.ctx, ast.Store):
        return "write"
    return "read"


def misplaced_reads(source, shared=False):
    """[(name, line, kind)] of the containers the test hands the answer and then uses after that call in a way
    its criterion does not allow: in a shared criterion anything but a comparison or a write (the answer can
    change the container, so the test may only check that it did not); elsewhere a comparison (a mutation check,
    which copies make vacuous: the criterion should be shared)."""
    tree = ast.parse(source)
    answer, boxes = answer_objects(tree), containers(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    loads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    flagged = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or _root(call.func) not in answer:
            continue
        passed = {n.id for arg in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(arg)
                  if isinstance(n, ast.Name) and n.id in boxes and n.id not in answer}
        for name in passed:
            rebound = min((_pos(s) for s in stores if s.id == name and _pos(s) > _end(call)), default=(1 << 30, 0))
            for n in loads:
                if n.id == name and _end(call) < _pos(n) < rebound:
                    kind = _kind(n, parents)
                    if (kind == "read") if shared else (kind == "compare"):
                        flagged.add((name, n.lineno, kind))
    return sorted(flagged)
