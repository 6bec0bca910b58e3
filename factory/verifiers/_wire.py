"""The wire between the trusted test process and the solution process.

Both ends of the import boundary (:mod:`._solution_server` inside the
solution's sandbox, :mod:`._trusted_runner` beside pytest) are sent as
source to ``python -I -c``; this module's source is prepended to each, so it
uses the standard library only and defines nothing that depends on
``factory``.

Frames are a 4-byte big-endian length and a UTF-8 JSON body, at most
``MAX_FRAME`` bytes. Values are *plain data* only, each tagged so that the
type survives exactly: ``None``, ``bool``, ``int``, ``float``, ``complex``,
``str``, ``bytes``, ``range`` and ``list``/``tuple``/``dict``/``set``/``frozenset`` of
them, plus handles (``{"h": id, ...}``) standing for objects that stay in the
solution's process. Encoding checks exact types (``type(x) is int``, never
``isinstance``), so an ``int`` subclass with a lying ``__eq__`` can only
cross as a handle; decoding accepts nothing but these tags and rebuilds
nothing but builtins, so whatever the solution sends cannot run code on the
trusted side.
"""

from __future__ import annotations

import base64
import json
import socket
import struct

__all__ = ["MAX_DEPTH", "MAX_FRAME", "PLAIN_SCALARS", "Channel", "WireError", "decode_value", "encode_value"]

MAX_FRAME = 64 * 1024 * 1024
MAX_DEPTH = 200
PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes, range)
_CONTAINERS = {list: "l", tuple: "t", set: "s", frozenset: "fs"}


class WireError(Exception):
    """A frame or value that breaks the protocol (too big, too deep, malformed, not plain)."""


def encode_value(value, handle_of, depth=0):
    """The tagged JSON form of ``value``.

    Args:
        value: Any object.
        handle_of: Called with any object that is not plain data; returns its
            handle form (a dict with key ``"h"``) or raises :class:`WireError`.
        depth: Nesting depth so far.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": str(value)}
    if kind is float:
        return {"f": value.hex()}
    if kind is complex:
        return {"c": [value.real.hex(), value.imag.hex()]}
    if kind is bytes:
        return {"b": base64.b64encode(value).decode("ascii")}
    if kind is range:
        return {"r": [str(value.start), str(value.stop), str(value.step)]}
    if kind in _CONTAINERS:
        return {_CONTAINERS[kind]: [encode_value(item, handle_of, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[encode_value(k, handle_of, depth + 1), encode_value(v, handle_of, depth + 1)]
                      for k, v in value.items()]}
    return handle_of(value)


def decode_value(data, handle_from, depth=0):
    """Rebuild a value from its tagged form; handles go through ``handle_from``.

    Raises:
        WireError: For anything but the documented tags.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    if data is None or type(data) is bool or type(data) is str:
        return data
    if type(data) is not dict or len(data) < 1:
        raise WireError(f"malformed value of type {type(data).__name__}")
    if "h" in data:
        return handle_from(data)
    if len(data) != 1:
        raise WireError("malformed value: more than one tag")
    (tag, body), = data.items()
    try:
        if tag == "i":
            if type(body) is not str or len(body) > 10_000:
                raise WireError("malformed int")
            return int(body)
        if tag == "f":
            return float.fromhex(body)
        if tag == "c":
            return complex(float.fromhex(body[0]), float.fromhex(body[1]))
        if tag == "b":
            return base64.b64decode(body.encode("ascii"), validate=True)
        if tag == "r":
            if type(body) is not list or len(body) != 3 or any(type(x) is not str or len(x) > 100 for x in body):
                raise WireError("malformed range")
            return range(*(int(x) for x in body))
        if tag in ("l", "t", "s", "fs"):
            if type(body) is not list:
                raise WireError("malformed container")
            items = [decode_value(item, handle_from, depth + 1) for item in body]
            return {"l": list, "t": tuple, "s": set, "fs": frozenset}[tag](items)
        if tag == "d":
            if type(body) is not list:
                raise WireError("malformed dict")
            return {decode_value(k, handle_from, depth + 1): decode_value(v, handle_from, depth + 1)
                    for k, v in body}
    except WireError:
        raise
    except (TypeError, ValueError, IndexError, AttributeError) as exc:
        raise WireError(f"malformed {tag!r} value: {exc}") from None
    raise WireError(f"unknown tag {tag!r}")


class Channel:
    """Length-prefixed JSON frames over a connected stream socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, message) -> None:
        body = json.dumps(message, separators=(",", ":")).encode("utf-8")
        if len(body) > MAX_FRAME:
            raise WireError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def _read(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise EOFError("the other side closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self):
        (size,) = struct.unpack(">I", self._read(4))
        if size > MAX_FRAME:
            raise WireError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit")
        try:
            return json.loads(self._read(size).decode("utf-8"))
        except (UnicodeDecodeError, RecursionError, ValueError) as exc:
            raise WireError(f"malformed frame: {exc}") from None
