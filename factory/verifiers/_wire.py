"""The wire between the trusted test process and the solution process.

Both ends of the import boundary (:mod:`._solution_server` inside the
solution's sandbox, :mod:`._trusted_runner` beside pytest) are sent as
source to ``python -I -c``; this module's source is prepended to each, so it
uses the standard library only and defines nothing that depends on
``factory``.

Frames are a 4-byte big-endian length and a UTF-8 JSON body, at most
``MAX_FRAME`` bytes. Values are tagged so that the type survives exactly:

- *plain data*: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``,
  ``bytes``, ``bytearray``, ``range`` and ``list``/``tuple``/``dict``/``set``/
  ``frozenset`` of them;
- *value objects* of the standard library, rebuilt by the receiver from
  their fields with its own classes: ``datetime``/``date``/``time``/
  ``timedelta`` (subclasses cross as the base class; the test's own
  subclasses of these, ``Decimal`` and ``Fraction`` as stand-ins, see
  below), ``Decimal``, ``Fraction``, pure and concrete paths, slices, fixed-offset and IANA time
  zones, and dict views;
- *handles*: ``{"h": id, ...}`` for an object that stays in the solution's
  process, ``{"rh": id, ...}`` for one that stays in the trusted process;
- each side's own value tags (``objects``: namedtuples, dataclass and enum
  snapshots, builtins and standard modules by name), decoded only by the
  hook that side passes;
- *write-back* markers (``{"m": [index, body]}``, ``{"mr": index}``): the
  mutable containers (list, dict, set, bytearray) passed as arguments of
  one call, numbered so that the callee can send their final state back
  and the caller can write it into its own objects (see :class:`Refs`);
- *shared* markers (``{"sm": [key, body]}``, ``{"sr": key}``): the test's
  containers the solution keeps (a cache dict handed to a decorator, one a
  test's function returned), one object on each side while the solution
  holds it, changes synced with the messages (see :class:`Shared`); and a
  test's object of a subclass of a standard value class (``{"vh": [key,
  value]}``: a stand-in there, ``{"vr": key}`` back: the test's object).

Encoding checks exact types (``type(x) is int``, never ``isinstance``), so
an ``int`` subclass with a lying ``__eq__`` can only cross as a handle;
decoding accepts nothing but these tags and rebuilds nothing but builtins
and the standard library's value classes from plain fields, so whatever the
solution sends cannot run code on the trusted side.

The protocol is bidirectional (:class:`Endpoint`): while one side waits for
the reply to its request, it serves the other side's nested requests (a
solution calling a test's key function, a test callback calling back into
the solution), to a bounded depth.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import datetime
import decimal
import fractions
import json
import keyword
import operator
import os
import pathlib
import re
import socket
import struct
import sys
import threading
import time

__all__ = ["MAX_DEPTH", "MAX_FRAME", "MAX_NESTING", "PLAIN_SCALARS", "AnnotationText", "Channel", "CoroutineFace",
           "Endpoint", "Refs", "annotation_of", "annotation_text",
           "Shared", "WireError", "WorkspaceFiles", "container_states", "cwd_from_wire", "cwd_to_wire",
           "decode_item", "decode_value", "encode_item", "encode_value", "mirror_name_allowed", "parameters_from",
           "states_of",
           "write_back"]

MAX_FRAME = 64 * 1024 * 1024
MAX_DEPTH = 200
#: Requests in flight at once across both sides (a callback calling back into the solution, ...).
MAX_NESTING = 40
PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes, range)
_CONTAINERS = {list: "l", tuple: "t", set: "s", frozenset: "fs"}
_MUTABLE = (list, dict, set, bytearray)
#: Handle keys: an object of the solution ("h") or of the trusted side ("rh").
HANDLE_KEYS = ("h", "rh")
#: Tags only a side's own ``objects`` hook decodes.
SIDE_TAGS = frozenset({"nt", "dc", "en", "bi", "mod", "tzo", "bv", "ex", "nd", "pk", "ns", "tdc", "sx", "std",
                       "ann"})
_PATHS = {"pp": pathlib.PurePosixPath, "pw": pathlib.PureWindowsPath, "cp": pathlib.PosixPath}
_ZONE_KEY = re.compile(r"^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$")
_BUILTINS_NAMESPACE = vars(builtins)
_KEYS_VIEW, _VALUES_VIEW, _ITEMS_VIEW = type({}.keys()), type({}.values()), type({}.items())


class AnnotationText(str):
    """An annotation that crossed as text: shown as the name it is (``x: int``), not as a quoted string."""

    __slots__ = ()

    def __repr__(self):
        return str(self)


def annotation_text(annotation):
    """An annotation as it crosses (None when there is none): the text it names, never the object; a builtin
    class as ``{"bi": name}``, the other side's own class of that name (``sig.return_annotation == str``, a
    mirror's ``__annotations__``)."""
    import inspect

    if annotation is inspect.Parameter.empty:
        return None
    if type(annotation) is type and getattr(builtins, annotation.__name__, None) is annotation \
            and not issubclass(annotation, BaseException):
        return {"bi": annotation.__name__}
    text = annotation if type(annotation) is str else inspect.formatannotation(annotation)
    return str(text)[:200]


def annotation_of(described, empty):
    """The annotation :func:`annotation_text` described (on either side): text, or a builtin class; else
    ``empty``."""
    if type(described) is str:
        return AnnotationText(described[:200])
    if type(described) is dict and len(described) == 1 and type(described.get("bi")) is str:
        found = getattr(builtins, described["bi"], None)
        if type(found) is type and not issubclass(found, BaseException):
            return found
    return empty


#: The working directory's workspace part, as it crosses: ``@ws`` or ``@ws/REL``.
_WORKSPACE_TAG = "@ws"


def cwd_to_wire(cwd, root):
    """A working directory as it crosses: relative to the sender's workspace ``root`` when inside it.

    The two sandboxes' workspaces are the same path on bwrap and docker but
    not on every backend (``none``: two host folders), and a path into the
    trusted workspace must never send the solution to the tests; the scratch
    area, outside both, is the same path on both sides and crosses as is.
    """
    rel = os.path.relpath(cwd, root)
    if rel == ".":
        return _WORKSPACE_TAG
    if rel != ".." and not rel.startswith(".." + os.sep):
        return f"{_WORKSPACE_TAG}/{rel}"
    return cwd


def cwd_from_wire(text, root):
    """The receiver's directory for a working directory :func:`cwd_to_wire` sent (its own workspace ``root``)."""
    if text == _WORKSPACE_TAG:
        return root
    if text.startswith(_WORKSPACE_TAG + "/"):
        rel = os.path.normpath(text[len(_WORKSPACE_TAG) + 1:])
        if rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
            return root
        return os.path.join(root, rel)
    return text


#: What a file the other side made in its working directory may be called to cross (see :class:`WorkspaceFiles`):
#: a plain name, not hidden, and nothing a later import, collection or tool configuration would pick up.
_MIRROR_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}$")
_MIRROR_REFUSED_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".pyi", ".pyw", ".pth", ".so", ".dll", ".dylib", ".egg",
                            ".whl", ".zip", ".toml", ".cfg")
_MIRROR_REFUSED_NAMES = frozenset({"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "makefile", "gnumakefile",
                                   "__pycache__", "__init__"})
#: Bounds on what crosses: a file over the first is not mirrored, a message carries at most the second.
_MIRROR_FILE_LIMIT = 1024 * 1024
_MIRROR_MESSAGE_LIMIT = 4 * 1024 * 1024
#: A folder stamp younger than this is looked behind anyway (see :meth:`WorkspaceFiles._settled`).
_SETTLED_NS = 100_000_000
#: At most this many files mirrored at once (and sent in one message).
_MIRROR_FILES = 256


def mirror_name_allowed(name):
    """Whether a file of this name, in the workspace's top folder, may be mirrored to the other side."""
    if type(name) is not str or not _MIRROR_NAME.match(name):
        return False
    lower = name.lower()
    return (lower not in _MIRROR_REFUSED_NAMES and not lower.startswith("conftest")
            and not lower.endswith(_MIRROR_REFUSED_SUFFIXES))


def parameters_from(params, states, default_of):
    """The parameters of a function one side generates from the other side's plain-data description of a
    signature (a test's function mirrored in the solution, a solution's function made real on the trusted side).

    Each of ``params`` is ``[name, kind, state, default, annotation]`` (``kind`` an ``inspect.Parameter`` kind's
    value), checked as a hostile description: names are identifiers, never keywords, ``_factory`` names or
    repeated; kinds are in order, one ``*args`` and one ``**kw`` at most; ``state`` is one of ``states``, of the
    exact type of its first (falsy: no default); only named parameters have defaults, trailing among the
    positional ones. So the text generated is the signature described and nothing else.

    Args:
        params: The description.
        states: The default states the sender may use (the solution's: ``(False, True)``; the trusted side's
            ``(0, 1, 2)``: 2 a default that stayed behind).
        default_of: ``default_of(state, default)``, the value of a described default (raising
            :class:`WireError` refuses the description).

    Returns:
        ``(text, parameters, defaults, kwdefaults)``: the ``def``'s parameter text (``/`` and ``*`` where the
        kinds need them), ``(name, kind, state, value, annotation)`` per parameter (``value`` None without a
        default; ``annotation`` as described), the positional defaults in order and the keyword-only ones by
        name; or None where the description is malformed.
    """
    if type(params) is not list or len(params) > 255:
        return None
    text, parameters, names, defaults, kwdefaults = [], [], set(), [], {}
    previous, defaulted = None, False
    for entry in params:
        if type(entry) is not list or len(entry) != 5:
            return None
        name, kind, state, default, annotation = entry
        if type(name) is not str or not name.isidentifier() or keyword.iskeyword(name) \
                or name.startswith("_factory") or name in names or type(kind) is not int or kind not in range(5) \
                or type(state) is not type(states[0]) or state not in states \
                or (previous is not None and (kind < previous or kind == previous in (2, 4))) \
                or (state and kind in (2, 4)) or (kind in (0, 1) and not state and defaulted):
            return None
        if previous == 0 and kind != 0:
            text.append("/")
        if kind == 3 and previous not in (2, 3):  # (keyword-only without *args: a bare star first)
            text.append("*")
        text.append({2: "*", 4: "**"}.get(kind, "") + name)
        value = None
        if state:
            value = default_of(state, default)
            if kind == 3:
                kwdefaults[name] = value
            else:
                defaults.append(value)
                defaulted = True
        parameters.append((name, kind, state, value, annotation))
        names.add(name)
        previous = kind
    if previous == 0:
        text.append("/")
    return ", ".join(text), parameters, defaults, kwdefaults


class WorkspaceFiles:
    """Files made in the workspace's top folder during the run, mirrored between the two sandboxes.

    A test that writes ``temp`` in its working directory and hands the name
    to the code under test (``ConfigObj('temp')``), or lets the code write
    ``test.ini`` there and then removes it, shares that folder with the code
    in bare pytest. Each side lists its top folder once, at start: those
    files (the task's tests and data on the trusted side, the agent's files
    on the solution side) never cross and are never replaced or removed by
    what crosses. A file made or changed since (a regular file, not a link,
    under :data:`_MIRROR_FILE_LIMIT`, with a name :func:`mirror_name_allowed`)
    crosses with the next message, and its removal too; the receiver writes
    it only under such a name, never over a file of its own listing, never
    through a link, and without the execute bit. So the solution learns only
    what the test wrote where the code under test could have read it, and
    what it sends back can neither replace a test file nor plant one a
    later import or collection picks up (``.py``, ``conftest``, ``.pth``,
    pytest or tool configuration, hidden files).
    """

    def __init__(self, root):
        self.root = root
        try:
            self.listed = frozenset(os.listdir(root))
        except OSError:
            self.listed = frozenset()
        self.known = {}  # name -> (its stamp, hash of its bytes, whether the stamp was settled) as sent or written
        self.stamp = None  # the folder's own stamp when last looked at (None: look again)

    def _stamp(self, name):
        st = os.stat(os.path.join(self.root, name), follow_symlinks=False)
        if (st.st_mode & 0o170000) != 0o100000:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def changes(self):
        """``{"put": {name: base64}, "gone": [name]}`` for what changed here since last asked, or ``None``."""
        try:
            stamp = os.stat(self.root).st_mtime_ns
        except OSError:
            return None
        if stamp == self.stamp and not self.known:
            return None  # no file made or removed, none mirrored that could have changed in place
        self.stamp = self._settled(stamp)
        try:
            names = os.listdir(self.root)
        except OSError:
            return None
        put, present, size = {}, set(), 0
        for name in names:
            if name in self.listed or not mirror_name_allowed(name):
                continue
            try:
                file_stamp = self._stamp(name)
            except OSError:
                continue
            if file_stamp is None or file_stamp[0] > _MIRROR_FILE_LIMIT:
                continue
            present.add(name)
            known = self.known.get(name)
            if known is not None and known[0] == file_stamp and known[2]:
                continue  # read when its stamp was settled, and unchanged since
            if size + file_stamp[0] > _MIRROR_MESSAGE_LIMIT or len(put) >= _MIRROR_FILES \
                    or (known is None and len(self.known) >= _MIRROR_FILES):
                continue
            try:
                fd = os.open(os.path.join(self.root, name), os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    data = os.read(fd, _MIRROR_FILE_LIMIT + 1)
                finally:
                    os.close(fd)
            except OSError:
                continue
            self.known[name] = (file_stamp, hash(data), self._settled(file_stamp[1]) is not None)
            if known is not None and known[1] == hash(data):
                continue  # a recent stamp, the same bytes
            size += len(data)
            put[name] = base64.b64encode(data).decode("ascii")
        gone = [name for name in self.known if name not in present]
        for name in gone:
            del self.known[name]
        return {"put": put, "gone": gone} if put or gone else None

    def apply(self, files):
        """Make here what the other side's :meth:`changes` sent (anything malformed or refused is left out)."""
        if type(files) is not dict:
            return
        put, gone = files.get("put"), files.get("gone")
        for name in gone if type(gone) is list else ():
            if mirror_name_allowed(name) and name not in self.listed and name in self.known:
                self.known.pop(name)
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.root, name))
        for name, text in (put.items() if type(put) is dict else ()):
            if not mirror_name_allowed(name) or name in self.listed or type(text) is not str \
                    or (name not in self.known and len(self.known) >= _MIRROR_FILES):
                continue
            try:
                data = base64.b64decode(text, validate=True)
            except ValueError:
                continue
            path = os.path.join(self.root, name)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                self.known[name] = (self._stamp(name), hash(data), False)  # (re-read once: the test may rewrite it)
            except OSError:
                continue
        self.stamp = None  # (what was just written is known: not news to send back)

    @staticmethod
    def _settled(stamp):
        """``stamp``, or ``None`` while it is recent: a file system's coarse clock can give a file made a
        moment later the same stamp, so an unchanged recent stamp does not mean an unchanged folder."""
        return stamp if time.time_ns() - stamp > _SETTLED_NS else None

    def changed(self):
        """Whether :meth:`changes` may have news, without taking it (the folder or a mirrored file changed)."""
        try:
            if self.stamp is None or os.stat(self.root).st_mtime_ns != self.stamp:
                return True
            return any(not settled or self._stamp(name) != stamp for name, (stamp, _, settled) in self.known.items())
        except OSError:
            return True


class WireError(Exception):
    """A frame or value that breaks the protocol (too big, too deep, malformed, not plain)."""


class Refs:
    """The mutable containers of one call, numbered in the order they were met.

    The caller's table holds its own objects (the ones a write-back lands
    in); the callee's holds the copies it decoded, whose final state it
    sends back.
    """

    def __init__(self):
        self.objects = []
        self.index = {}

    def add(self, obj):
        self.index[id(obj)] = len(self.objects)
        self.objects.append(obj)
        return len(self.objects) - 1


def _is_zone(tz):
    key = getattr(tz, "key", None)
    return (type(tz).__module__ == "zoneinfo" and type(key) is str and bool(_ZONE_KEY.match(key))
            and ".." not in key and len(key) < 100)


def _encode_tz(tz, value, nested=None):
    if tz is None:
        return None
    if _is_zone(tz):
        return {"zone": tz.key}
    if nested is not None and type(tz) is not datetime.timezone:
        # A time zone class of the solution: its own snapshot, or going back, its handle (never a copy that
        # loses what it is); a zone no side can describe falls back to its offset.
        handle_of = getattr(type(tz), "_factory_handle_of", None)
        if handle_of is not None:
            return {"obj": handle_of(tz)}
        own = nested(tz)
        if type(own) is dict and ("tzo" in own or "rh" in own):  # (a test's zone: its own object again)
            return {"obj": own}
    moment = value if isinstance(value, datetime.datetime) else None
    try:
        offset = tz.utcoffset(moment)
    except Exception:  # a zone that cannot say: the value crosses naive
        return None
    if type(offset) is not datetime.timedelta:
        return None
    try:
        name = tz.tzname(moment)
    except Exception:
        name = None
    return {"off": [offset.days, offset.seconds, offset.microseconds], "name": str(name)[:60] if name else None}


def _decode_tz(data, nested=None):
    if data is None:
        return None
    if type(data) is not dict:
        raise WireError("malformed time zone")
    if "obj" in data:
        zone = nested(data["obj"]) if nested is not None else None
        if not isinstance(zone, datetime.tzinfo):
            raise WireError("malformed time zone object")
        return zone
    if "zone" in data:
        key = data["zone"]
        if type(key) is not str or not _ZONE_KEY.match(key) or ".." in key or len(key) >= 100:
            raise WireError("malformed zone key")
        import zoneinfo

        try:
            return zoneinfo.ZoneInfo(key)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            raise WireError(f"unknown time zone {key!r}") from None
    days, seconds, micros = (int(x) for x in data["off"])
    offset = datetime.timedelta(days=days, seconds=seconds, microseconds=micros)
    name = data.get("name")
    if offset == datetime.timedelta(0) and name == "UTC":
        return datetime.timezone.utc
    return datetime.timezone(offset, str(name)[:60]) if type(name) is str else datetime.timezone(offset)


def _encode_standard_value(value, nested=None):
    """The tagged form of a standard-library value object, or None if ``value`` is not one."""
    if isinstance(value, datetime.datetime):
        return {"dt": [value.year, value.month, value.day, value.hour, value.minute, value.second,
                       value.microsecond, value.fold, _encode_tz(value.tzinfo, value, nested)]}
    if isinstance(value, datetime.date):
        return {"da": [value.year, value.month, value.day]}
    if isinstance(value, datetime.time):
        return {"tm": [value.hour, value.minute, value.second, value.microsecond, value.fold,
                       _encode_tz(value.tzinfo, None, nested)]}
    if type(value) is datetime.timezone or (isinstance(value, datetime.tzinfo) and _is_zone(value)):
        return {"tz": _encode_tz(value, None)}
    if isinstance(value, datetime.timedelta):
        return {"td": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, decimal.Decimal):
        return {"dec": str(decimal.Decimal.__str__(value))}
    if isinstance(value, fractions.Fraction):
        return {"fr": [str(int(value.numerator)), str(int(value.denominator))]}
    if isinstance(value, pathlib.PurePath):
        kind = ("cp" if isinstance(value, pathlib.Path) else
                "pw" if isinstance(value, pathlib.PureWindowsPath) else "pp")
        return {"p": [kind, str(pathlib.PurePath.__str__(value))]}
    return None


def _ints(body, count):
    if type(body) is not list or len(body) < count or any(type(x) is not int for x in body[:count]):
        raise WireError("malformed date or time")
    return body[:count]


def encode_value(value, handle_of, depth=0, refs=None, record=False, objects=None, shared=None):
    """The tagged JSON form of ``value``.

    Args:
        value: Any object.
        handle_of: Called with any object that is not plain data, a value
            object or a side's own object; returns its handle form (a dict
            with key ``"h"`` or ``"rh"``) or raises :class:`WireError`.
        depth: Nesting depth so far.
        refs: The call's :class:`Refs`: a container already in it is sent
            as a reference (``{"mr": i}``).
        record: Add every list, dict, set and bytearray met to ``refs``
            (the arguments of a call, for write-back).
        objects: Optional ``objects(value, nested)``: a side's own tagged
            form of ``value`` (``nested`` encodes its fields), or None.
        shared: Optional :class:`Shared`: a container in it is sent as
            ``{"sr": key}`` (the same object on the other side).
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

    def nested(item):
        return encode_value(item, handle_of, depth + 1, refs, record, objects, shared)

    if value is _BUILTINS_NAMESPACE:  # a namespace's __builtins__ (exec() adds it): the receiver's own
        return {"bi": "__dict__"}
    if shared is not None and kind in _MUTABLE and shared.keys:
        key = shared.keys.get(id(value))
        if key is not None:
            shared.sent.add(key)  # (held until this message is read: see Shared.released)
            return {"sr": key}
    if refs is not None and kind in _MUTABLE:
        index = refs.index.get(id(value))
        if index is not None:
            return {"mr": index}
        if record:
            index = refs.add(value)
            return {"m": [index, _encode_container(value, kind, nested)]}
    if kind in _CONTAINERS or kind is dict or kind is bytearray:
        return _encode_container(value, kind, nested)
    if kind is slice:
        return {"sl": [nested(value.start), nested(value.stop), nested(value.step)]}
    if kind in (_KEYS_VIEW, _VALUES_VIEW, _ITEMS_VIEW):
        tag = {_KEYS_VIEW: "dk", _VALUES_VIEW: "dv", _ITEMS_VIEW: "di"}[kind]
        return {tag: [nested(item) for item in value]}
    standard = _encode_standard_value(value, nested)
    if standard is not None:
        if shared is not None and kind not in _EXACT_VALUES and isinstance(value, _HOMED_VALUES):
            if shared.owner:  # a test's subclass (a Fraction subclass): its value, with the way home
                return {"vh": [shared.hold(value), standard]}
            key = getattr(value, "_factory_home", None)
            if type(key) is int:  # the stand-in of such a value, going home: the test's object again
                return {"vr": key}
        return standard
    if objects is not None:
        own = objects(value, nested)
        if own is not None:
            return own
    return handle_of(value)


def _encode_container(value, kind, nested):
    if kind is bytearray:
        return {"ba": base64.b64encode(bytes(value)).decode("ascii")}
    if kind is dict:
        return {"d": [[nested(k), nested(v)] for k, v in value.items()]}
    return {_CONTAINERS[kind]: [nested(item) for item in value]}


def decode_value(data, handle_from, depth=0, refs=None, objects=None, shared=None):
    """Rebuild a value from its tagged form; handles go through ``handle_from``.

    Args:
        data: The tagged form.
        handle_from: Called with a handle (a dict with key ``"h"`` or ``"rh"``).
        depth: Nesting depth so far.
        refs: The call's :class:`Refs`: ``{"m": ...}`` adds the container it
            builds, ``{"mr": i}`` is container ``i``.
        objects: Optional ``objects(tag, body, nested)`` for the side's own
            tags (:data:`SIDE_TAGS`); without it they are refused.
        shared: Optional :class:`Shared`: ``{"sr": key}`` is its container;
            ``{"sm": ...}`` adds one (only where ``shared`` is not the owner).

    Raises:
        WireError: For anything but the documented tags.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    if data is None or type(data) is bool or type(data) is str:
        return data
    if type(data) is not dict or len(data) < 1:
        raise WireError(f"malformed value of type {type(data).__name__}")
    if "h" in data or "rh" in data:
        return handle_from(data)
    if len(data) != 1:
        raise WireError("malformed value: more than one tag")
    (tag, body), = data.items()

    def nested(item):
        return decode_value(item, handle_from, depth + 1, refs, objects, shared)

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
        if tag == "ba":
            return bytearray(base64.b64decode(body.encode("ascii"), validate=True))
        if tag == "r":
            if type(body) is not list or len(body) != 3 or any(type(x) is not str or len(x) > 100 for x in body):
                raise WireError("malformed range")
            return range(*(int(x) for x in body))
        if tag in ("l", "t", "s", "fs"):
            if type(body) is not list:
                raise WireError("malformed container")
            items = [nested(item) for item in body]
            return {"l": list, "t": tuple, "s": set, "fs": frozenset}[tag](items)
        if tag == "d":
            if type(body) is not list:
                raise WireError("malformed dict")
            return {nested(k): nested(v) for k, v in body}
        if tag == "m":
            return _decode_recorded(body, refs, nested)
        if tag == "mr":
            if refs is None or type(body) is not int or not 0 <= body < len(refs.objects):
                raise WireError("malformed container reference")
            return refs.objects[body]
        if tag == "sr":
            if shared is None or type(body) is not int or body not in shared.objects:
                raise WireError("unknown shared container")
            return shared.objects[body]
        if tag == "sm":
            if shared is None or shared.owner or type(body) is not list or len(body) != 2 \
                    or type(body[0]) is not int:
                raise WireError("malformed shared container")
            return shared.decode_new(body[0], body[1], nested)
        if tag == "vh":
            if shared is None or shared.owner or type(body) is not list or len(body) != 2 \
                    or type(body[0]) is not int:
                raise WireError("malformed value with a home")
            return shared.stand_in(body[0], nested(body[1]))
        if tag == "vr":
            if shared is None or not shared.owner or type(body) is not int:
                raise WireError("malformed value with a home")
            value = shared.held.get(body, shared.letting_go.get(body, _MISSING_VALUE))
            if value is _MISSING_VALUE:  # (the stand-in it names went in this very message)
                raise WireError("unknown value with a home")
            return value
        if tag == "sl":
            if type(body) is not list or len(body) != 3:
                raise WireError("malformed slice")
            return slice(*(nested(item) for item in body))
        if tag in ("dk", "dv", "di"):
            if type(body) is not list:
                raise WireError("malformed dict view")
            items = [nested(item) for item in body]
            if tag == "dk":
                return dict.fromkeys(items).keys()
            if tag == "di":
                return dict(items).items()
            return dict(enumerate(items)).values()
        if tag == "dt":
            y, mo, d, h, mi, s, us, fold = _ints(body, 8)
            return datetime.datetime(y, mo, d, h, mi, s, us, tzinfo=_decode_tz(body[8], nested), fold=fold)
        if tag == "da":
            return datetime.date(*_ints(body, 3))
        if tag == "tm":
            h, mi, s, us, fold = _ints(body, 5)
            return datetime.time(h, mi, s, us, tzinfo=_decode_tz(body[5], nested), fold=fold)
        if tag == "tz":
            zone = _decode_tz(body)
            if zone is None:
                raise WireError("malformed time zone")
            return zone
        if tag == "td":
            days, seconds, micros = _ints(body, 3)
            return datetime.timedelta(days=days, seconds=seconds, microseconds=micros)
        if tag == "dec":
            if type(body) is not str or len(body) > 10_000:
                raise WireError("malformed Decimal")
            return decimal.Decimal(body)
        if tag == "fr":
            if type(body) is not list or len(body) != 2 or any(type(x) is not str or len(x) > 10_000 for x in body):
                raise WireError("malformed Fraction")
            return fractions.Fraction(int(body[0]), int(body[1]))
        if tag == "p":
            if type(body) is not list or len(body) != 2 or body[0] not in _PATHS or type(body[1]) is not str:
                raise WireError("malformed path")
            return _PATHS[body[0]](body[1])
        if tag in SIDE_TAGS and objects is not None:
            return objects(tag, body, nested)
    except WireError:
        raise
    except (TypeError, ValueError, IndexError, AttributeError, KeyError, ArithmeticError, OverflowError) as exc:
        raise WireError(f"malformed {tag!r} value: {exc}") from None
    raise WireError(f"unknown tag {tag!r}")


def _decode_recorded(body, refs, nested):
    """A container of the call's arguments, registered before its items so that cycles resolve."""
    if refs is None or type(body) is not list or len(body) != 2 or body[0] != len(refs.objects):
        raise WireError("malformed recorded container")
    inner = body[1]
    if type(inner) is not dict or len(inner) != 1:
        raise WireError("malformed recorded container")
    (tag, items), = inner.items()
    if tag == "ba":
        return refs.objects[refs.add(bytearray(base64.b64decode(items.encode("ascii"), validate=True)))]
    if tag not in ("l", "d", "s") or type(items) is not list:
        raise WireError("malformed recorded container")
    container = {"l": list, "d": dict, "s": set}[tag]()
    refs.add(container)
    if tag == "l":
        container.extend(nested(item) for item in items)
    elif tag == "s":
        container.update(nested(item) for item in items)
    else:
        for pair in items:
            key, value = pair
            container[nested(key)] = nested(value)
    return container


def write_back(refs, states, decode):
    """Write the callee's final state of the call's containers into the caller's own objects.

    Args:
        refs: The caller's :class:`Refs` for the call.
        states: ``[[index, tagged state], ...]`` from the callee.
        decode: Decodes one tagged value with ``refs`` (so ``{"mr": i}`` is the caller's container ``i``).

    Raises:
        WireError: For an unknown index or a state of another type than the container.
    """
    if type(states) is not list:
        raise WireError("malformed write-back")
    decoded = []
    for entry in states[:10_000]:
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int \
                or not 0 <= entry[0] < len(refs.objects):
            raise WireError("malformed write-back")
        target = refs.objects[entry[0]]
        value = decode(entry[1])
        if type(value) is not type(target):
            raise WireError(f"write-back of a {type(value).__name__} into a {type(target).__name__}")
        decoded.append((target, value))
    for target, value in decoded:  # all decoded first: a malformed entry changes nothing
        if target is value:
            continue
        if type(target) in (dict, set):
            target.clear()
            target.update(value)
        else:
            target[:] = value


def container_states(refs, nested):
    """The tagged contents of each container of ``refs`` (nested ones of the table as references)."""
    return [_encode_container(obj, type(obj), nested) for obj in refs.objects]


def states_of(refs, before, nested):
    """``[[index, state], ...]`` for the containers of ``refs`` whose contents differ from ``before``."""
    return [[index, state] for index, state in enumerate(container_states(refs, nested))
            if index >= len(before) or before[index] != state]


#: Value classes whose subclasses' objects of the test cross as a stand-in with a way home (see
#: :meth:`Shared.hold`).
_HOMED_VALUES = (fractions.Fraction, decimal.Decimal, datetime.date, datetime.time, datetime.timedelta)
_EXACT_VALUES = frozenset({fractions.Fraction, decimal.Decimal, datetime.date, datetime.datetime, datetime.time,
                           datetime.timedelta})
_STAND_IN_CLASSES = {}  # a value class -> the solution side's stand-in subclass of it
_MISSING_VALUE = object()

#: The test's containers shared at once, and the items they may hold together (more: they cross as copies,
#: written back when their call returns).
_SHARED_LIMIT = 64
_SHARED_ITEMS = 20_000


class Shared:
    """The test's containers the solution holds, one plain object on each side, kept equal while it holds them.

    Two kinds join, under keys the trusted side counts (both sides count alike: the solution names no key of
    its own making): a list, dict, set or bytearray a test's function returns to the solution
    (``{"sm": [key, contents]}``: a cache getter's dict), and a container of a call's arguments the solution
    still holds when the call returns (``"keep"``: ``cached(cache={})``). Crossing again, either way, it is
    ``{"sr": key}``, the same object on each side. A message carries the contents of those its sender changed
    (``"shs"``: an item put in, replaced or taken out, told by the items' identities, so nothing is encoded
    for an unchanged container), written in place on the other side; the solution side drops those it no
    longer holds (``"shd"``), and the trusted side drops them too. The solution writes only into containers it
    was handed, and what it writes is decoded as any reply (plain data, handles).

    It also carries the test's objects of a subclass of a standard value class (a ``Fraction`` subclass):
    ``{"vh": [key, value]}``, a stand-in there (a subclass of the value's class: the value, weak-referable),
    held here while the stand-in lives (``"vhd"`` lets go); crossing back, ``{"vr": key}`` is the test's own
    object again (a test's ``WeakValueDictionary`` then holds what it would in-process).
    """

    def __init__(self, owner):
        self.owner = owner  # the trusted side: it holds the test's own objects
        self.held = {}  # (trusted side) key -> a test's value object the solution holds a stand-in of
        self.held_keys = {}  # (trusted side) id of such an object -> its key
        self.letting_go = {}  # (trusted side) those the solution let go, by key, held until the exchange is over
        self.next_held = 0
        self.stand_ins = {}  # (solution side) key -> weak reference to its stand-in
        self.let_go = []  # (solution side) keys whose stand-in is gone, to tell the other side
        self.objects = {}  # key -> container
        self.keys = {}  # id(container) -> key (the table holds the container: its id is not reused)
        self.seen = {}  # key -> its items as last synced (held, compared by identity)
        self.sent = set()  # keys named in the message being encoded (never released with it)
        self.next = 0

    def hold(self, value):
        """(trusted side) The key of the test's value object ``value``, held until the solution lets go."""
        key = self.held_keys.get(id(value))
        if key is None:
            key = self.held_keys[id(value)] = self.next_held
            self.next_held += 1
            self.held[key] = value
        return key

    def release(self, keys):
        """(trusted side) The solution's stand-ins of ``keys`` are gone: held on only until the exchange ends."""
        if type(keys) is not list:
            raise WireError("malformed released values")
        for key in keys[:100_000]:
            value = self.held.pop(key, None) if type(key) is int else None
            if value is not None:
                self.held_keys.pop(id(value), None)
                self.letting_go[key] = value

    def stand_in(self, key, value):
        """(solution side) The stand-in of the test's value ``key``: one per key while it lives."""
        import weakref

        kind = type(value)
        if kind not in _EXACT_VALUES:
            raise WireError("malformed value with a home")
        known = self.stand_ins.get(key)
        made = known() if known is not None else None
        if made is not None:
            return made
        if key in self.let_go:  # (its last stand-in went while this message came: the new one holds it again)
            self.let_go.remove(key)
        cls = _STAND_IN_CLASSES.get(kind)
        if cls is None:
            cls = _STAND_IN_CLASSES[kind] = type(kind.__name__, (kind,), {
                "__slots__": ("_factory_home", "__weakref__"), "__module__": kind.__module__,
                "__qualname__": kind.__qualname__})
        rebuild, args = value.__reduce__()[:2]
        made = cls(*args)
        made._factory_home = key

        def gone(ref, key=key):
            if self.stand_ins.get(key) is ref:
                del self.stand_ins[key]
                self.let_go.append(key)

        self.stand_ins[key] = weakref.ref(made, gone)
        return made

    def room(self, container):
        """Whether ``container`` may join (the limits on how many and how big)."""
        return len(self.objects) < _SHARED_LIMIT and len(container) + sum(
            len(c) for c in self.objects.values()) <= _SHARED_ITEMS

    def add(self, container, key=None):
        """Register ``container`` under ``key`` (the next one by default)."""
        key = self.next if key is None else key
        self.next = max(self.next, key + 1)
        self.objects[key] = container
        self.keys[id(container)] = key
        self.seen[key] = _items(container)
        return key

    def drop(self, keys):
        """Forget the entries ``keys`` (unknown ones are ignored)."""
        if type(keys) is not list:
            raise WireError("malformed shared drops")
        for key in keys[:_SHARED_LIMIT * 2]:
            container = self.objects.pop(key, None) if type(key) is int else None
            self.sent.discard(key)
            if container is not None:
                self.keys.pop(id(container), None)
                self.seen.pop(key, None)

    def share(self, container, nested):
        """(trusted side) ``container`` joined under a new key, as its tagged ``{"sm": ...}`` form."""
        key = self.add(container)
        try:
            return {"sm": [key, _encode_container(container, type(container), nested)]}
        except BaseException:  # it does not cross: never shared (the key is not spent)
            self.drop([key])
            self.next = key
            raise

    def keep(self, container):
        """(trusted side) A container of a call's arguments the solution kept joins under the next key; the
        key is spent even where it does not join (already shared, or too many), as on the solution side."""
        if id(container) in self.keys or len(self.objects) >= 2 * _SHARED_LIMIT:
            self.next += 1
        else:
            self.add(container)

    def decode_new(self, key, state, nested):
        """(solution side) The container the trusted side shared under ``key``, registered before its items."""
        inner = state if type(state) is dict and len(state) == 1 else None
        tag = next(iter(inner)) if inner else None
        if key in self.objects or tag not in ("l", "d", "s", "ba"):
            raise WireError("malformed shared container")
        if tag == "ba":
            return self.objects[self.add(decode_value(state, None), key)]
        container = {"l": list, "d": dict, "s": set}[tag]()
        self.add(container, key)
        _fill(container, inner[tag], nested)
        self.seen[key] = _items(container)
        return container

    def _changed(self, key, container):
        items, held = _items(container), self.seen.get(key)
        if held is None or len(items) != len(held):
            return items
        if type(container) is bytearray:
            return items if items != held else None
        return None if all(map(operator.is_, items, held)) else items

    def changed(self):
        """Whether a container changed on this side since it was last synced."""
        return any(self._changed(key, c) is not None for key, c in self.objects.items())

    def changes(self, encode):
        """``[[key, contents], ...]`` for the containers changed on this side since they were last synced."""
        out = []
        for key, container in list(self.objects.items()):
            items = self._changed(key, container)
            if items is None:
                continue
            try:
                out.append([key, _encode_container(container, type(container), encode)])
            except Exception:  # noqa: BLE001 -- an item that cannot cross now: the other side keeps the last state
                continue
            self.seen[key] = items
        return out

    def apply(self, states, decode):
        """Write the other side's changed contents into this side's containers (unknown keys are dropped)."""
        if type(states) is not list:
            raise WireError("malformed shared states")
        decoded = []
        for entry in states[:_SHARED_LIMIT * 2]:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int:
                raise WireError("malformed shared states")
            target = self.objects.get(entry[0])
            if target is None:
                continue
            value = decode(entry[1])
            if type(value) is not type(target):
                raise WireError(f"shared state of a {type(value).__name__} for a {type(target).__name__}")
            decoded.append((entry[0], target, value))
        for key, target, value in decoded:  # all decoded first: a malformed entry changes nothing
            if target is not value:
                if type(target) in (dict, set):
                    target.clear()
                    target.update(value)
                else:
                    target[:] = value
            self.seen[key] = _items(target)

    def released(self, keep=()):
        """(solution side) Drop the containers only this table holds now, but those of ``keep`` (keys); their
        keys, for the other side."""
        gone = [key for key in list(self.objects) if key not in keep and key not in self.sent
                and sys.getrefcount(self.objects[key]) <= _HELD_BY_ONE]
        self.sent = set()  # (a container the message names is dropped with a later one, if still unheld)
        if gone:
            self.drop(gone)
        return gone


def _held_by_one():
    """``sys.getrefcount`` of an object one container holds (measured: interpreters count differently)."""
    probe = {0: []}
    return sys.getrefcount(probe[0])


_HELD_BY_ONE = _held_by_one()


def retained(refs):
    """Indices of the containers of ``refs`` (the copies a call's arguments decoded into, the call over) that
    something besides ``refs`` and each other still holds, and those inside them: what the callee kept."""
    inside = {}  # id -> how many times the other containers of refs hold it
    for index in range(len(refs.objects)):  # (no local name left holding a container when they are counted)
        for key in map(id, _inner(refs.objects[index])):
            if key in refs.index:
                inside[key] = inside.get(key, 0) + 1
    # (counted as the probe is, an item read from its table: no local name holds it)
    kept = [i for i in range(len(refs.objects))
            if sys.getrefcount(refs.objects[i]) > _HELD_BY_ONE + inside.get(id(refs.objects[i]), 0)]
    for index in kept:  # (grows while walking: the containers inside a kept one are kept with it)
        for key in map(id, _inner(refs.objects[index])):
            inner = refs.index.get(key)
            if inner is not None and inner not in kept:
                kept.append(inner)
    return kept


def _inner(container):
    """The items of ``container`` that may be containers (a list's, a dict's values)."""
    return container.values() if type(container) is dict else container if type(container) is list else ()


def _items(container):
    """A container's items as a tuple (a dict's keys and values in turn; a bytearray's bytes)."""
    if type(container) is dict:
        return tuple(item for pair in container.items() for item in pair)
    if type(container) is bytearray:
        return (bytes(container),)
    return tuple(container)


def _fill(container, items, nested):
    """Fill a new shared ``container`` from its tagged items (each through ``nested``)."""
    if type(items) is not list:
        raise WireError("malformed shared container")
    if type(container) is list:
        container.extend(nested(item) for item in items)
    elif type(container) is set:
        container.update(nested(item) for item in items)
    else:
        for pair in items:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("malformed shared container")
            container[nested(pair[0])] = nested(pair[1])


class Channel:
    """Length-prefixed JSON frames over a connected stream socket.

    A crossing is a request and its reply, each one frame: what is read comes
    in as few ``recv`` calls as the socket allows (one per frame where the
    peer's frame is in; what arrived beyond a frame waits in the buffer for
    the next :meth:`receive`), and the wait for a frame is bounded by the
    kernel (``SO_RCVTIMEO``, see :meth:`set_timeout`), not by a ``poll``
    before every read. Whoever reads the socket itself after a frame must
    read that frame with :meth:`receive_exact` (nothing past it is taken).
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = bytearray()
        self.timeout = None

    def set_timeout(self, seconds) -> None:
        """Bound each wait to send or receive by ``seconds`` (None: no bound); :class:`TimeoutError` past it.

        The socket stays blocking and the kernel keeps the bound, so a read or write is one system call.
        """
        if seconds == self.timeout:
            return
        self.sock.settimeout(None)
        micros = 0 if seconds is None else max(1, int(seconds * 1_000_000))  # (0: no bound, for the kernel)
        value = struct.pack("@ll", micros // 1_000_000, micros % 1_000_000)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self.timeout = seconds

    def send(self, message) -> None:
        body = json.dumps(message, separators=(",", ":")).encode("utf-8")
        if len(body) > MAX_FRAME:
            raise WireError(f"frame of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
        try:
            self.sock.sendall(len(body).to_bytes(4, "big") + body)
        except BlockingIOError:  # (SO_SNDTIMEO passed)
            raise TimeoutError("timed out") from None

    def _recv(self, wanted: int, exact: bool = False) -> bytes:
        """At least one byte: up to ``wanted`` (``exact``), else whatever is in, up to 1 MiB."""
        try:
            chunk = self.sock.recv(min(wanted if exact else max(wanted, 1 << 16), 1 << 20))
        except BlockingIOError:  # (SO_RCVTIMEO passed)
            raise TimeoutError("timed out") from None
        if not chunk:
            raise EOFError("the other side closed the channel")
        return chunk

    def _read(self, n: int) -> bytes:
        """Exactly ``n`` bytes: the buffer's first, then the socket's, never one byte past them."""
        chunks = [bytes(self.buffer[:n])]
        del self.buffer[:n]
        n -= len(chunks[0])
        while n:
            chunk = self._recv(n, exact=True)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    @staticmethod
    def _decode(body: bytes):
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, RecursionError, ValueError) as exc:
            raise WireError(f"malformed frame: {exc}") from None

    def receive(self):
        buffer = self.buffer
        if not buffer:  # (most often one read is one whole frame: decoded as it came)
            chunk = self._recv(4)
            if len(chunk) > 4 and int.from_bytes(chunk[:4], "big") == len(chunk) - 4 <= MAX_FRAME:
                return self._decode(chunk[4:])
            buffer += chunk
        while len(buffer) < 4:
            buffer += self._recv(4 - len(buffer))
        size = int.from_bytes(buffer[:4], "big")
        if size > MAX_FRAME:
            raise WireError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit")
        end = 4 + size
        while len(buffer) < end:
            buffer += self._recv(end - len(buffer))
        body = bytes(buffer[4:end])
        del buffer[:end]
        return self._decode(body)

    def receive_exact(self):
        """The next frame, reading nothing past it (the socket's next bytes are read by another protocol)."""
        (size,) = struct.unpack(">I", self._read(4))
        if size > MAX_FRAME:
            raise WireError(f"frame of {size} bytes is over the {MAX_FRAME}-byte limit")
        return self._decode(self._read(size))


class Endpoint:
    """One end of the bidirectional protocol over a :class:`Channel`.

    :meth:`exchange` sends a request and waits for its reply; any request
    the peer sends meanwhile (``"op"`` in it) is a nested call, served by
    :meth:`serve_one` and answered before waiting on. Subclasses implement
    :meth:`serve_one` and may decorate outgoing and incoming messages.

    Several threads of one side may cross (a solution's worker thread calling
    the test's callback, as ``more_itertools.callback_iter`` does): the
    requests in progress form one stack across both ends, so a thread takes
    its turn (:meth:`_ask_turn`) only where a new request nests soundly --
    while this side serves one of the peer's (or, where this side speaks
    first, ``initiates``, while none is in progress) -- and answers the
    peer's request only once the requests it made meanwhile are answered.
    Whoever made the request on top reads the channel; so no message pairs
    with another thread's request. A request of a thread made while the
    peer is not waiting on this side waits for the peer's next one.
    """

    def __init__(self, channel, initiates=True):
        self.channel = channel
        self.depth = 0
        self.initiates = initiates
        self.frames = []  # the requests in progress here: [thread, "ask" | "serve" | "reply"], innermost last
        self.turns = threading.Condition(threading.Lock())
        self.closed = False

    def outgoing(self, message):
        """Called on every message before it is sent (to attach what travels with it)."""
        return message

    def incoming(self, message):
        """Called on every message received, before it is handled."""
        return message

    def serve_one(self, request):
        """The reply to one request of the peer."""
        raise NotImplementedError

    def unserved(self, request, exc):
        """The reply to a peer's ``request`` that raised ``exc`` while it was read or answered here (a limit
        reached, a value that could not cross). Subclasses may also note the failure on their side."""
        return {"exc": {"type": "TypeError", "builtin": True, "cls": None, "message": f"boundary: {exc}"[:2000]}}

    def send(self, message):
        self.channel.send(self.outgoing(message))

    def close(self):
        """The channel is gone: threads waiting for a turn give up (EOFError)."""
        with self.turns:
            self.closed = True
            self.turns.notify_all()

    def _ask_turn(self):
        """Wait until this thread may send a request, and push it (see the class docstring)."""
        frame = [threading.get_ident(), "ask"]
        with self.turns:
            while not (self.frames[-1][1] == "serve" if self.frames else self.initiates):
                if self.closed:
                    raise EOFError("the channel is closed")
                self.turns.wait()
            self.frames.append(frame)
        return frame

    def _pop(self, frame):
        with self.turns:
            for index in range(len(self.frames) - 1, -1, -1):  # the top, but for a dead channel unwinding
                if self.frames[index] is frame:
                    del self.frames[index]
                    break
            self.turns.notify_all()

    def serve_request(self, message, nested=True):
        """Serve the peer's request ``message`` and send the reply, once this thread's turn to answer comes.

        ``nested``: the request came while this side waited on its own (:meth:`incoming` sees it first);
        a serving loop's own request goes to :meth:`serve_one` as it is.

        Every request is answered, whatever reading or serving it raises (only a dead channel ends the wait):
        the peer is waiting for that answer, and a request left unanswered would pair each later reply with
        the wrong request, so one failing test would fail all after it.
        """
        frame = [threading.get_ident(), "serve"]
        with self.turns:
            self.frames.append(frame)
        try:
            try:
                reply = self.serve_one(self.incoming(message) if nested else message)
            except (EOFError, OSError):
                raise
            except BaseException as exc:  # noqa: BLE001 -- answered as an error (see above)
                reply = self.unserved(message, exc)
            with self.turns:  # the requests other threads made meanwhile are answered first
                while self.frames[-1] is not frame:
                    if self.closed:
                        raise EOFError("the channel is closed")
                    self.turns.wait()
                frame[1] = "reply"  # (no thread nests a request on it now)
            try:
                self.send(reply)
            except (EOFError, OSError):
                raise
            except BaseException as exc:  # noqa: BLE001 -- what goes with the reply could not be sent
                self.channel.send(self.unserved(message, exc))
        finally:
            self._pop(frame)

    def exchange(self, request):
        """Send ``request``; serve the peer's nested requests until its reply comes, and return that."""
        if self.depth >= MAX_NESTING:
            raise WireError(f"calls nested deeper than {MAX_NESTING} across the boundary")
        frame = self._ask_turn()
        self.depth += 1
        try:
            self.send(request)
            while True:
                message = self.channel.receive()
                if type(message) is not dict:
                    raise WireError("malformed message")
                if "op" not in message:
                    # The reply is in: this request is over. Decoding the reply may ask the peer again (the
                    # hash of a key in a shared dict's update, a value's refresh) as this thread's next
                    # request, so the turn is given back first; kept, that request would wait on it forever.
                    self._pop(frame)
                    frame = None
                    return self.incoming(message)
                self.serve_request(message)
        finally:
            self.depth -= 1
            if frame is not None:
                self._pop(frame)


#: Items of an iterator run ahead cross in a short form when they are plain ints and strings (or a tuple or list
#: of them): ``{"j": x}``, ``{"jt": [...]}``, ``{"jl": [...]}``; everything else as ``{"i": tagged}``.
_SHORT_INT = 1 << 53


class CoroutineFace:
    """What a Task and ``asyncio.run`` need of a coroutine whose body runs on the other side of the boundary.

    The body is run to its end there at the first ``send``; a subclass gives ``_op("await")`` (the run) and
    ``close``.
    """

    __slots__ = ()

    def send(self, value):
        if value is not None:
            raise TypeError("can't send non-None value to a just-started coroutine")
        raise StopIteration(self._op("await"))

    def __next__(self):  # (what a Task's step calls, as PyIter_Send does for an object with tp_iternext)
        return self.send(None)

    __iter__ = None  # not iterable, as a coroutine is not

    def throw(self, kind, value=None, traceback=None):
        self.close()
        raise value if value is not None else kind


def encode_item(value, encode):
    """One item of an iterator run ahead: the short form where it applies, else ``{"i": encode(value)}``."""
    kind = type(value)
    if kind is str or (kind is int and -_SHORT_INT < value < _SHORT_INT):
        return {"j": value}
    if (kind is tuple or kind is list) and len(value) <= 64 and all(
            type(x) is str or (type(x) is int and -_SHORT_INT < x < _SHORT_INT) for x in value):
        return {"jt" if kind is tuple else "jl": list(value)}
    return {"i": encode(value)}


def decode_item(entry, decode):
    """The value of an item :func:`encode_item` made (``decode`` for the tagged form)."""
    if "i" in entry:
        return decode(entry["i"])
    (tag, body), = entry.items()
    items = [body] if tag == "j" else body if tag in ("jt", "jl") and type(body) is list else None
    if items is None or not all(type(x) is str or (type(x) is int and -_SHORT_INT < x < _SHORT_INT)
                                for x in items):
        raise WireError("malformed item")
    return body if tag == "j" else tuple(body) if tag == "jt" else list(body)
