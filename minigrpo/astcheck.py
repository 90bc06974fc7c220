"""The code-inspection check of the local judge (type "ast"; minigrpo/checks.py runs it on the answer's code).

{"type": "ast", KIND: [ITEM, ...], ..., "must": true, "any": false} reads the parsed code (checks.extract_code), so
a name in a comment or a string is not a use; code that does not parse, or no code, fails the check whatever `must`
says. must=true: every item is present (any=true: at least one); must=false: none is. KINDs: calls, decorators (`@d`
and `@d(...)`), with (context managers of with / async with), classes, defs (function names), imports (module names:
`from a.b import c` imports a, a.b and a.b.c), names (any Name/Attribute reference), attributes (plain attribute
names), nodes (ast class names such as AsyncWith). A name is dotted and resolved through the module's imports:
`import click as c` then `c.echo` is click.echo, `from click import echo` then `echo` is click.echo,
`from m import *` lets a bare name be m.name, builtins are bare (`print`). `.x` / `.a.x` match those last parts on
any receiver (`df.groupby`, `np.nanmean`, or the bare name), `m.*` any member of m, `*` anything, `f()` a call in a
chain (`super().default`). calls/decorators/with/classes items may add arguments in call syntax, checked where given
(others may follow): `pytest.raises(ValueError)`, `.popitem(last=False)`, `.Retry(status_forcelist=...)` (`...` any
value), `hashlib.file_digest(..., 'sha256')`; for classes the arguments are bases: `AppEncoder(json.JSONEncoder)`.
Constants compare by value (0 equals 0.0, not False), names by resolved dotted name.

`parse_code` is also what minigrpo/checks.py uses to tell a bare code reply from prose. Parser bombs (deep nesting
that makes ast.parse raise) count as "does not parse"; chains longer than _CHAIN_MAX are not names.
"""

import ast
import functools
import re


@functools.lru_cache(maxsize=16)
def parse_code(code):
    """ast.Module of `code`, or None if it does not parse: syntax errors, null bytes, and the parser bombs that make
    ast.parse raise RecursionError or MemoryError (`-` * 3000 + `1`) all count as "does not parse"."""
    try:
        return ast.parse(code)
    except Exception:
        return None


AST_KINDS = ("calls", "decorators", "with", "classes", "defs", "imports", "names", "attributes", "nodes")
_CHAIN_MAX = 64    # longer attribute/call chains are not names anyone asks about


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
        return isinstance(got, ast.Constant) and _same_constant(want[1], got.value)
    return _name_matches(want[1], ctx.names(got))


class _CodeIndex:
    """What an ast check asks about, collected in one walk over the module (ast.walk is iterative: no recursion)."""

    def __init__(self, tree):
        self.tree = tree    # keeps every node alive: _cache is keyed by id(node)
        self.aliases, self.stars, self.imports = {}, [], set()
        nodes = list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    self._imported(a.name)
                    local = a.asname or a.name.split(".")[0]
                    self.aliases.setdefault(local, set()).add(a.name if a.asname else local)
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                self._imported(module)
                for a in node.names:
                    if a.name == "*":
                        self.stars.append(module)
                        continue
                    self.imports.add(f"{module}.{a.name}")
                    self.aliases.setdefault(a.asname or a.name, set()).add(f"{module}.{a.name}")
        self.calls = [n for n in nodes if isinstance(n, ast.Call)]
        self.decorated = [d for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                          for d in n.decorator_list]
        self.withs = [i.context_expr for n in nodes if isinstance(n, (ast.With, ast.AsyncWith)) for i in n.items]
        self.classes = [n for n in nodes if isinstance(n, ast.ClassDef)]
        self.defs = {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.attributes = {n.attr for n in nodes if isinstance(n, ast.Attribute)}
        self.refs = [n for n in nodes if isinstance(n, (ast.Name, ast.Attribute))]
        self.node_types = {type(n).__name__ for n in nodes}
        self._cache = {}

    def _imported(self, module):
        parts = module.split(".")
        self.imports.update(".".join(parts[:i + 1]) for i in range(len(parts)))

    def _resolve(self, name):
        if name in self.aliases:
            return self.aliases[name]
        return {name} | {f"{m}.{name}" for m in self.stars}

    def names(self, node):
        """The dotted names an expression may stand for, its first name resolved through the module's imports
        (`import click as c` makes `c.echo` click.echo; `from click import echo` makes `echo` click.echo); a base
        that is not a name shows as `?` (`?.dt.strftime`), a call in the chain as `()` (`super().default`)."""
        key = id(node)
        if key not in self._cache:
            parts = []
            while isinstance(node, (ast.Attribute, ast.Call)) and len(parts) <= _CHAIN_MAX:
                parts.append("." + node.attr if isinstance(node, ast.Attribute) else "()")
                node = node.func if isinstance(node, ast.Call) else node.value
            if len(parts) > _CHAIN_MAX:
                heads = set()
            elif isinstance(node, ast.Name):
                heads = self._resolve(node.id)
            else:
                heads = {"?"}
            tail = "".join(reversed(parts))
            full = {h + tail for h in heads}
            self._cache[key] = {n[len("builtins."):] if n.startswith("builtins.") else n for n in full}
        return self._cache[key]

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
        if kind == "classes":
            return any(_name_matches(spec.name, {c.name}) and spec.args_ok(c.bases, c.keywords, self)
                       for c in self.classes)
        exprs = {"calls": self.calls, "decorators": self.decorated, "with": self.withs}[kind]
        for e in exprs:
            call = e if isinstance(e, ast.Call) else None    # `@click.command` and `@click.command()` alike
            if call is not None:
                e = call.func
            if spec.name_ok(self.names(e)) and (spec.args is None or call is not None and
                                                spec.args_ok(call.args, call.keywords, self)):
                return True
        return False


@functools.lru_cache(maxsize=16)
def _code_index(code):
    tree = parse_code(code)
    return None if tree is None else _CodeIndex(tree)


@functools.lru_cache(maxsize=512)
def _spec(kind, text):
    if kind in ("imports", "defs", "attributes", "nodes"):
        if not re.fullmatch(r"\w+(\.\w+)*" if kind == "imports" else r"\w+", text):
            raise ValueError(f"ast {kind} item {text!r} is not a {'module' if kind == 'imports' else 'plain'} name")
        s = _Spec.__new__(_Spec)
        s.text, s.name, s.args, s.kwargs = text, text, None, {}
        return s
    return _Spec(text)


def check_code(check, code):
    """(True | False, reason) of an ast check on `code` (the answer's extracted Python, not empty)."""
    index = _code_index(code)
    if index is None:
        return False, "the code does not parse"
    items = [(kind, text) for kind in AST_KINDS for text in check.get(kind, [])]
    found = [f"{kind} {text}" for kind, text in items if index.find(kind, _spec(kind, text))]
    missing = [f"{kind} {text}" for kind, text in items if f"{kind} {text}" not in found]
    if not check.get("must", True):
        return not found, f"code uses {found} (must not)" if found else "code uses none of the banned items"
    ok = bool(found) if check.get("any", False) else not missing
    want = "one of" if check.get("any", False) else "all of"
    return ok, f"code uses {want} the items" if ok else f"code lacks {missing} (must use {want} them)"


def validate_ast_check(check):
    """Raise ValueError (one line) if an ast check has unknown keys, names nothing, or has an item that is not a
    name or a call."""
    unknown = set(check) - {"type", "must", "any", *AST_KINDS}
    if unknown:
        raise ValueError(f"keys {sorted(unknown)} unknown (kinds: {', '.join(AST_KINDS)}; must, any)")
    if not any(check.get(kind) for kind in AST_KINDS):
        raise ValueError(f"names nothing to look for (kinds: {', '.join(AST_KINDS)})")
    for kind in AST_KINDS:
        if not isinstance(check.get(kind, []), list):
            raise ValueError(f"{kind} must be a list")
        for text in check.get(kind, []):
            _spec(kind, text)
