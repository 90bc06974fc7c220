"""Request/reply over the channel of minigrpo/judge/wire.py: `Endpoint` (both sides) and the sandboxed child's server
(`serve`, its `Peer` stand-ins for the driver's objects, `child_main`). Standard library only.

The child runs no file of the project: minigrpo/judge/driver.py hands it wire.py's source followed by this file's as
one `python -I -c` program, so there the names below that come from wire.py are already defined; imported as a
module, this file imports them from minigrpo.judge.wire.

The child (`serve`) imports the answer as module `solution` on the driver's first request, answers requests
(call, getattr, setattr, op, run a harness snippet) and, while it waits for the driver, serves the driver's
callbacks. Exceptions cross as (class name, builtin base, message) and a random token: an exception raised back
across the channel (a callback's exception that the answer re-raises) arrives as the very object first raised, a
copy of it as a new one. An exception that is not an Exception (exit, interrupt) is reported as `exit`, which the
driver treats as a failed case, never as a pass.
"""

import secrets
import sys

if __name__ != "__main__":      # imported; in the child's program wire.py's source has just defined these names
    from minigrpo.judge.wire import _PLAIN_EXC, Codec, PeerGone, ProtocolError, TooLarge, builtin_base, read_message, \
        send_message


# ---------------------------------------------------------------------------------------------------------------
# One end of the channel: request/reply with nested requests from the peer served while we wait

class Endpoint:
    """`request(op, **fields)` sends a request and returns the decoded result, serving the peer's requests that
    arrive meanwhile with `handle(message)`. Both sides are single-threaded per request chain."""

    share_exception_classes = True      # an exception of a class of ours crosses with a handle to its class
    KEPT_EXCEPTIONS = 16    # the last exceptions each way whose identity a raise back keeps: a retry loop's; each
                            # kept one pins its traceback's frames (the answer's objects, in its memory) meanwhile

    def __init__(self, side, rfile, wfile, make_proxy, handle, call_only=False, share=False):
        self.codec = Codec(side, make_proxy, call_only, share)
        self.rfile, self.wfile, self.handle = rfile, wfile, handle
        self.sent = {}          # token -> an exception of ours raised to the peer
        self.received = {}      # id -> (the peer's token, the exception made here for it)

    def identity(self, e):
        """The token of an exception raised to the peer: the peer's own when e is the object it raised to us (raised
        back), else a new one of ours, random so that none can be guessed."""
        theirs = self.received.get(id(e))
        if theirs is not None and theirs[1] is e:
            return {"yours": theirs[0]}
        token = secrets.token_hex(8)
        self.sent[token] = e
        _keep_last(self.sent, self.KEPT_EXCEPTIONS)
        return {"token": token}

    def raised_here(self, message):
        """The exception to raise for the peer's `raise` reply: one of ours raised back is that object itself."""
        mine = self.sent.get(message.get("yours")) if isinstance(message.get("yours"), str) else None
        if mine is not None:
            return mine
        name, base, text = (str(x)[:500] for x in message["raise"][:3])
        e = self.exception(name, base, text, message.get("handle"))
        if isinstance(message.get("token"), str):
            self.received[id(e)] = (message["token"][:32], e)
            _keep_last(self.received, self.KEPT_EXCEPTIONS)
        return e

    def exception(self, name, base, text, handle):
        """The exception to raise here for one raised on the other side: the builtin class it derives from."""
        cls = _PLAIN_EXC.get(base, Exception)
        if not issubclass(cls, Exception):
            cls = Exception
        return cls(text)

    def send(self, message):
        message["sync"] = self.codec.changes()
        send_message(self.wfile, message)

    def request(self, op, **fields):
        self.send({"op": op, **fields})
        return self.wait()

    def wait(self):
        while True:
            message = read_message(self.rfile)
            if not isinstance(message, dict):
                raise ProtocolError("message is not an object")
            self.codec.preregister(message)
            self.codec.apply(message.get("sync"))
            if "op" in message:
                self.reply_to(message)
                continue
            if "ok" in message:
                value = self.codec.decode(message["ok"])
                self.codec.check_size(value)
                return value
            self.codec.check_size()
            if "too_large" in message:
                raise TooLarge("the peer's reply, counted as if copied, is over the cap")
            if "raise" in message:
                raise self.raised_here(message)
            if "exit" in message:
                raise PeerGone(f"the other side exited ({str(message['exit'])[:100]})")
            raise ProtocolError("message is neither a request nor a reply")

    def reply_to(self, message):
        """Answer one request. A result over the cap is answered as such (`too_large`), never as an exception
        the requesting code could catch."""
        try:
            value = self.handle(message)
            reply = {"ok": self.codec.encode(value)}
        except TooLarge:
            reply = {"too_large": True}
        except (PeerGone, ProtocolError):
            raise
        except Exception as e:      # the handled code raised: send it over by name
            reply = {"raise": [type(e).__name__, builtin_base(type(e)), str(e)[:500]],
                     "handle": self.codec.encode(type(e)) if type(e).__module__ != "builtins"
                     and self.share_exception_classes else None, **self.identity(e)}
        except BaseException as e:  # exit, interrupt: never a normal result
            reply = {"exit": type(e).__name__}
            self.send(reply)
            raise
        try:
            self.send(reply)
        except TooLarge:
            self.send({"too_large": True})


def _keep_last(table, n):
    """Drop a dict's oldest entries past n (dicts keep insertion order)."""
    while len(table) > n:
        del table[next(iter(table))]


# ---------------------------------------------------------------------------------------------------------------
# The sandboxed child: serves the driver's requests on the answer's module

def serve(rfile, wfile):
    """Run in the sandbox: answer the driver's requests until it closes the channel."""
    import types                  # asyncio is imported only when a coroutine shows up: it costs the child ~0.1 s

    module = {}
    endpoint = None

    def make_proxy(hid, kind, info):
        return _peer_class(kind, info)(endpoint, hid, info)

    def namespace():
        if "solution" not in module:
            import importlib
            module["solution"] = importlib.import_module("solution")
        return module["solution"]

    def handle(message):
        op, codec = message.get("op"), endpoint.codec
        if op == "import":      # the driver says whether this criterion shares containers (one about mutation)
            codec.share = message.get("share") is True
            mod = namespace()
            names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
            # the answer's own names; modules it imported stay here (the test imports its own)
            return {str(n): getattr(mod, n) for n in names
                    if hasattr(mod, n) and type(getattr(mod, n)).__name__ != "module"}
        target = codec.decode(message["target"]) if "target" in message else None
        args = [codec.decode(a) for a in message.get("args", [])]
        kwargs = {str(k): codec.decode(v) for k, v in message.get("kwargs", [])}
        if op == "call":
            result = target(*args, **kwargs)
            if isinstance(result, types.CoroutineType) and message.get("run_coroutine"):
                import asyncio
                result = asyncio.run(result)
            return result
        if op == "await":
            if not isinstance(target, types.CoroutineType):
                return target
            import asyncio
            return asyncio.run(_await(target))
        if op == "getattr":
            return getattr(target, str(message["name"]))
        if op == "setattr":
            setattr(target, str(message["name"]), args[0])
            return None
        if op == "unary":
            fn = {"len": len, "bool": bool, "str": str, "repr": repr, "iter": iter, "next": next,
                  "hash": hash}[message["name"]]
            return fn(target)
        if op == "binary":
            name = message["name"]
            if name == "getitem":
                return target[args[0]]
            if name == "contains":
                return args[0] in target
            if name == "setitem":
                target[args[0]] = args[1]
                return None
            if name == "delitem":
                del target[args[0]]
                return None
        if op == "exec":    # a trusted harness snippet from the driver: runs beside the answer, returns `result`
            scope = dict(vars(namespace()))
            scope.update(kwargs)
            exec(compile(message["source"], "<harness>", "exec"), scope)
            return scope.get("result")
        raise ProtocolError(f"unknown op {str(op)[:20]!r}")

    endpoint = Endpoint("c", rfile, wfile, make_proxy, handle)
    while True:
        try:
            message = read_message(rfile)
        except PeerGone:
            return
        if not isinstance(message, dict):
            raise ProtocolError("message is not an object")
        endpoint.codec.preregister(message)
        endpoint.codec.apply(message.get("sync"))
        endpoint.reply_to(message)


async def _await(coroutine):
    return await coroutine


def _peer_class(kind, info):
    """Child-side stand-in for a driver object (a callback the test handed to the answer)."""
    class Peer:
        __slots__ = ("_endpoint", "_hid", "_info")

        def __init__(self, endpoint, hid, info):
            object.__setattr__(self, "_endpoint", endpoint)
            object.__setattr__(self, "_hid", hid)
            object.__setattr__(self, "_info", info)

        def _ask(self, op, **fields):
            return self._endpoint.request(op, target=["H", self._hid, kind, self._info], **fields)

        def __call__(self, *args, **kwargs):
            codec = self._endpoint.codec
            return self._ask("call", args=[codec.encode(a) for a in args],
                             kwargs=[[k, codec.encode(v)] for k, v in kwargs.items()])

        def __getattr__(self, name):
            return self._ask("getattr", name=name)

        def __len__(self):
            return self._ask("unary", name="len")

        def __iter__(self):
            return self._ask("unary", name="iter")

        def __next__(self):
            return self._ask("unary", name="next")

    Peer.__name__ = str(info.get("name", "Peer"))
    return Peer


def child_main():
    """Entry point inside the sandbox: the channel moves to private descriptors; fds 0-2 go to /dev/null, so
    nothing the answer prints reaches the driver."""
    import os
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.path.insert(0, os.getcwd())
    sys.setrecursionlimit(10000)
    serve(os.fdopen(rfd, "rb", buffering=0), os.fdopen(wfd, "wb", buffering=0))
    os._exit(0)


if __name__ == "__main__":
    child_main()
