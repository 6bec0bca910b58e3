"""The import boundary's wire: plain data crosses exactly, everything else only as a handle."""

from __future__ import annotations

import datetime
import decimal
import fractions
import math
import pathlib
import socket
import struct
import threading
import unittest.mock

import pytest

from factory.verifiers._wire import (
    MAX_DEPTH,
    MAX_NESTING,
    Channel,
    Endpoint,
    Refs,
    Shared,
    WireError,
    container_states,
    decode_value,
    encode_value,
    parameters_from,
    retained,
    states_of,
    write_back,
)


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


def test_channel_reads_frames_that_arrive_together_or_in_pieces_one_at_a_time():
    left, right = socket.socketpair()
    try:
        receiver = Channel(right)
        frames = [b'{"op":"a"}', b'{"ok":"' + b"y" * 200_000 + b'"}', b'{"ok":3}']
        wire = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
        sender = threading.Thread(target=lambda: [left.sendall(wire[i:i + 7_001]) for i in range(0, len(wire), 7_001)])
        sender.start()  # (cut anywhere: inside a length, inside a body, across frames)
        assert receiver.receive() == {"op": "a"}
        assert receiver.receive() == {"ok": "y" * 200_000}
        assert receiver.receive() == {"ok": 3}
        sender.join()
        left.sendall(len(frames[0]).to_bytes(4, "big") + frames[0] + len(frames[2]).to_bytes(4, "big") + frames[2])
        assert receiver.receive() == {"op": "a"}  # (one recv took both: the second waits in the buffer)
        assert receiver.receive() == {"ok": 3}
    finally:
        left.close()
        right.close()


def test_channel_receive_exact_leaves_what_follows_the_frame_on_the_socket():
    left, right = socket.socketpair()
    try:
        Channel(left).send({"op": "program"})
        left.sendall(b"raw stream bytes")
        assert Channel(right).receive_exact() == {"op": "program"}
        assert right.recv(100) == b"raw stream bytes"
    finally:
        left.close()
        right.close()


def test_channel_timeout_is_the_kernel_s_and_raises_timeout_error():
    left, right = socket.socketpair()
    try:
        receiver = Channel(right)
        receiver.set_timeout(0.2)
        assert right.gettimeout() is None  # (blocking: no poll before each read)
        with pytest.raises(TimeoutError):
            receiver.receive()
        Channel(left).send({"ok": 1})
        assert receiver.receive() == {"ok": 1}
        receiver.set_timeout(None)
        Channel(left).send({"ok": 2})
        assert receiver.receive() == {"ok": 2}
    finally:
        left.close()
        right.close()


@pytest.mark.parametrize("value", [
    bytearray(b"\x00ab"), datetime.datetime(2021, 5, 4, 3, 2, 1, 7, tzinfo=datetime.timezone.utc),
    datetime.datetime(2021, 5, 4, tzinfo=datetime.timezone(datetime.timedelta(hours=-3), "BRT")),
    datetime.date(2020, 2, 29), datetime.time(1, 2, 3, 4), datetime.timedelta(days=-1, seconds=5),
    decimal.Decimal("1.10"), decimal.Decimal("-Infinity"), fractions.Fraction(-1, 3), pathlib.PurePosixPath("/a/b"),
    pathlib.Path("rel/x.txt"), pathlib.PureWindowsPath(r"C:\\x"), slice(1, None, -2), slice("a", 2.5),
])
def test_standard_value_objects_are_rebuilt_with_the_receivers_classes(value):
    back, handles = roundtrip(value)
    assert back == value and type(back) is type(value) and handles.objects == []
    if isinstance(value, datetime.datetime):
        assert back.utcoffset() == value.utcoffset()


def test_subclasses_of_value_types_cross_as_the_base_class_with_their_true_fields():
    class LyingDate(datetime.date):
        def __eq__(self, other):
            return True

        __hash__ = datetime.date.__hash__

    back, _ = roundtrip(LyingDate(1999, 1, 1))
    assert type(back) is datetime.date and back != datetime.date(2020, 1, 1)


def test_dict_views_cross_as_views():
    data = {"a": 1, "b": 2}
    keys, _ = roundtrip(data.keys())
    items, _ = roundtrip(data.items())
    values, _ = roundtrip(data.values())
    assert keys == {"a", "b"} and items == {("a", 1), ("b", 2)} and sorted(values) == [1, 2]


def test_side_tags_need_the_sides_hook():
    with pytest.raises(WireError, match="unknown tag"):
        decode_value({"bi": "eval"}, Handles().handle_from)
    seen = []
    assert decode_value({"bi": "len"}, Handles().handle_from,
                        objects=lambda tag, body, nested: seen.append((tag, body)) or "ok") == "ok"
    assert seen == [("bi", "len")]


def test_write_back_lands_in_the_callers_objects_with_identity_and_cycles():
    caller, callee = Refs(), Refs()
    inner = [1]
    outer = [inner, inner, {"k": {2}}]
    outer.append(outer)
    handles = Handles()
    sent = [encode_value(outer, handles.handle_of, refs=caller, record=True)]
    copy = decode_value(sent[0], handles.handle_from, refs=callee)
    assert copy[0] is copy[1] and copy[3] is copy and copy == [[1], [1], {"k": {2}}, copy]

    def nested(item):
        return encode_value(item, handles.handle_of, refs=callee)

    before = container_states(callee, nested)
    copy[0].append(9)
    copy[2]["k"].add(3)
    copy.insert(0, "new")
    changed = states_of(callee, before, nested)
    assert sorted(index for index, _ in changed) == [0, 1, 3]
    write_back(caller, changed, lambda data: decode_value(data, handles.handle_from, refs=caller))
    assert outer[0] == "new" and outer[1] is inner and inner == [1, 9] and outer[3]["k"] == {2, 3}
    assert outer[4] is outer


@pytest.mark.parametrize("states", [
    [[0, {"d": []}]], [[5, {"l": []}]], [["0", {"l": []}]], [[0, {"mr": 9}]], "x",
])
def test_write_back_refuses_unknown_indexes_and_other_types(states):
    refs = Refs()
    target = [1, 2]
    encode_value(target, Handles().handle_of, refs=refs, record=True)
    with pytest.raises(WireError):
        write_back(refs, states, lambda data: decode_value(data, Handles().handle_from, refs=refs))
    assert target == [1, 2]


def test_recorded_containers_must_be_numbered_in_order():
    with pytest.raises(WireError):
        decode_value({"m": [3, {"l": []}]}, Handles().handle_from, refs=Refs())
    with pytest.raises(WireError):
        decode_value({"m": [0, {"l": []}]}, Handles().handle_from)


def test_shared_containers_are_one_object_each_side_synced_both_ways_and_released():
    trusted, solution, handles = Shared(owner=True), Shared(owner=False), Handles()

    def to_solution(value):
        return decode_value(encode_value(value, handles.handle_of, shared=trusted), handles.handle_from,
                            shared=solution)

    cache = {}
    kept = decode_value(trusted.share(cache, None), handles.handle_from, shared=solution)  # a getter's dict
    kept[(3,)] = 9  # the solution writes into it
    trusted.apply(solution.changes(lambda item: encode_value(item, handles.handle_of)),
                  lambda data: decode_value(data, handles.handle_from))
    assert cache == {(3,): 9} and solution.changes(None) == [] and not trusted.changed()
    cache.clear()  # the test clears it: the solution's object follows (only the changed one is encoded)
    assert trusted.changed()
    solution.apply(trusted.changes(lambda item: encode_value(item, handles.handle_of)),
                   lambda data: decode_value(data, handles.handle_from))
    assert kept == {} and to_solution(cache) is kept
    assert decode_value(encode_value(kept, handles.handle_of, shared=solution), handles.handle_from,
                        shared=trusted) is cache
    assert solution.released() == []  # held by ``kept``
    del kept
    gone = solution.released()
    trusted.drop(gone)
    assert gone == [0] and not trusted.objects and not solution.objects


def test_arguments_the_callee_still_holds_are_found_with_those_inside_them():
    refs, holder = Refs(), []
    outer, inner, other = {"a": []}, [], []
    outer["a"] = inner
    refs.add(outer), refs.add(inner), refs.add(other)
    del outer, inner, other
    assert retained(refs) == []
    holder.append(refs.objects[0])  # the callee kept the dict: the list inside it goes with it
    assert retained(refs) == [0, 1]


def test_a_tests_value_subclass_is_a_stand_in_there_held_here_while_it_lives_and_goes_home():
    class Int(fractions.Fraction):
        pass

    trusted, solution, value = Shared(owner=True), Shared(owner=False), Int(3)
    there = decode_value(encode_value([value, value], None, shared=trusted), None, shared=solution)
    assert there == [3, 3] and there[0] is there[1] and isinstance(there[0], fractions.Fraction)
    assert decode_value(encode_value(there[0], None, shared=solution), None, shared=trusted) is value
    del there  # the stand-in is gone: the trusted side lets go once the exchange is over
    trusted.release(solution.let_go)
    assert not trusted.held and list(trusted.letting_go.values()) == [value]
    with pytest.raises(WireError):  # the trusted side never takes a stand-in's form from the solution
        decode_value({"vh": [0, {"fr": ["1", "2"]}]}, None, shared=trusted)


@pytest.mark.parametrize("data", [{"sm": [0, {"l": []}]}, {"sr": 7}])
def test_the_solution_makes_no_shared_entry_and_names_only_keys_it_was_handed(data):
    trusted = Shared(owner=True)
    with pytest.raises(WireError):
        decode_value(data, Handles().handle_from, shared=trusted)
    never_handed = [1]
    trusted.apply([[key, {"l": []}] for key in range(64)], lambda d: decode_value(d, None, shared=trusted))
    assert never_handed == [1] and not trusted.objects


class Echo(Endpoint):
    """Serves ``{"op": "twice", "n": n}``; for n > 0 asks its peer about n - 1 first (nested calls)."""

    def serve_one(self, request):
        n = request["n"]
        inner = self.exchange({"op": "twice", "n": n - 1})["ok"] if n > 0 else 0
        return {"ok": inner + 2}


def test_endpoints_serve_nested_requests_while_waiting():
    left, right = socket.socketpair()
    try:
        a, b = Echo(Channel(left)), Echo(Channel(right))
        server = threading.Thread(target=lambda: b.send(b.serve_one(b.channel.receive())), daemon=True)
        server.start()
        assert a.exchange({"op": "twice", "n": 5}) == {"ok": 12}
        server.join(5)
    finally:
        left.close()
        right.close()


def test_nesting_is_bounded():
    left, right = socket.socketpair()
    try:
        endpoint = Echo(Channel(left))
        endpoint.depth = MAX_NESTING
        with pytest.raises(WireError, match="nested deeper"):
            endpoint.exchange({"op": "twice", "n": 0})
    finally:
        left.close()
        right.close()


class Picky(Echo):
    """An :class:`Echo` that cannot read the peer's request for ``refused`` (as a value that fails to decode)."""

    refused = None

    def incoming(self, message):
        if "op" in message and message["n"] == self.refused:
            raise ValueError("unreadable")
        return message


@pytest.mark.parametrize(("first", "refused"), [(3 * MAX_NESTING, None), (2, 1)])
def test_a_request_that_fails_while_nested_is_answered_and_both_ends_stay_in_step(first, refused):
    """Nested past the limit (or unreadable): the failing request is answered as an error, so the
    next exchange pairs with its own reply and both ends are back at depth 0."""
    left, right = socket.socketpair()
    left.settimeout(10)
    right.settimeout(10)
    try:
        a, b = Picky(Channel(left)), Picky(Channel(right))

        def serve():
            for _ in range(2):
                request = b.channel.receive()
                try:
                    reply = b.serve_one(b.incoming(request))
                except Exception as exc:  # noqa: BLE001 -- what a server's top level does
                    reply = b.unserved(request, exc)
                b.send(reply)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        a.refused = refused
        assert "exc" in a.exchange({"op": "twice", "n": first})
        assert a.exchange({"op": "twice", "n": 3}) == {"ok": 8}
        server.join(10)
        assert not server.is_alive() and a.depth == b.depth == 0
    finally:
        left.close()
        right.close()


def test_a_working_directory_crosses_relative_to_the_workspace():
    """A test's cwd inside its workspace maps onto the solution's own (never a path into the tests' workspace)."""
    from factory.verifiers._wire import cwd_from_wire, cwd_to_wire

    assert cwd_to_wire("/trusted/ws", "/trusted/ws") == "@ws"
    assert cwd_to_wire("/trusted/ws/data/in", "/trusted/ws") == "@ws/data/in"
    assert cwd_to_wire("/scratch/tmp1", "/trusted/ws") == "/scratch/tmp1"  # the scratch area: one path for both
    assert cwd_from_wire("@ws", "/solution/ws") == "/solution/ws"
    assert cwd_from_wire("@ws/data/in", "/solution/ws") == "/solution/ws/data/in"
    assert cwd_from_wire("@ws/../../trusted/ws", "/solution/ws") == "/solution/ws"
    assert cwd_from_wire("/scratch/tmp1", "/solution/ws") == "/scratch/tmp1"


def test_workspace_files_mirror_only_new_files_under_safe_names(tmp_path):
    """Files made in the top folder cross; a listed (task) file, code, config, links and paths never do."""
    import base64
    import os

    from factory.verifiers._wire import WorkspaceFiles

    sender_root, receiver_root = tmp_path / "trusted", tmp_path / "solution"
    sender_root.mkdir()
    receiver_root.mkdir()
    (sender_root / "test_x.py").write_text("secret = 1\n")
    (sender_root / "expected.csv").write_text("a,1\n")
    (receiver_root / "expected.csv").write_text("a,1\n")
    (tmp_path / "outside").write_text("outside\n")
    sender, receiver = WorkspaceFiles(str(sender_root)), WorkspaceFiles(str(receiver_root))
    assert sender.changes() is None
    (sender_root / "temp").write_text("\r\n")
    (sender_root / "conftest.py").write_text("x = 1\n")
    os.symlink(tmp_path / "outside", sender_root / "link")
    sent = sender.changes()
    assert sent == {"put": {"temp": base64.b64encode(b"\r\n").decode()}, "gone": []}
    receiver.apply(sent)
    assert (receiver_root / "temp").read_bytes() == b"\r\n"
    assert not os.access(receiver_root / "temp", os.X_OK)
    assert receiver.changes() is None  # what it was sent is not news to send back
    forged = base64.b64encode(b"forged\n").decode()
    receiver.apply({"put": dict.fromkeys(["expected.csv", "conftest.py", "x.pth", "m.py", ".hidden", "pytest.ini",
                                          "../escape", "sub/dir", "out.csv"], forged),
                    "gone": ["expected.csv", "test_x.py"]})
    assert (receiver_root / "expected.csv").read_text() == "a,1\n"
    assert sorted(p.name for p in receiver_root.iterdir()) == ["expected.csv", "out.csv", "temp"]
    assert not (tmp_path / "escape").exists()
    os.remove(sender_root / "temp")
    assert sender.changes() == {"put": {}, "gone": ["temp"]}


def _plain(state, default):
    if type(default) is not int:
        raise WireError("not plain")
    return default


def test_parameters_from_builds_the_signature_described():
    described = [["a", 0, False, None, None], ["b", 1, True, 2, "int"], ["args", 2, False, None, None],
                 ["c", 3, False, None, None], ["d", 3, True, 4, None], ["kw", 4, False, None, None]]
    text, parameters, defaults, kwdefaults = parameters_from(described, (False, True), _plain)
    assert text == "a, /, b, *args, c, d, **kw"
    assert defaults == [2] and kwdefaults == {"d": 4}
    assert [p[0] for p in parameters] == ["a", "b", "args", "c", "d", "kw"] and parameters[1][4] == "int"
    assert parameters_from([["x", 3, 0, None, None]], (0, 1, 2), _plain)[0] == "*, x"
    assert parameters_from([["x", 1, 2, None, None]], (0, 1, 2), lambda state, default: "hidden")[2] == ["hidden"]


@pytest.mark.parametrize("described", [
    [["a", 1, True, 1, None], ["b", 1, False, None, None]],  # a default not trailing
    [["b", 3, False, None, None], ["a", 1, False, None, None]],  # kinds out of order
    [["a", 2, False, None, None], ["b", 2, False, None, None]],  # two *args
    [["a", 4, True, 1, None]],  # a default on **kw
    [["a", 1, 1, 1, None]],  # a state of the other side's type
    [["a", 1, True, "x", None]],  # a default default_of refuses
    [["a=1): import os\n    def f(b", 1, False, None, None]],  # code in a name
    [["class", 1, False, None, None]], [["_factory_forward", 1, False, None, None]],
    [["a", 1, False, None, None], ["a", 1, False, None, None]], [["a", 5, False, None, None]],
    [["a", 1, False, None]], "a, b", [["a", 1, False, None, None]] * 256,
])
def test_parameters_from_refuses_a_hostile_description(described):
    try:
        made = parameters_from(described, (False, True), _plain)
    except WireError:
        made = None
    assert made is None
