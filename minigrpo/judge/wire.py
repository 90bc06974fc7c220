"""The narrow channel between the trusted check driver and the sandboxed answer: framing and the value codec
(stdlib only: wire_values.py's, wire_shared.py's, this file's and minigrpo/judge/wire_rpc.py's source are the program
the sandboxed child runs, since the child cannot see the project tree). Requests, replies and the child's server are
in wire_rpc.py.

Messages are length-prefixed JSON. Values cross as type-tagged plain data, decided by exact type (`type(v) is
int`, never isinstance), so an answer's subclass of a builtin, an always-equal object or anything else that is not
plain data never reaches the driver as something it could compare:

    None, bool, int, float, complex, str, bytes, tuple, frozenset,
    StandIn (an object made of members: functions and plain data)    by value
    list, dict, set, bytearray                                          by value; shared where the criterion
                                                                        is about mutation: see below
    datetime, date, time, timedelta, timezone, Decimal, Fraction,
    UUID, PurePath, numpy arrays/scalars, pandas DataFrame/Series       by value (the few library types tests compare)
    anything else (functions, classes, instances, coroutines)           a handle: the peer gets a proxy whose calls,
                                                                        attribute reads and a few operations travel
                                                                        back over the channel

Mutable containers cross as copies unless the criterion is about mutation (its check says `"shared": true`):
a test's data then stays out of the answer's reach, and what the test reads after a call is what it held before.
On a shared channel they keep reference semantics at every message boundary (wire_shared.py), so "does not mutate
its input", "returns a fresh list" and "a mutable default is not shared between calls" are tested as they would be
in one process, while the values themselves are always plain data.

A value costs what it is: its size is counted as if every reference were copied (a value that holds the same list
twice counts it twice), on encoding and, on a shared channel, on decoding too; one over MAX_ITEMS is refused
(TooLarge), so a reply of a few entries that stands for an exponentially large value never reaches a comparison.
A set, frozenset or dict costs what its size allows to build: over MAX_SAME_HASH of its values sharing one hash
(which would cost n * n / 2 comparisons) are refused (Codec.hash_checked).
"""

import base64
import builtins
import json
import operator
import struct

if __name__ != "__main__":      # imported; in the child's program wire_values.py's and wire_shared.py's source has
    from minigrpo.judge.wire_values import ProtocolError, TooLarge, decode_library, decode_stdlib, encode_library, \
        library_types, stdlib_value
    from minigrpo.judge.wire_shared import MUTABLE, SharedContainers     # just defined these

MAX_MESSAGE = 16 << 20      # bytes; a longer message is a protocol error (the case fails)
MAX_DEPTH = 200             # nesting of a value; deeper is a protocol error
MAX_ITEMS = MAX_MESSAGE // 2    # a value's parts, counted as if copied: each costs at least 2 bytes of a message
MAX_SAME_HASH = 8           # values of one hash in a set, frozenset or dict built from the peer's message
SAME_HASH = f"over {MAX_SAME_HASH} values of a set or dict share one hash"     # its refusal, as a reason quotes it
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
        raise TooLarge(f"message of {len(data)} bytes")
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
        raise TooLarge(f"message of {n} bytes")
    try:
        return json.loads(_read_exact(stream, n))
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"undecodable message: {type(e).__name__}") from None


# ---------------------------------------------------------------------------------------------------------------
# Values

_NATIVE = frozenset({type(None), bool, int, float, str})


def _all_native(values):
    return set(map(type, values)) <= _NATIVE


def _expanded(v, memo, depth):
    """The parts of v counted as if every reference were copied; memo (id -> parts) makes a DAG cost its distinct
    nodes to measure, and a cycle adds nothing."""
    t = type(v)
    if t not in (list, tuple, dict, set, frozenset, StandIn):
        return 1
    if id(v) in memo:
        return memo[id(v)]
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply")
    memo[id(v)] = 0
    parts = vars(v).values() if t is StandIn else [*v.keys(), *v.values()] if t is dict else v
    memo[id(v)] = n = 1 + sum(_expanded(x, memo, depth + 1) for x in parts)
    return n


class Codec(SharedContainers):
    """One side's view of the shared values: its handles (objects the peer may call) and its shared containers.

    `side` is "c" (the sandboxed child) or "d" (the driver); ids made here carry it, so both sides' ids never clash.
    `make_proxy(handle, kind, info)` builds the local stand-in for a peer object. With `share` mutable containers
    keep reference semantics (a criterion about mutation); without, they cross as copies and the peer may not
    send a shared one.

    With `call_only` (the driver's side) only functions and iterators get a handle, as kind "callable" or
    "iterator": the peer may call the one and step the other, and nothing else of them is reachable (see
    `callable_kind`); any other object is refused, so no object of the driver but those ever crosses."""

    def __init__(self, side, make_proxy, call_only=False, share=False):
        self.side, self.make_proxy, self.call_only, self.share = side, make_proxy, call_only, share
        self.handles, self.handle_ids = {}, {}      # hid -> object we own; id(obj) -> hid
        self.proxies = {}                           # peer hid -> local proxy
        self.proxy_refs = {}                        # id(proxy) -> the peer's handle it stands for
        self.shared, self.shared_ids = {}, {}       # mid -> container; id(container) -> mid
        self.sent = {}                              # mid -> snapshot as last sent or received (to find changes)
        self.counter = 0
        self.size, self.copied = 0, {}              # parts of the value being encoded; id -> (value, encoding, parts)

    def _new_id(self, prefix):
        self.counter += 1
        return f"{self.side}{prefix}{self.counter}"

    def count(self, parts):
        self.size += parts
        if self.size > MAX_ITEMS:
            raise TooLarge(f"a value of over {MAX_ITEMS} parts, counted as if copied")

    # -- encode ------------------------------------------------------------------------------------------------
    def encode(self, v, depth=0):
        t = type(v)
        if t in _NATIVE:                   # JSON keeps these exactly (ints of any size, NaN and infinities too)
            return v
        if depth:
            return self._encode_counted(v, t, depth)
        self.size, self.copied = 0, {}
        try:
            return self._encode_counted(v, t, 0)
        finally:
            self.copied = {}

    def _encode_counted(self, v, t, depth):
        """An object met again in the same value (a DAG) reuses its encoding, and its parts count again: what
        the peer decodes is a tree of that size."""
        seen = self.copied.get(id(v))
        if seen is not None and seen[0] is v:
            self.count(seen[2])
            return seen[1]
        before = self.size
        e = self._encode(v, t, depth)
        self.count(1)
        if not (self.share and t in MUTABLE):     # a shared container crosses once, then as a reference
            self.copied[id(v)] = (v, e, self.size - before)
        return e

    def _encode(self, v, t, depth):
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
        if t in MUTABLE:
            return self._encode_shared(v, depth) if self.share else self._encode_copy(v, t, depth)
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
        if _all_native(values):
            self.count(len(values))
            return list(values)
        return [self.encode(x, depth + 1) for x in values]

    def _pairs(self, d, depth):
        if _all_native(d.keys()) and _all_native(d.values()):
            self.count(len(d))
            return list(map(list, d.items()))
        return [[self.encode(k, depth + 1), self.encode(x, depth + 1)] for k, x in d.items()]

    def _encode_copy(self, v, t, depth):
        if t is bytearray:
            return ["B", base64.b64encode(bytes(v)).decode()]
        return ["D", self._pairs(v, depth)] if t is dict else ["L" if t is list else "E", self._items(v, depth)]

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
                return frozenset(self.hash_checked(self._decode_items(e[1], depth)))
            if tag == "E":
                return set(self.hash_checked(self._decode_items(e[1], depth)))
            if tag == "B":
                return bytearray(base64.b64decode(e[1]))
            if tag == "L":
                return self._decode_items(e[1], depth)
            if tag == "D":
                return dict(self.decode_pairs(e[1], depth))
            if tag in ("M", "R") and not self.share:
                raise ProtocolError("a shared container on a channel that copies")
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

    def decode_pairs(self, pairs, depth):
        """A dict's [(key, value), ...], decoded in the order they were sent (a shared container's first
        mention must come before its references), its keys hash-checked."""
        out = [(self.decode(k, depth + 1), self.decode(x, depth + 1)) for k, x in pairs]
        self.hash_checked([k for k, _ in out])
        return out

    @staticmethod
    def hash_checked(values):
        """`values`, once no more than MAX_SAME_HASH of them share a hash: what a set or dict of them costs to
        build is then proportional to their size. Python builds one of n distinct values that share a hash with
        n * n / 2 comparisons, and the peer chooses hashes at will (the integers k * (2**61 - 1) all hash to 0,
        tuples of integers can be solved for any hash), so the hashes are counted by sorting them (n log n
        comparisons of integers, no hash table of the peer's choosing). The values of a set or the keys of a dict
        are distinct, and distinct values rarely share a hash (-1 and -2 do): no honest reply comes near."""
        hashes = sorted(map(hash, values))
        if any(map(operator.eq, hashes, hashes[MAX_SAME_HASH:])):   # sorted: a run of more than MAX_SAME_HASH
            raise ProtocolError(SAME_HASH)
        return values

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

    def check_size(self, *values):
        """On a shared channel, once a message is decoded: refuse it if its values and every shared container,
        counted as if copied, are over MAX_ITEMS. All of them, measured at the end: a message (or a run of them)
        may refill a container that others refer to, so only the whole shows the size."""
        if not self.share:
            return          # copies: the message's own bytes are the value's size
        memo, self.size = {}, 0
        for v in (*values, *self.shared.values()):
            self.count(_expanded(v, memo, 0))
