"""The narrow channel between the trusted check driver and the sandboxed answer: framing and the value codec
(stdlib only: this file's source, followed by minigrpo/judge/wire_rpc.py's, is the program the sandboxed child runs,
since the child cannot see the project tree). Requests, replies and the child's server are in wire_rpc.py.

Messages are length-prefixed JSON. Values cross as type-tagged plain data, decided by exact type (`type(v) is
int`, never isinstance), so an answer's subclass of a builtin, an always-equal object or anything else that is not
plain data never reaches the driver as something it could compare:

    None, bool, int, float, complex, str, bytes, tuple, frozenset,
    StandIn (an object made of members: functions and plain data)    by value
    list, dict, set, bytearray                                          shared: see below
    datetime, date, time, timedelta, timezone, Decimal, Fraction,
    UUID, PurePath, numpy arrays/scalars, pandas DataFrame/Series       by value (the few library types tests compare)
    anything else (functions, classes, instances, coroutines)           a handle: the peer gets a proxy whose calls,
                                                                        attribute reads and a few operations travel
                                                                        back over the channel

Mutable containers keep reference semantics at every message boundary: each side gives a container it sends an id,
and before each message the sender re-sends the contents of every shared container that changed since it was last
sent; the receiver updates its copy in place. So "does not mutate its input", "returns a fresh list" and "a mutable
default is not shared between calls" are tested as they would be in one process, while the values themselves are
always plain data.
"""

import base64
import builtins
import json
import operator
import struct

if __name__ != "__main__":      # imported; in the child's program wire_values.py's source has just defined these
    from minigrpo.judge.wire_values import ProtocolError, decode_library, decode_stdlib, encode_library, \
        library_types, stdlib_value

MAX_MESSAGE = 16 << 20      # bytes; a longer message is a protocol error (the case fails)
MAX_DEPTH = 200             # nesting of a value; deeper is a protocol error
_PLAIN_EXC = {}             # builtin exception classes by name, filled below


class PeerGone(Exception):
    """The other end closed the channel (the sandboxed process exited or was killed)."""


class Raised(Exception):
    """An exception raised on the other side: `name` (its class), `base` (nearest builtin base), `message`."""

    def __init__(self, name, base, message, handle=None):
        super().__init__(f"{name}: {message}")
        self.name, self.base, self.message, self.handle = name, base, message, handle


for _name, _obj in vars(builtins).items():
    if isinstance(_obj, type) and issubclass(_obj, BaseException):
        _PLAIN_EXC[_name] = _obj


class StandIn:
    """An object made of members, which crosses by value: `StandIn(random=rng.random, name="x")` reaches the peer
    as a fresh StandIn of its own whose `random` is a call-only stand-in for rng.random. It is how a test hands the
    answer an object to call methods on (an rng, a clock, a fetcher, a database) while the object stays here."""

    def __init__(self, **members):
        self.__dict__.update(members)

    def __repr__(self):
        return f"StandIn({', '.join(sorted(vars(self)))})"


def call_only_kind(v):
    """'callable' for a function (Python or builtin, a bound method, a partial), 'iterator' for an iterator or
    generator, else None: what the driver's side may hand over. A class is not a function here: calling one makes
    an instance, which could not cross."""
    t = type(v)
    if t.__name__ in ("function", "builtin_function_or_method", "method", "method-wrapper") and \
            t.__module__ == "builtins" or t.__module__ == "functools" and t.__name__ == "partial":
        return "callable"
    if hasattr(t, "__next__") and hasattr(t, "__iter__") and not isinstance(v, type):
        return "iterator"
    return None


def builtin_base(cls):
    """Name of the first builtin exception class in cls's MRO ('Exception' at worst)."""
    for klass in cls.__mro__:
        if klass.__module__ == "builtins" and klass.__name__ in _PLAIN_EXC:
            return klass.__name__
    return "Exception"


# ---------------------------------------------------------------------------------------------------------------
# Framing

def send_message(stream, message):
    try:
        data = json.dumps(message, separators=(",", ":")).encode()
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"unencodable message: {type(e).__name__}") from None
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes")
    try:
        stream.write(struct.pack(">I", len(data)) + data)
        stream.flush()
    except OSError:
        raise PeerGone("channel closed") from None


def _read_exact(stream, n):
    chunks, left = [], n
    while left:
        try:
            chunk = stream.read(left)
        except OSError:
            chunk = b""
        if not chunk:
            raise PeerGone("channel closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(stream):
    (n,) = struct.unpack(">I", _read_exact(stream, 4))
    if n > MAX_MESSAGE:
        raise ProtocolError(f"message of {n} bytes")
    try:
        return json.loads(_read_exact(stream, n))
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"undecodable message: {type(e).__name__}") from None


# ---------------------------------------------------------------------------------------------------------------
# Values

_MUTABLE = (list, dict, set, bytearray)
_NATIVE = frozenset({type(None), bool, int, float, str})


def _all_native(values):
    return set(map(type, values)) <= _NATIVE


def _snapshot(v):
    """What a shared container holds now, by identity: the objects in it (a dict: its keys, then its values), or a
    bytearray's bytes."""
    if type(v) is bytearray:
        return bytes(v)
    if type(v) is dict:
        return list(v), list(v.values())
    return list(v)      # list; a set in its (stable while unchanged) iteration order


def _unchanged(v, snap):
    """Whether v holds the very objects its snapshot does, in the same order. By identity, not ==: 1 -> True or
    1 -> 1.0 is a change (the wire keeps exact types), and an unchanged container costs no encoding to check."""
    if type(v) is bytearray:
        return v == snap
    if type(v) is dict:
        return type(snap) is tuple and len(v) == len(snap[0]) and all(map(operator.is_, v, snap[0])) \
            and all(map(operator.is_, v.values(), snap[1]))
    return type(snap) is list and len(v) == len(snap) and all(map(operator.is_, v, snap))


class Codec:
    """One side's view of the shared values: its handles (objects the peer may call) and its shared containers.

    `side` is "c" (the sandboxed child) or "d" (the driver); ids made here carry it, so both sides' ids never clash.
    `make_proxy(handle, kind, info)` builds the local stand-in for a peer object.

    With `call_only` (the driver's side) only functions and iterators get a handle, as kind "callable" or
    "iterator": the peer may call the one and step the other, and nothing else of them is reachable (see
    `callable_kind`); any other object is refused, so no object of the driver but those ever crosses."""

    def __init__(self, side, make_proxy, call_only=False):
        self.side, self.make_proxy, self.call_only = side, make_proxy, call_only
        self.handles, self.handle_ids = {}, {}      # hid -> object we own; id(obj) -> hid
        self.proxies = {}                           # peer hid -> local proxy
        self.proxy_refs = {}                        # id(proxy) -> the peer's handle it stands for
        self.shared, self.shared_ids = {}, {}       # mid -> container; id(container) -> mid
        self.sent = {}                              # mid -> snapshot as last sent or received (to find changes)
        self.counter = 0

    def _new_id(self, prefix):
        self.counter += 1
        return f"{self.side}{prefix}{self.counter}"

    # -- encode ------------------------------------------------------------------------------------------------
    def encode(self, v, depth=0):
        t = type(v)
        if t in _NATIVE:                   # JSON keeps these exactly (ints of any size, NaN and infinities too)
            return v
        if depth > MAX_DEPTH:
            raise ProtocolError("value nested too deeply")
        if t is complex:
            return ["C", repr(v.real), repr(v.imag)]
        if t is bytes:
            return ["Y", base64.b64encode(v).decode()]
        if t is tuple:
            return ["T", self._items(v, depth)]
        if t is frozenset:
            return ["Z", self._items(v, depth)]
        if t is StandIn:
            return ["S", self._pairs(vars(v), depth)]
        if t in _MUTABLE:
            return self._encode_shared(v, depth)
        if t.__module__ == "collections" and t.__name__ in ("OrderedDict", "defaultdict", "Counter", "deque"):
            # stdlib containers whose comparison we trust: sent as a plain dict / list (by value)
            return ["D", self._pairs(v, depth)] if isinstance(v, dict) else ["L", self._items(v, depth)]
        known = stdlib_value(v, t, self, depth)
        if known is not None:
            return known
        lib = library_types().get(t)
        if lib:
            return encode_library(self, lib, v, depth)
        ref = self.proxy_refs.get(id(v))
        if ref is not None and self.proxies.get(ref[1]) is v:
            return ref                      # a stand-in for one of the peer's objects goes back as that object
        if t.__module__ == "numpy" and hasattr(v, "dtype") and getattr(v, "shape", None) == ():
            return ["np", v.dtype.str, base64.b64encode(v.tobytes()).decode()]    # a numpy scalar
        return self._encode_handle(v)

    def _items(self, values, depth):
        return list(values) if _all_native(values) else [self.encode(x, depth + 1) for x in values]

    def _pairs(self, d, depth):
        if _all_native(d.keys()) and _all_native(d.values()):
            return list(map(list, d.items()))
        return [[self.encode(k, depth + 1), self.encode(x, depth + 1)] for k, x in d.items()]

    def _contents(self, v, depth=0):
        if type(v) is dict:
            return self._pairs(v, depth)
        if type(v) is bytearray:
            return base64.b64encode(bytes(v)).decode()
        return self._items(v, depth)      # list, set

    def _encode_shared(self, v, depth):
        mid = self.shared_ids.get(id(v))
        if mid is not None and self.shared.get(mid) is v:
            return ["R", mid]
        mid = self._new_id("m")
        self.shared[mid], self.shared_ids[id(v)] = v, mid
        contents = self._contents(v, depth)
        self.sent[mid] = _snapshot(v)          # as the next sync will see it (nested containers by reference)
        return ["M", mid, type(v).__name__, contents]

    def _encode_handle(self, v):
        if self.call_only:
            return self._encode_call_only(v)
        hid = self.handle_ids.get(id(v))
        if hid is None or self.handles.get(hid) is not v:
            hid = self._new_id("h")
            self.handles[hid], self.handle_ids[id(v)] = v, hid
        kind = "class" if isinstance(v, type) else "callable" if callable(v) else "object"
        info = {"name": getattr(v, "__name__", type(v).__name__) if kind != "object" else type(v).__name__}
        if kind == "class" and issubclass(v, BaseException):
            info["exception"] = builtin_base(v)
        if kind == "object":
            info["cls"] = self._encode_handle(type(v))[1]
        if type(v).__name__ == "coroutine":
            kind = "coroutine"
        return ["H", hid, kind, info]

    def _encode_call_only(self, v):
        kind = call_only_kind(v)
        if kind is None:
            raise ProtocolError(f"a {type(v).__name__} object cannot be handed to the answer (only functions, "
                                "iterators and plain data cross)")
        hid = self.handle_ids.get(id(v))
        if hid is None or self.handles.get(hid) is not v:
            hid = self._new_id("h")
            self.handles[hid], self.handle_ids[id(v)] = v, hid
        return ["H", hid, kind, {"name": "callback" if kind == "callable" else "iterator"}]

    # -- decode ------------------------------------------------------------------------------------------------
    def decode(self, e, depth=0):
        if type(e) is not list:
            if type(e) in _NATIVE:
                return e
            raise ProtocolError("malformed value")
        if depth > MAX_DEPTH:
            raise ProtocolError("value nested too deeply")
        try:
            tag = e[0]
            if tag == "C":
                return complex(float(e[1]), float(e[2]))
            if tag == "Y":
                return base64.b64decode(e[1])
            if tag == "T":
                return tuple(self._decode_items(e[1], depth))
            if tag == "S":
                return StandIn(**{str(k): self.decode(x, depth + 1) for k, x in e[1]})
            if tag == "Z":
                return frozenset(self._decode_items(e[1], depth))
            if tag == "L":
                return self._decode_items(e[1], depth)
            if tag == "D":
                return {self.decode(k, depth + 1): self.decode(x, depth + 1) for k, x in e[1]}
            if tag == "M":
                return self._decode_shared(e[1], e[2], e[3], depth)
            if tag == "R":
                return self.shared[e[1]]
            if tag in ("dt", "date", "time", "td", "tz", "dec", "frac", "uuid", "path"):
                return decode_stdlib(self, e, depth)
            if tag in ("nd", "ndo", "np", "df", "ser"):
                return decode_library(self, e, depth)
            if tag == "H":
                return self._decode_handle(e[1], e[2], e[3])
        except ProtocolError:
            raise
        except (IndexError, KeyError, TypeError, ValueError, OverflowError, RecursionError) as err:
            raise ProtocolError(f"malformed value ({type(err).__name__})") from None
        raise ProtocolError("unknown value tag")     # never the peer's text: it could end up in a reason

    def _decode_items(self, items, depth):
        if type(items) is not list:
            raise ProtocolError("malformed container")
        return items[:] if _all_native(items) else [self.decode(x, depth + 1) for x in items]

    def _decode_shared(self, mid, kind, contents, depth):
        if not isinstance(mid, str) or mid[:1] == self.side:
            raise ProtocolError("shared id not the peer's")
        obj = self.shared.get(mid)
        if obj is None:
            obj = {"list": list, "dict": dict, "set": set, "bytearray": bytearray}[kind]()
            self.shared[mid], self.shared_ids[id(obj)] = obj, mid
        self._fill(obj, contents, depth)
        self.sent[mid] = _snapshot(obj)
        return obj

    def _fill(self, obj, contents, depth=0):
        if type(obj) is list:
            obj[:] = self._decode_items(contents, depth)
        elif type(obj) is dict:
            items = [(self.decode(k, depth + 1), self.decode(x, depth + 1)) for k, x in contents]
            obj.clear()
            obj.update(items)
        elif type(obj) is set:
            items = self._decode_items(contents, depth)
            obj.clear()
            obj.update(items)
        else:
            obj[:] = base64.b64decode(contents)

    def _decode_handle(self, hid, kind, info):
        if not isinstance(hid, str) or not isinstance(info, dict):
            raise ProtocolError("bad handle")
        if hid[:1] == self.side:            # one of ours coming back
            if hid not in self.handles:
                raise ProtocolError("unknown handle")
            return self.handles[hid]
        proxy = self.proxies.get(hid)
        if proxy is None:
            proxy = self.proxies[hid] = self.make_proxy(hid, str(kind), info)
            self.proxy_refs[id(proxy)] = ["H", hid, str(kind), info]
        return proxy

    # -- shared-container sync ---------------------------------------------------------------------------------
    def changes(self):
        """[[mid, contents], ...] of the shared containers whose contents changed since last sent or received."""
        out = []
        for mid, obj in list(self.shared.items()):
            if not _unchanged(obj, self.sent.get(mid)):
                out.append([mid, self._contents(obj)])
                self.sent[mid] = _snapshot(obj)
        return out

    def preregister(self, message):
        """Create (empty) every container the message body sends in full that we do not hold yet, so that a sync
        entry naming it (an old container that now holds a new one) resolves before the body is decoded."""
        stack = [v for k, v in message.items() if k != "sync"] if isinstance(message, dict) else []
        while stack:
            e = stack.pop()
            if type(e) is list:
                if len(e) == 4 and e[0] == "M" and isinstance(e[1], str) and e[1][:1] != self.side \
                        and e[1] not in self.shared and e[2] in ("list", "dict", "set", "bytearray"):
                    obj = {"list": list, "dict": dict, "set": set, "bytearray": bytearray}[e[2]]()
                    self.shared[e[1]], self.shared_ids[id(obj)] = obj, e[1]
                stack.extend(e)
            elif type(e) is dict:
                stack.extend(e.values())

    def apply(self, changes):
        for mid, contents in changes or ():
            obj = self.shared.get(mid)
            if obj is None:
                raise ProtocolError("sync of an unknown container")
            self._fill(obj, contents)
            self.sent[mid] = _snapshot(obj)
