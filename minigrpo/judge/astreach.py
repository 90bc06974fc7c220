"""Which code of an answer a code-inspection check counts: the code that can run when the hidden tests use it.

The answer is written by the policy being trained, so a check that counted every node of the file would be met by
code that never runs (`def _unused(df): return df.pivot_table()`, `if False: import heapq`). `Module.live` walks
the module the way Python would run it and returns the nodes that count:

- module-level code (it runs at import), class bodies included (they run when the class statement does);
- the entry points -- top-level definitions whose names match a check's `entry` (names or fnmatch patterns:
  `test_*`); by default every public top-level def and class (the driver hands the hidden tests the answer's
  public names, nothing else) -- and, transitively, every definition they reach: a function or class whose name
  is read in counted code (in any scope: a helper is never missed for scoping), the bases and every method of a
  reached class, and a definition handed to a decorator (a framework may register and call it: @app.get,
  @click.command, @pytest.fixture) unless the decorator is an inert wrapper (staticmethod, property,
  functools.lru_cache, dataclasses.dataclass, ...);
- never: statements after return/raise/break/continue in the same block; the branch a static test never takes
  (`if False:`, `if 0:`, `if not True:`, `while 0:`, `x if 0 else y`, `False and x`, `typing.TYPE_CHECKING`, a
  module constant bound once such as `DEBUG = False`); the body of a `for` over an empty literal; definitions
  nothing reaches. Comments are not in the AST, and a string (a docstring too) is one Constant node.

What a static walk cannot see is a lookup by computed name (globals()["f"], getattr(mod, name)). `live(widen=True)`
-- the must-not checks -- therefore counts every definition as soon as counted code does such a lookup (globals,
vars, locals, eval, exec, __import__, importlib, inspect, sys.modules, __dict__/__globals__, a getattr-family call
whose name is not static, an import of the answer's own module). A static test that is not a literal
(`if len([]) > 0:`) is taken both ways: dead code that hides behind a computed condition still counts.

`Module.names` gives the dotted names an expression stands for, resolved through the module's imports, with
`getattr(x, NAME)` read as `x.NAME` when NAME is static (a constant string, a concatenation, an f-string or a
`"".join` of them, a module constant). All walks are iterative; static values are bounded in depth and size.
"""

import ast
import fnmatch

CHAIN_MAX = 64        # longer attribute/call chains are not names anyone asks about
_DEPTH_MAX = 50       # static evaluation gives up on deeper expressions (no recursion bombs)
_STR_MAX = 1000       # nor builds longer strings (`A = "x"; B = A + A; C = B + B ...` doubles per line)
_ALIAS_MAX = 20       # nor follows longer chains of local aliases
_NO = object()        # "no static value"

_INERT_DECORATORS = {
    "staticmethod", "classmethod", "property", "functools.lru_cache", "functools.cache", "functools.wraps",
    "functools.cached_property", "functools.total_ordering", "functools.singledispatch", "typing.overload",
    "typing.final", "typing.override", "abc.abstractmethod", "dataclasses.dataclass", "enum.unique",
    "contextlib.contextmanager", "contextlib.asynccontextmanager"}
_INERT_SUFFIXES = (".setter", ".getter", ".deleter")        # @prop.setter: a method of a class like any other
_DYNAMIC_CALLS = {"globals", "locals", "vars", "eval", "exec", "__import__", "sys.modules"}
_DYNAMIC_PREFIXES = ("importlib.", "inspect.", "sys.modules.", "operator.attrgetter", "operator.methodcaller")
_DYNAMIC_ATTRS = {"__dict__", "__globals__", "f_globals", "f_locals", "__getattribute__"}
_DYNAMIC_TAILS = {"modules", "attrgetter", "methodcaller", "import_module", "getmembers"}
_GETATTR_FAMILY = {"getattr"}
_MODULE = "module"    # the owner of a module-level block (entry points live there)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_ENDS_BLOCK = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_BINDERS = {ast.arg, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler, ast.MatchAs,
            ast.MatchStar, ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign}


class Module:
    """A parsed answer: its imports and static module constants, and (cached per entry set) its live code."""

    def __init__(self, tree):
        self.tree = tree    # keeps every node alive: caches below are keyed by id(node)
        self.aliases, self.stars = {}, []
        bound, assigned = {}, []
        stack = [tree]
        while stack:                        # every node once (an iterative walk with fast paths: 64 KB answers)
            node = stack.pop()
            t = type(node)
            if t is ast.Name:
                if type(node.ctx) is not ast.Load:
                    bound[node.id] = bound.get(node.id, 0) + 1
                continue
            if t is ast.Constant:
                continue
            if t is ast.Import:
                for a in node.names:
                    self.aliases.setdefault(a.asname or a.name.split(".")[0], set()).add(
                        a.name if a.asname else a.name.split(".")[0])
            elif t is ast.ImportFrom:
                module = "." * node.level + (node.module or "")
                for a in node.names:
                    if a.name == "*":
                        self.stars.append(module)
                    else:
                        self.aliases.setdefault(a.asname or a.name, set()).add(f"{module}.{a.name}")
            if t in _BINDERS:
                for name in _bindings(node):
                    bound[name] = bound.get(name, 0) + 1
                target, value = _single_target(node)
                if target is not None:
                    assigned.append((target, value))
            for field in node._fields:
                value = getattr(node, field, None)
                if type(value) is list:
                    stack.extend(v for v in value if isinstance(v, ast.AST))
                elif isinstance(value, ast.AST) and not isinstance(value, ast.expr_context):
                    stack.append(value)
        once = [(t, v) for t, v in assigned if bound.get(t) == 1]
        self.builtin_getattr = not bound.get("getattr")     # an answer's own `getattr` is not the builtin
        self.consts, self.local_aliases, self._names, self._live, self._resolving = {}, {}, {}, {}, set()
        # a name bound exactly once in the whole module, to a static value or to a name/attribute chain, stands
        # for that value or chain wherever it is read (`name = "app" + "ly"`, `ap = df.apply`, `push = heappush`)
        for _ in range(3):          # constants built from constants defined later in the walk's order
            for target, value in once:
                if target not in self.consts:
                    v = self.value(value)
                    if v is not _NO and type(v) in (str, int, float, bool, type(None)):
                        self.consts[target] = v
        for target, value in once:
            if target not in self.consts and _is_chain(value):
                self.local_aliases[target] = value
        self._names.clear()         # names read above were resolved before the aliases were known
        # the bare names that stand for a computed lookup: the builtins, and whatever is imported as one
        self._dynamic_locals = {n for n in _DYNAMIC_CALLS if "." not in n and n not in self.aliases} | {
            local for local, targets in self.aliases.items()
            if any(n in _DYNAMIC_CALLS or n.startswith(_DYNAMIC_PREFIXES) for n in targets)}

    # -- names --------------------------------------------------------------------------------------------------

    def _resolve(self, name):
        if name in self.aliases:
            return self.aliases[name]
        if name in self.local_aliases and name not in self._resolving and len(self._resolving) < _ALIAS_MAX:
            self._resolving.add(name)       # `a = b.x; b = a.y` must not loop
            try:
                return self.names(self.local_aliases[name])
            finally:
                self._resolving.discard(name)
        return {name} | {f"{m}.{name}" for m in self.stars}

    def static_attribute(self, node):
        """(receiver, attribute) for `x.attr` and for `getattr(x, NAME[, default])` with a static string NAME."""
        if isinstance(node, ast.Attribute):
            return node.value, node.attr
        if isinstance(node, ast.Call) and self.builtin_getattr and isinstance(node.func, ast.Name) and \
                node.func.id == "getattr" and len(node.args) in (2, 3) and not node.keywords:
            name = self.value(node.args[1])
            if isinstance(name, str) and name.isidentifier():
                return node.args[0], name
        return None

    def names(self, node):
        """The dotted names an expression may stand for, its first name resolved through the module's imports
        (`import click as c` makes `c.echo` click.echo; `from click import echo` makes `echo` click.echo); a base
        that is not a name shows as `?` (`?.dt.strftime`), a call in the chain as `()` (`super().default`)."""
        key = id(node)
        if key not in self._names:
            parts = []
            while len(parts) <= CHAIN_MAX:
                attr = self.static_attribute(node)
                if attr is not None:
                    node, name = attr
                    parts.append("." + name)
                elif isinstance(node, ast.Call):
                    parts.append("()")
                    node = node.func
                else:
                    break
            if len(parts) > CHAIN_MAX:
                heads = set()
            elif isinstance(node, ast.Name):
                heads = self._resolve(node.id)
            else:
                heads = {"?"}
            tail = "".join(reversed(parts))
            full = {h + tail for h in heads}
            self._names[key] = {n[len("builtins."):] if n.startswith("builtins.") else n for n in full}
        return self._names[key]

    # -- static values ------------------------------------------------------------------------------------------

    def value(self, node, depth=0):
        """The value of an expression that does not depend on running anything, or _NO: constants, module
        constants, typing.TYPE_CHECKING (False), not/and/or/comparisons of static values, unary +/-, string
        concatenation, f-strings and "sep".join([...]) of static strings."""
        if depth > _DEPTH_MAX:
            return _NO
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.consts:
            return self.consts[node.id]
        if isinstance(node, (ast.Name, ast.Attribute)) and "typing.TYPE_CHECKING" in self.names(node):
            return False
        if isinstance(node, ast.UnaryOp):
            v = self.value(node.operand, depth + 1)
            if v is _NO:
                return _NO
            if isinstance(node.op, ast.Not):
                return not v
            if type(v) in (int, float) and isinstance(node.op, (ast.USub, ast.UAdd)):
                return -v if isinstance(node.op, ast.USub) else v
            return _NO
        if isinstance(node, ast.BoolOp):      # Python's own semantics: the first falsy (and) / truthy (or) value
            v = _NO
            for operand in node.values:
                v = self.value(operand, depth + 1)
                if v is _NO or bool(v) == isinstance(node.op, ast.Or):
                    return v
            return v
        if isinstance(node, ast.Compare):
            return self._compare(node, depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.value(node.left, depth + 1), self.value(node.right, depth + 1)
            return a + b if type(a) is str and type(b) is str and len(a) + len(b) <= _STR_MAX else _NO
        if isinstance(node, ast.JoinedStr):
            parts = [self.value(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1) for v in node.values]
            plain = all(v.conversion == -1 and v.format_spec is None for v in node.values
                        if isinstance(v, ast.FormattedValue))
            return "".join(parts) if plain and all(type(p) is str for p in parts) else _NO
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" and \
                len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple)):
            sep = self.value(node.func.value, depth + 1)
            parts = [self.value(e, depth + 1) for e in node.args[0].elts]
            if type(sep) is str and all(type(p) is str for p in parts):
                text = sep.join(parts)
                return text if len(text) <= _STR_MAX else _NO
        return _NO

    def _compare(self, node, depth):
        values = [self.value(v, depth + 1) for v in [node.left, *node.comparators]]
        if _NO in values or not all(type(v) in (str, int, float, bool, type(None)) for v in values):
            return _NO
        ops = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
               ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
               ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
               ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
        try:
            return all(ops[type(op)](a, b) for op, a, b in zip(node.ops, values, values[1:]))
        except (TypeError, KeyError):     # 1 < "a", 1 in 2: not static
            return _NO

    def truth(self, node):
        v = self.value(node)
        return _NO if v is _NO else bool(v)

    # -- live code ----------------------------------------------------------------------------------------------

    def live(self, entry=None, widen=False):
        """(nodes, definitions): every AST node of the code that counts, and the def/class nodes that are reached
        (their bodies count), for entry points `entry` (a tuple of names/patterns, or None: every public
        top-level definition). widen: when counted code looks names up by computed name, every definition."""
        key = (entry, widen)
        if key not in self._live:
            walk = _LiveWalk(self, entry, reach_all=False)
            if widen and walk.dynamic:
                walk = _LiveWalk(self, entry, reach_all=True)
            self._live[key] = (walk.nodes, walk.reached)
        return self._live[key]

    def is_dynamic(self, node):
        """Whether a node looks code up by computed name (the walk asks this of every live node: kept cheap)."""
        t = type(node)
        if t is ast.Name:
            return node.id in self._dynamic_locals and type(node.ctx) is ast.Load
        if t is ast.Attribute:
            return node.attr in _DYNAMIC_ATTRS or node.attr in _DYNAMIC_TAILS and any(
                n in _DYNAMIC_CALLS or n.startswith(_DYNAMIC_PREFIXES) for n in self.names(node))
        if t is ast.Call:
            f = node.func
            return type(f) is ast.Name and f.id in _GETATTR_FAMILY and self.builtin_getattr and \
                (len(node.args) < 2 or not isinstance(self.value(node.args[1]), str))
        if t is ast.Import or t is ast.ImportFrom:
            mods = [a.name for a in node.names] if t is ast.Import else [node.module or ""]
            return any(m.split(".")[0] in ("solution", "importlib", "inspect") for m in mods)
        return False

    def inert(self, decorator):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        names = self.names(target)
        return bool(names) and all(n in _INERT_DECORATORS or n.endswith(_INERT_SUFFIXES) for n in names)


class _LiveWalk:
    """One iterative walk of the module's live code (see Module.live)."""

    def __init__(self, module, entry, reach_all):
        self.module, self.entry, self.reach_all = module, entry, reach_all
        self.nodes, self.reached, self.dynamic = [], [], False
        self._reached, self._read = set(), set()
        self._waiting, self._members = {}, {}     # name -> definitions; id(class) -> its methods and inner classes
        self._stack = [("block", module.tree.body, _MODULE)]
        while self._stack:
            kind, item, owner = self._stack.pop()
            if kind == "block":
                for stmt in reversed(_live_prefix(item)):
                    self._stack.append(("node", stmt, owner))
            else:
                self._visit(item, owner)

    def _push(self, node, owner=None):
        if node is not None:
            self._stack.append(("node", node, owner))

    def _visit(self, node, owner):
        m = self.module
        self.nodes.append(node)
        t = type(node)
        if t is ast.Name:                   # the most common nodes first, and cheaply: a walk visits every one
            if type(node.ctx) is ast.Load:
                self._use(node.id)
                self.dynamic = self.dynamic or node.id in m._dynamic_locals
            return
        if t is ast.Constant:
            return
        if not self.dynamic and m.is_dynamic(node):
            self.dynamic = True
        if isinstance(node, _DEFS):
            for d in node.decorator_list:       # they run where the statement does
                self._push(d)
            if isinstance(node, ast.ClassDef):
                self._stack.append(("block", node.body, node))    # the class body runs too
            else:
                self._push(node.args)                               # defaults and annotations run
                self._push(node.returns)
            self._define(node, owner)
            return
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            self._push(node.test)
            t = m.truth(node.test)
            taken = [node.body, node.orelse] if t is _NO else [node.body if t else node.orelse]
            if isinstance(node, ast.While) and t is not _NO and t:
                taken = [node.body, node.orelse]     # `while True:` runs its body; its else is rare, keep it
            for branch in taken:
                if isinstance(branch, list):
                    self._stack.append(("block", branch, owner))
                else:
                    self._push(branch)
            return
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._push(v)
                t = m.truth(v)
                if t is not _NO and t == isinstance(node.op, ast.Or):    # `False and x`, `True or x`: x never runs
                    break
            return
        if isinstance(node, (ast.For, ast.AsyncFor)) and _empty_literal(node.iter):
            self._push(node.target)
            self._push(node.iter)
            self._stack.append(("block", node.orelse, owner))
            return
        for field in node._fields:
            value = getattr(node, field, None)
            if type(value) is list:
                if value and isinstance(value[0], ast.stmt):
                    self._stack.append(("block", value, owner))
                else:
                    for v in value:
                        if isinstance(v, ast.AST):
                            self._push(v, owner if isinstance(v, (ast.excepthandler, ast.match_case)) else None)
            elif isinstance(value, ast.AST) and not isinstance(value, ast.expr_context):    # Load/Store: no code
                self._stack.append(("node", value, None))

    def _define(self, node, owner):
        """A def/class statement ran: its body counts once something reaches it."""
        used = self.reach_all or any(not self.module.inert(d) for d in node.decorator_list)
        if isinstance(owner, ast.ClassDef):       # a method (or an inner class): reached with its class
            if used or id(owner) in self._reached:
                self._reach(node)
            else:
                self._members.setdefault(id(owner), []).append(node)
        elif used or node.name in self._read or owner == _MODULE and self._is_entry(node.name):
            self._reach(node)
        else:
            self._waiting.setdefault(node.name, []).append(node)

    def _is_entry(self, name):
        if self.entry is None:
            return not name.startswith("_")
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.entry)

    def _use(self, name):
        self._read.add(name)
        for node in self._waiting.pop(name, []):
            self._reach(node)

    def _reach(self, node):
        if id(node) in self._reached:
            return
        self._reached.add(id(node))
        self.reached.append(node)
        if isinstance(node, ast.ClassDef):
            for base in node.bases + node.keywords:
                self._push(base)
            for member in self._members.pop(id(node), []):
                self._reach(member)
        else:
            self._stack.append(("block", node.body, None))


def _live_prefix(stmts):
    """The statements of a block up to and including the first return/raise/break/continue."""
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, _ENDS_BLOCK):
            return stmts[:i + 1]
    return stmts


def _empty_literal(node):
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return not node.elts
    if isinstance(node, ast.Dict):
        return not node.keys
    return isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and not node.value


def _bindings(node):
    """The names a node binds (to tell a name bound once, a constant or an alias, from one bound twice)."""
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return [node.id]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (*_DEFS, ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return [node.name] if node.name else []
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]
    return []


def _is_chain(node):
    """A name/attribute/call chain (`df.apply`, `heapq.heappush`, `getattr(df, "apply")`, `df.groupby("a")`)."""
    for _ in range(CHAIN_MAX):
        if isinstance(node, ast.Name):
            return True
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return False
    return False


def _single_target(stmt):
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
        return stmt.target.id, stmt.value
    return None, None
