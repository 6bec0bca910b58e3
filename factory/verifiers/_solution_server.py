"""The solution's side of the import boundary: serves the agent's modules to the trusted side.

Sent as source (after :mod:`._wire`) to ``python -I -B -c`` in the
*solution* sandbox, which holds the agent's files and no test file. It reads
its settings from stdin, listens on a Unix socket in the directory shared
with the trusted sandbox, accepts exactly one connection, removes the socket,
and only then puts the workspace on ``sys.path`` (last, so nothing in it
shadows the standard library) — no agent code runs before the one trusted
peer is connected. Then it answers requests until the peer
hangs up: import a module, get/set/delete an attribute, call, and the few
operations containers need (``len``, ``iter``, ``next``, item access,
``in``, ``str``, ``repr``, ``isinstance``) and arithmetic operators.

Results cross as plain data when their type is exactly a plain type, and as
handles otherwise; exceptions cross as their class name and message (a
builtin class by name, a solution class by handle). Nothing in this process
is trusted: the agent's code can rewrite every line of it at run time, and
all it gains is the ability to send the trusted side other plain data.
"""

from __future__ import annotations

import builtins
import os
import socket
import sys
import types

if __name__ != "__main__":  # imported on the host (tests); in the sandbox _wire's source precedes this
    from factory.verifiers._wire import Channel, WireError, decode_value, encode_value

__all__ = ["SolutionServer", "serve"]


def _builtin_exception_name(cls):
    """The nearest builtin ``Exception`` class in ``cls``'s MRO (``Exception`` at worst)."""
    for base in cls.__mro__:
        if getattr(builtins, base.__name__, None) is base and issubclass(base, Exception):
            return base.__name__
    return "Exception"


class SolutionServer:
    """Objects of the solution, kept by handle, and the operations on them."""

    def __init__(self, channel):
        self.channel = channel
        self.objects = {}
        self.ids = {}

    def handle_of(self, obj):
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = len(self.objects) + 1
            self.objects[self.ids[key]] = obj
        handle = {"h": self.ids[key], "type": type(obj).__name__}
        if isinstance(obj, types.ModuleType):
            handle["k"] = "module"
            handle["name"] = obj.__name__
            handle["package"] = hasattr(obj, "__path__")
        elif isinstance(obj, type):
            handle["k"] = "class"
            handle["name"] = obj.__qualname__
            if issubclass(obj, BaseException):
                handle["exc"] = _builtin_exception_name(obj)
                handle["bases"] = [self.handle_of(base) for base in obj.__bases__
                                   if getattr(builtins, base.__name__, None) is not base]
        elif callable(obj):
            handle["k"] = "callable"
            handle["name"] = getattr(obj, "__qualname__", type(obj).__name__)
        else:
            handle["k"] = "object"
        return handle

    def resolve(self, data):
        try:
            return self.objects[data["h"]]
        except (KeyError, TypeError):
            raise WireError(f"unknown handle {data!r}") from None

    def value(self, data):
        return decode_value(data, self.resolve)

    def encode(self, value):
        return encode_value(value, self.handle_of)

    def encode_exception(self, exc):
        cls = type(exc)
        builtin = getattr(builtins, cls.__name__, None) is cls
        try:
            message = str(exc)
        except Exception:
            message = f"<unprintable {cls.__name__}>"
        return {"type": cls.__name__ if builtin else _builtin_exception_name(cls), "builtin": builtin,
                "cls": None if builtin else self.handle_of(cls), "message": message[:2000]}

    def dispatch(self, request):
        op = request["op"]
        if op == "import":
            import importlib

            return importlib.import_module(request["name"])
        target = self.resolve(request["h"]) if "h" in request else None
        if op == "getattr":
            return getattr(target, request["name"])
        if op == "setattr":
            setattr(target, request["name"], self.value(request["v"]))
            return None
        if op == "delattr":
            delattr(target, request["name"])
            return None
        if op == "call":
            args = [self.value(a) for a in request["a"]]
            kwargs = {name: self.value(v) for name, v in request["k"]}
            return target(*args, **kwargs)
        if op == "len":
            return len(target)
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "str":
            return str(target)
        if op == "repr":
            return repr(target)
        if op == "getitem":
            return target[self.value(request["key"])]
        if op == "setitem":
            target[self.value(request["key"])] = self.value(request["v"])
            return None
        if op == "delitem":
            del target[self.value(request["key"])]
            return None
        if op == "contains":
            return self.value(request["v"]) in target
        if op == "isinstance":
            return isinstance(target, self.resolve(request["cls"]))
        if op == "binop":  # arithmetic the solution's objects define (+, -, *, ...): their own semantics
            import operator

            function = getattr(operator, request["name"])
            other = self.value(request["v"])
            return function(other, target) if request.get("reflected") else function(target, other)
        if op == "unop":
            import operator

            return getattr(operator, request["name"])(target)
        if op == "dir":
            return sorted(str(name) for name in dir(target))
        raise WireError(f"unknown operation {op!r}")

    def serve(self):
        while True:
            try:
                request = self.channel.receive()
            except EOFError:
                return
            try:
                reply = {"ok": self.encode(self.dispatch(request))}
            except WireError as exc:
                reply = {"exc": {"type": "TypeError", "builtin": True, "cls": None, "message": str(exc)}}
            except BaseException as exc:  # SystemExit, KeyboardInterrupt too: they cross as errors
                try:
                    reply = {"exc": self.encode_exception(exc)}
                except BaseException:
                    reply = {"exc": {"type": "Exception", "builtin": True, "cls": None,
                                     "message": "the solution raised an exception that could not be described"}}
            try:
                self.channel.send(reply)
            except WireError as exc:
                self.channel.send({"exc": {"type": "TypeError", "builtin": True, "cls": None,
                                           "message": str(exc)}})


def serve(settings):
    """Listen, accept the trusted peer, then serve the workspace's modules to it."""
    path = settings["socket"]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener.bind(path)
    os.chmod(path, 0o666)  # the trusted side runs as another uid
    listener.listen(1)
    listener.settimeout(settings.get("accept_timeout", 60))
    connection, _ = listener.accept()
    listener.close()
    os.unlink(path)
    connection.settimeout(None)
    # Agent code becomes importable only now, after the one trusted peer is connected, and last on the
    # path: nothing in the workspace shadows the standard library or an installed package.
    sys.path.extend(os.path.abspath(root) for root in settings["paths"])
    SolutionServer(Channel(connection)).serve()


if __name__ == "__main__":
    import json

    sys.dont_write_bytecode = True
    _settings = json.loads(sys.stdin.read())
    sys.stdin.close()
    serve(_settings)
