"""The import boundary's wire: plain data crosses exactly, everything else only as a handle."""

from __future__ import annotations

import math
import socket
import struct
import unittest.mock

import pytest

from factory.verifiers._wire import MAX_DEPTH, Channel, WireError, decode_value, encode_value


class Handles:
    """Both ends' handle tables in one, for round trips."""

    def __init__(self):
        self.objects: list[object] = []

    def handle_of(self, obj):
        self.objects.append(obj)
        return {"h": len(self.objects)}

    def handle_from(self, data):
        return ("handle", data["h"])


def roundtrip(value):
    handles = Handles()
    return decode_value(encode_value(value, handles.handle_of), handles.handle_from), handles


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**200, 1.5, -0.0, math.inf, complex(1, -2), "", "héllo \ud800", b"\x00\xff",
    range(3), range(-5, 100, 7), [1, [2, [3]]], (1, "a", (None,)), {"a": 1, 2: [3], (1, 2): {"x": b"y"}},
    {1, 2}, frozenset({"a"}),
])
def test_plain_data_round_trips_exactly(value):
    back, handles = roundtrip(value)
    assert back == value and type(back) is type(value)
    assert handles.objects == []


def test_nan_round_trips_as_nan():
    back, _ = roundtrip(float("nan"))
    assert math.isnan(back)


def test_bool_and_int_stay_distinct():
    back, _ = roundtrip([True, 1, False, 0])
    assert [type(v) for v in back] == [bool, int, bool, int]


class LyingInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class LyingStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


@pytest.mark.parametrize("value", [LyingInt(3), LyingStr("x"), unittest.mock.ANY, object(), len, type])
def test_anything_not_exactly_plain_crosses_as_a_handle(value):
    back, handles = roundtrip(value)
    assert back == ("handle", 1)
    assert handles.objects == [value]


def test_subclass_inside_a_container_becomes_a_handle():
    back, handles = roundtrip([1, LyingInt(2)])
    assert back == [1, ("handle", 1)]


def test_too_deep_is_refused():
    value: list = []
    for _ in range(MAX_DEPTH + 5):
        value = [value]
    with pytest.raises(WireError, match="deeper"):
        encode_value(value, Handles().handle_of)


@pytest.mark.parametrize("data", [
    {"x": 1}, {"i": 5}, {"i": "1" * 20_000}, {"f": "nope"}, {"l": "abc"}, {"d": [[1]]}, 3, 1.5, [1],
    {"b": "!!"}, {"i": "1", "f": "0x1p0"},
])
def test_decoding_accepts_only_the_documented_tags(data):
    with pytest.raises(WireError):
        decode_value(data, Handles().handle_from)


def test_channel_frames_and_refuses_oversized_frames():
    left, right = socket.socketpair()
    try:
        sender, receiver = Channel(left), Channel(right)
        sender.send({"op": "call", "a": [1, "x"]})
        assert receiver.receive() == {"op": "call", "a": [1, "x"]}
        left.sendall(struct.pack(">I", 2**31))
        with pytest.raises(WireError, match="over"):
            receiver.receive()
    finally:
        left.close()
        right.close()


def test_channel_reports_a_closed_peer():
    left, right = socket.socketpair()
    left.close()
    with pytest.raises(EOFError):
        Channel(right).receive()
    right.close()
