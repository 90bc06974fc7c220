"""Mutable containers on a shared channel (a criterion about mutation, `"shared": true`): reference semantics at
every message boundary. Each side gives a container it sends an id (["M", id, kind, contents] the first time,
["R", id] after); before each message the sender re-sends the contents of every shared container that changed since
it was last sent, and the receiver updates its copy in place. Part of wire.Codec (a mixin: it uses the codec's
encode, decode and id maker); standard library only, and in the sandboxed child's program this file's source comes
after wire_values.py's and before wire.py's.
"""

import base64
import operator

if __name__ != "__main__":      # imported; in the child's program wire_values.py's source has just defined it
    from minigrpo.judge.wire_values import ProtocolError

MUTABLE = (list, dict, set, bytearray)
_KINDS = {"list": list, "dict": dict, "set": set, "bytearray": bytearray}


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


class SharedContainers:
    """The shared-container half of wire.Codec: `shared` (id -> container), `shared_ids` and `sent` (id ->
    snapshot as last sent or received) live on the codec."""

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

    def _decode_shared(self, mid, kind, contents, depth):
        if not isinstance(mid, str) or mid[:1] == self.side:
            raise ProtocolError("shared id not the peer's")
        obj = self.shared.get(mid)
        if obj is None:
            obj = _KINDS[kind]()
            self.shared[mid], self.shared_ids[id(obj)] = obj, mid
        self._fill(obj, contents, depth)
        self.sent[mid] = _snapshot(obj)
        return obj

    def _fill(self, obj, contents, depth=0):
        if type(obj) is list:
            obj[:] = self._decode_items(contents, depth)
        elif type(obj) is dict:
            items = self.decode_pairs(contents, depth)
            obj.clear()
            obj.update(items)
        elif type(obj) is set:
            items = self.hash_checked(self._decode_items(contents, depth))
            obj.clear()
            obj.update(items)
        else:
            obj[:] = base64.b64decode(contents)

    # -- shared-container sync ---------------------------------------------------------------------------------
    def changes(self):
        """[[mid, contents], ...] of the shared containers whose contents changed since last sent or received."""
        out = []
        for mid, obj in list(self.shared.items()):
            if not _unchanged(obj, self.sent.get(mid)):
                self.size, self.copied = 0, {}
                out.append([mid, self._contents(obj)])
                self.sent[mid] = _snapshot(obj)
        return out

    def preregister(self, message):
        """Create (empty) every container the message body sends in full that we do not hold yet, so that a sync
        entry naming it (an old container that now holds a new one) resolves before the body is decoded."""
        if not self.share:
            return
        stack = [v for k, v in message.items() if k != "sync"] if isinstance(message, dict) else []
        while stack:
            e = stack.pop()
            if type(e) is list:
                if len(e) == 4 and e[0] == "M" and isinstance(e[1], str) and e[1][:1] != self.side \
                        and e[1] not in self.shared and e[2] in ("list", "dict", "set", "bytearray"):
                    obj = _KINDS[e[2]]()
                    self.shared[e[1]], self.shared_ids[id(obj)] = obj, e[1]
                stack.extend(e)
            elif type(e) is dict:
                stack.extend(e.values())

    def apply(self, changes):
        if changes and not self.share:
            raise ProtocolError("a shared container on a channel that copies")
        for mid, contents in changes or ():
            obj = self.shared.get(mid)
            if obj is None:
                raise ProtocolError("sync of an unknown container")
            self._fill(obj, contents)
            self.sent[mid] = _snapshot(obj)
