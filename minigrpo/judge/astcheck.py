"""The code-inspection check of the local judge (type "ast"; minigrpo/judge/checks.py runs it on the answer's code).

{"type": "ast", KIND: [ITEM, ...], ..., "must": true, "any": false, "entry": [NAME, ...]} reads the parsed code
(checks.extract_code) and counts only the code that can run: module-level code and what the entry points reach
(astreach.py: `entry` names the graded top-level definitions, fnmatch patterns allowed, e.g. ["RunningMedian"] or
["test_*"]; without it, every public top-level def and class). A name in a comment or a string (a docstring too)
is not a use, nor is code in a definition nothing reaches, in an `if False:` / `if 0:` branch or after a return.
Code that does not parse, or no code, fails the check whatever `must` says. must=true: every item is present
(any=true: at least one); must=false: none is, and then code that looks a name up by computed name (globals(),
getattr(x, name), ...) makes every definition count. KINDs: calls, decorators (`@d` and `@d(...)`), with (context
managers of with / async with), unmanaged (calls that are not the context manager of a with: `open` outside with),
classes, defs (function names), imports (module names: `from a.b import c` imports a, a.b and a.b.c), names (any
Name/Attribute reference), attributes (plain attribute names), loops (for/while loops and comprehensions whose
iterable -- a while loop's test -- refers to the name: `for r in df.values`, `range(len(df))`; `*` any loop),
nodes (ast class names such as AsyncWith). A name is dotted and resolved through the module's imports and its
names bound once: `import click as c` then `c.echo` is click.echo, `from click import echo` then `echo` is
click.echo, `push = heapq.heappush` then `push` is heapq.heappush, `from m import *` lets a bare name be m.name,
builtins are bare (`print`); `getattr(x, "a" + "b")` is `x.ab` when its name is static (constants, their
concatenation, f-strings and "".join of them, module constants). `.x` / `.a.x` match those last parts on any
receiver (`df.groupby`, `np.nanmean`, or the bare name), `m.*` any member of m, `*` anything, `f()` a call in a
chain (`super().default`). calls/decorators/with/unmanaged/classes items may add arguments in call syntax, checked
where given (others may follow): `pytest.raises(ValueError)`, `.popitem(last=False)`, `.Retry(status_forcelist=...)`
(`...` any value), `hashlib.file_digest(..., 'sha256')`; for classes the arguments are bases:
`AppEncoder(json.JSONEncoder)`. Constants compare by value (0 equals 0.0, not False; a constant bound once,
`MAX = 100`, is its value), names by resolved dotted name.

`parse_code` is also what minigrpo/judge/checks.py uses to tell a bare code reply from prose. Parser bombs (deep nesting
that makes ast.parse raise) count as "does not parse"; chains longer than astreach.CHAIN_MAX are not names.
"""

import ast
import functools
import re

from minigrpo.judge.astreach import Module


# Deeper than any real code. What counts as code must not depend on the interpreter's recursion limit: ast.parse
# and the recursive passes over a tree fail at a depth that follows it, and torch.compile raises it in a training
# process, so without a fixed bound of our own one answer would grade differently before and after a compile.
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


AST_KINDS = ("calls", "decorators", "with", "unmanaged", "classes", "defs", "imports", "names", "attributes", "loops",
             "nodes")


class _Spec:
    """One item of an ast check, parsed once: a dotted name (".x" = any receiver, "*" = any, "m.*" = any member of
    m) and, for calls/decorators/with/classes, required arguments in call syntax: `pytest.raises(ValueError)`,
    `.popitem(last=False)`, `.Retry(status_forcelist=...)` (`...`: any value), `AppEncoder(json.JSONEncoder)`."""

    def __init__(self, text):
        self.text = text
        src = text
        if src.startswith("."):
            src = "_SFX_" + src
        src = re.sub(r"^\*", "_ANY_", src)
        src = re.sub(r"\.\*(?=\(|$)", "._ALL_", src)
        try:
            node = ast.parse(src, mode="eval").body
        except SyntaxError:
            raise ValueError(f"ast item {text!r} is not a name or a call") from None
        self.args, self.kwargs = None, {}
        if isinstance(node, ast.Call) and not _render_spec(node):
            self.args = [self._value(a) for a in node.args]
            self.kwargs = {k.arg: self._value(k.value) for k in node.keywords if k.arg}
            node = node.func
        name = _render_spec(node)
        if name is None:
            raise ValueError(f"ast item {text!r} is not a name or a call")
        self.name = name.replace("_SFX_", "").replace("_ANY_", "*").replace("._ALL_", ".*")

    @staticmethod
    def _value(node):
        if isinstance(node, ast.Constant):
            return ("any",) if node.value is Ellipsis else ("const", node.value)
        name = _render_spec(node)
        if name is None:
            raise ValueError("ast item arguments are constants, names or ...")
        return ("name", name)

    def name_ok(self, candidates):
        return _name_matches(self.name, candidates)

    def args_ok(self, args, keywords, ctx):
        if self.args is None:
            return True
        if any(isinstance(a, ast.Starred) for a in args) or any(k.arg is None for k in keywords):
            return ctx.widen      # `int(*(s, b))`, `int(s, **kw)`: the arguments are unknown; a ban counts them
        if len(args) < len(self.args):
            return False
        kw = {k.arg: k.value for k in keywords if k.arg}
        return all(_value_ok(want, got, ctx) for want, got in zip(self.args, args)) and \
            all(k in kw and _value_ok(want, kw[k], ctx) for k, want in self.kwargs.items())


def _render_spec(node):
    """Dotted text of a spec's Name/Attribute chain (a call with no arguments as `f()`), or None."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append("." + node.attr)
            node = node.value
        elif isinstance(node, ast.Call) and not node.args and not node.keywords and parts:
            parts.append("()")
            node = node.func
        elif isinstance(node, ast.Name):
            return node.id + "".join(reversed(parts))
        else:
            return None


def _name_matches(spec, candidates):
    if spec == "*":
        return True
    if spec.startswith("."):
        return any(c == spec[1:] or c.endswith(spec) for c in candidates)
    if spec.endswith(".*"):
        return any(c.startswith(spec[:-1]) for c in candidates)
    return spec in candidates


def _same_constant(a, b):
    numbers = (int, float)
    if type(a) in numbers and type(b) in numbers:
        return a == b
    return type(a) is type(b) and a == b


def _value_ok(want, got, ctx):
    if want[0] == "any":
        return True
    if want[0] == "const":
        return _same_constant(want[1], ctx.value(got))     # a literal, or a name bound once to one
    return _name_matches(want[1], ctx.names(got))


class _CodeIndex:
    """What an ast check asks about, collected once from the live nodes of the module (astreach.Module.live)."""

    def __init__(self, module, entry, widen):
        self.module, self.widen = module, widen       # widen: for a ban, what could be there counts as there
        nodes, reached = module.live(entry, widen)
        by_type = {}
        for n in nodes:                   # one pass: the lists below are read per item of every check
            by_type.setdefault(type(n), []).append(n)
        kinds = lambda *types: [n for t in types for n in by_type.get(t, [])]    # noqa: E731
        self.imports = set()
        for node in kinds(ast.Import):
            for a in node.names:
                self._imported(a.name)
        for node in kinds(ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            self._imported(base)
            self.imports.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        self.calls = kinds(ast.Call)
        self.decorated = [d for n in kinds(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                          for d in n.decorator_list]
        self.withs = [i.context_expr for n in kinds(ast.With, ast.AsyncWith) for i in n.items]
        managed = {id(e) for e in self.withs}
        self.unmanaged = [c for c in self.calls if id(c) not in managed]
        self.classes = [n for n in reached if isinstance(n, ast.ClassDef)]
        self.defs = {n.name for n in reached if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        # `getattr(df, "app" + "ly")` is `df.apply`: an attribute, a reference and (called) a call of .apply
        fetched = [n for n in self.calls if module.static_attribute(n)]
        self.attributes = {n.attr for n in kinds(ast.Attribute)} | {module.static_attribute(n)[1] for n in fetched}
        self.refs = kinds(ast.Name, ast.Attribute) + fetched
        self.loops = [n.iter for n in kinds(ast.For, ast.AsyncFor, ast.comprehension)] + \
            [n.test for n in kinds(ast.While)]
        self.node_types = {t.__name__ for t in by_type}

    def _imported(self, module):
        parts = module.split(".")
        self.imports.update(".".join(parts[:i + 1]) for i in range(len(parts)))

    def names(self, node):
        return self.module.names(node)

    def value(self, node):
        return self.module.value(node)

    def _loop_over(self, spec, iterable):
        if spec.name == "*":
            return True
        return any(spec.name_ok(self.names(n)) for n in ast.walk(iterable)
                   if isinstance(n, (ast.Name, ast.Attribute)) or self.module.static_attribute(n))

    def find(self, kind, spec):
        if kind == "imports":
            return spec.text in self.imports
        if kind == "defs":
            return spec.text in self.defs
        if kind == "attributes":
            return spec.text in self.attributes
        if kind == "nodes":
            return spec.text in self.node_types
        if kind == "names":
            return any(spec.name_ok(self.names(n)) for n in self.refs)
        if kind == "loops":
            return any(self._loop_over(spec, it) for it in self.loops)
        if kind == "classes":
            return any(_name_matches(spec.name, {c.name}) and spec.args_ok(c.bases, c.keywords, self)
                       for c in self.classes)
        exprs = {"calls": self.calls, "decorators": self.decorated, "with": self.withs,
                 "unmanaged": self.unmanaged}[kind]
        for e in exprs:
            call = e if isinstance(e, ast.Call) else None
            if call is not None and self.module.static_attribute(e):
                if kind in ("calls", "unmanaged"):
                    continue        # `getattr(df, "apply")` fetches; `getattr(df, "apply")(f)` is the call
                call = None
            if call is not None:      # `@click.command` and `@click.command()` alike
                e = call.func
            if spec.name_ok(self.names(e)) and (spec.args is None or call is not None and
                                                spec.args_ok(call.args, call.keywords, self)):
                return True
        return False


@functools.lru_cache(maxsize=16)
def _module(code):
    tree = parse_code(code)
    return None if tree is None else Module(tree)


@functools.lru_cache(maxsize=64)
def _code_index(code, entry, widen):
    module = _module(code)
    return None if module is None else _CodeIndex(module, entry, widen)


@functools.lru_cache(maxsize=512)
def _spec(kind, text):
    if kind in ("imports", "defs", "attributes", "nodes"):
        if not re.fullmatch(r"\w+(\.\w+)*" if kind == "imports" else r"\w+", text):
            raise ValueError(f"ast {kind} item {text!r} is not a {'module' if kind == 'imports' else 'plain'} name")
        s = _Spec.__new__(_Spec)
        s.text, s.name, s.args, s.kwargs = text, text, None, {}
        return s
    return _Spec(text)


_STRING_CODE = ("exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile")


def check_code(check, code):
    """(True | False, reason) of an ast check on `code` (the answer's extracted Python, not empty)."""
    must = check.get("must", True)
    entry = tuple(check["entry"]) if "entry" in check else None
    index = _code_index(code, entry, not must)
    if index is None:
        return False, "the code does not parse"
    items = [(kind, text) for kind in AST_KINDS for text in check.get(kind, [])]
    found = [f"{kind} {text}" for kind, text in items if index.find(kind, _spec(kind, text))]
    missing = [f"{kind} {text}" for kind, text in items if f"{kind} {text}" not in found]
    if not must:
        # code run from a string (exec, eval, compile) is code this check cannot read: a ban cannot pass over it
        hidden = [name for name in _STRING_CODE if index.find("calls", _spec("calls", name))]
        if hidden and not found:
            return False, f"live code runs code from strings ({', '.join(hidden)}): a ban cannot be checked"
        return not found, f"live code uses {found} (must not)" if found else "live code uses none of the banned items"
    ok = bool(found) if check.get("any", False) else not missing
    want = "one of" if check.get("any", False) else "all of"
    return ok, f"live code uses {want} the items" if ok else f"live code lacks {missing} (must use {want} them)"


def validate_ast_check(check):
    """Raise ValueError (one line) if an ast check has unknown keys, names nothing, has an item that is not a name
    or a call (loops: a name), or an entry that is not a list of names or patterns."""
    unknown = set(check) - {"type", "must", "any", "entry", "only_if", *AST_KINDS}
    if unknown:
        raise ValueError(f"keys {sorted(unknown)} unknown (kinds: {', '.join(AST_KINDS)}; must, any, entry, only_if)")
    if not any(check.get(kind) for kind in AST_KINDS):
        raise ValueError(f"names nothing to look for (kinds: {', '.join(AST_KINDS)})")
    entry = check.get("entry", [])
    if not isinstance(entry, list) or not all(isinstance(e, str) and re.fullmatch(r"[\w*?\[\]!]+", e) for e in entry):
        raise ValueError("entry must be a list of top-level names or fnmatch patterns")
    for kind in AST_KINDS:
        if not isinstance(check.get(kind, []), list):
            raise ValueError(f"{kind} must be a list")
        for text in check.get(kind, []):
            if _spec(kind, text).args is not None and kind == "loops":
                raise ValueError(f"loops item {text!r} is a name, not a call")
