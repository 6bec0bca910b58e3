"""The trusted side of the import boundary: pytest, the tests and the report, with no agent code.

Sent as source (after :mod:`._wire`) to ``python -I -B -c`` in the *trusted*
sandbox, which holds the task's tests (visible and hidden) and its pristine
non-Python files, and not one file the agent wrote. It connects to the
solution server's socket, then installs an import hook on ``sys.meta_path``
(just before the path finder) for the solution's top-level module names:
anything the trusted side can import itself (the standard library, pytest,
the tests' own helpers) is never proxied, so a solution file cannot shadow
them; only a namespace package (a directory without ``__init__.py``) gives
way to the solution's module, as it would in-process.

An imported solution module is a :class:`RemoteModule`; what its attributes
and calls return is plain data (rebuilt here as builtins), a value object
rebuilt here from plain fields with trusted classes (the standard library's
value types, namedtuples, the solution's enums, and :class:`_Snapshot` for a
dataclass with a generated ``__eq__``: equality and order computed here), a
live container (a list, dict, set or bytearray an attribute read returned:
module state, whose changes are made in the solution; a list of plain data a
solution module's attribute read returned is a real list, shared and kept in
sync both ways: :meth:`SolutionClient.adopt`), or a handle
(:class:`RemoteObject`, or a :class:`RemoteClass` for classes) whose
methods run in the solution's process. An object of a solution class
deriving from a builtin value type (a ``dict`` subclass such as a config
section, a ``str`` or ``tuple`` subclass, ``OrderedDict``, ``Counter``,
``defaultdict``) crosses as that builtin holding the object's value
(:class:`_BuiltinValue`): ``==``, ``<`` and ``hash`` are the builtin's,
computed here, whatever the class overrides; its own methods and every
change run in the solution. A handle is compared or hashed by its class's
own methods in the solution's process only where the test relies on that
class (:func:`_decide`: a class the tests name, and for a comparison with
the test's own value, an object the test built by calling the class; the
answer a bool, counted in the report's ``solution_decided``), or between two
objects of a class the tests never name that one solution callable made
from none of the test's values (``compose(f, h) == compose(f, h)``: no plain
data, no test function holding a constant, default, free variable or
global, no callback run while made, never sent a value since; against the
test's own value such an object may only decline). Otherwise a
handle cannot be compared, hashed by value, or passed anything
but plain data and other handles: each of those raises
:class:`BoundaryError`, a ``BaseException`` so that neither ``except
Exception`` nor ``pytest.raises(Exception)`` in a test swallows it, and the
test fails saying why (its truth value is the solution's plain bool, no more
than a function returning one). Exceptions raised by the solution arrive as
builtin ``Exception`` classes by name (never another ``BaseException``: a
solution cannot skip or interrupt the run) or as stand-in classes for its
own; its ``SystemExit`` arrives as one, with its code, only where the tests'
own code made the call (``pytest.raises(SystemExit)`` around ``main()``;
uncaught, pytest fails that test), never inside pytest's machinery; one
that ends a trusted process keeps its code only where the script stands at
a final call (``sys.exit(main())``), never cutting a check script or a
unittest run short (:class:`_SolutionExit`: the status is then 1).

The test's own objects passed to the solution (key functions, callbacks,
mocks, files, test functions a decorator of the solution wraps) cross as
reverse handles: the solution's calls on them run here, while the call
into the solution waits. The solution may call them, iterate them, use them
as context managers and read their public attributes; never set or delete
an attribute, read a private or dunder one (``__globals__``, ``__self__``,
``__closure__``, ``__dict__``; a class's ``__dict__`` is a read-only mapping
of its public names only), a frame's or generator's (``gi_frame``,
``f_locals``), pytest's marks, or the methods that reconfigure a mock; a
module, frame, or pytest's own machinery never crosses. A test's function
(or bound method) is mirrored there by a real function generated from a
plain-data description (signature with the defaults that are immutable
plain data, never a test function's; annotations as text; name, qualname,
module, doc; generator or coroutine; its public attributes, re-sent each
time it crosses): what the solution sets on the mirror stays there, and
its code, globals, closure and ``__wrapped__`` are the mirror's own. The
solution's functions show a test ``inspect.signature``, ``__doc__``,
``__module__``, ``__wrapped__`` and a stand-in ``__code__`` (flags, file
name) as data; pytest itself never takes a signature from the solution. A plain
function at the top level of a solution module (no attributes, no ``__wrapped__``, not a generator or
coroutine, immutable plain-data defaults) is a real function here
(:func:`_solution_function`: ``type(f) is FunctionType``; our generated code with its signature, calling
the handle), which goes back to the solution as its own function and is never collected or counted as a
test; what a test sets on it stays here. A failure of
pytest's (``pytest.fail``, a skip) or a :class:`BoundaryError` raised in
the test's code during a solution call is re-raised once the call returns,
whatever the solution did with it. A decorated test counts only if its own
function's last call got pytest's arguments and returned. Lists, dicts, sets
and bytearrays passed as arguments get the solution's changes written back.
What the solution printed, logged and warned during a call is re-emitted
here (``capsys``, ``capfd``, ``caplog``, ``pytest.warns``), and the test's
environment changes and working directory go with each call.

A class of the tests' own (deriving only from ``object``, the tests' classes
and ``collections.abc``'s) is a real stand-in class there, built from its
names and bases (:meth:`SolutionClient.class_description`), registered with
the ABCs it is a subclass of, and a handle on one of its objects is an
object of that stand-in: ``issubclass``, ``mro()`` and dispatch on
``type(obj)`` work there. The test's exception objects are exceptions there
(their class, or a stand-in for the test's own, with their args). Awaitables
cross as awaitables: each side runs its own to the end in an event loop of
its own (:class:`_RemoteCoroutine`, :func:`_run_to_end`). A solution context
manager's ``__exit__`` sees the block's exception (never an assertion or
pytest's outcomes) and may suppress it only where suppressing skips nothing
of the block (:func:`_ends_its_block`) or the test's own generator, thrown
into, caught it.

A test's class deriving from a solution class is a mixed class
(:func:`_mixed_class`): its objects live in the solution's process as
objects of a half made there (the solution's metaclass and
``__init_subclass__`` run only there), whose methods the test defines
forward to the test's own, run here; ``super()`` past them reaches the
solution's (:class:`_SolutionAttribute`). The half gets handles on the
test's methods and its public data, never the class, its ``__dict__``,
private data or the functions' globals. A test's object of a standard base
the solution checks (``tzinfo``, ``Mapping``, ``io`` bases) is one there too;
a solution zone whose offset depends on the moment is a ``tzinfo`` here.
Pickling or copying a solution object asks the solution: the stream made
here holds its bytes as data and names only :func:`_solution_unpickle`,
which hands them back to the solution to load; a test's object inside one
is pickled here and stays here (the solution holds a token). No bytes the
solution produced are ever unpickled in this process. A ``__reduce__`` that
looks an object up by ``__module__`` and ``__qualname__`` (toolz's curry)
may import a module of the tests' there: a stand-in whose attributes are
only that module's globals that are the solution's own objects
(:meth:`SolutionClient.test_global`), never a test's value, function or
class.

Iterators cross lazily, in batches where that is sound: the solution's
(:meth:`SolutionClient.next_item`: items produced ahead by a copy of its
process, used only while nothing else goes to the solution) and the test's
builtin iterators over their own data passed as temporaries
(:meth:`SolutionClient.clone_ahead`: from a copy; one the test holds never
runs ahead, or the solution could read what the test reads from it next).

A failing test whose failure comes from something that could not cross is
listed in the report's ``boundary``: ``[{"test": node id, "what":
message}]``.

``pytest.importorskip`` of a solution module imports it plainly: a solution
that fails to import fails its tests, it does not skip them.

A NaN from the solution makes every ordered comparison false, so a
tolerance check written ``if abs(got - want) > tol: fail`` passes it
vacuously. A NaN from the solution arrives as :class:`_SolutionNaN` (a
float that notes the comparisons it takes part in, and stays one through
arithmetic); a test in which one was compared passes only if it asked
about it (``math.isnan``, ``cmath.isnan``, ``x != x``, ``pytest.approx(...,
nan_ok=True)``); otherwise it is failed, saying why. A NaN the test never
compared (a parsed field it does not look at) changes nothing; one that
could not be marked (inside a numpy array, a set) counts as compared.

Outcomes come from pytest's own report hooks in this process and go out as
one ``<nonce> <base64 JSON>`` line on this process's stdout, which the
solution's process cannot reach.
"""

from __future__ import annotations

import abc
import builtins
import collections
import collections.abc
import datetime
import enum
import functools
import importlib.abc
import importlib.machinery
import io
import itertools
import keyword
import operator
import os
import re
import socket
import sys
import time
import types

if __name__ != "__main__":  # imported on the host (tests); in the sandbox _wire's source precedes this
    from factory.verifiers._wire import (
        MAX_DEPTH,
        Channel,
        CoroutineFace,
        Endpoint,
        Refs,
        Shared,
        WireError,
        WorkspaceFiles,
        annotation_of,
        annotation_text,
        container_states,
        cwd_to_wire,
        decode_item,
        decode_value,
        encode_item,
        encode_value,
        parameters_from,
        states_of,
        write_back,
    )

__all__ = ["BoundaryError", "RemoteClass", "RemoteModule", "RemoteObject", "SolutionClient", "run_tests"]



def _is_mock(obj):
    """Whether ``obj`` is a ``unittest.mock`` object, without importing the module (it pulls in asyncio).

    An object can only be a mock if a test imported ``unittest.mock`` already.
    """
    mock = sys.modules.get("unittest.mock")
    return mock is not None and isinstance(obj, mock.NonCallableMock)

class BoundaryError(BaseException):
    """A test used a solution object in a way the isolation boundary does not carry."""

    def __init__(self, *args):
        super().__init__(*args)
        seen = _BOUNDARY.setdefault(_NAN["current"], [])
        if len(seen) < 5 and str(self)[:300] not in seen:
            seen.append(str(self)[:300])


#: Test node id -> what could not cross while it ran (reported for the tests that fail).
_BOUNDARY = {}
#: The test function a decorator of the solution wraps in the running test, the arguments pytest gave the
#: test, and whether the function's last call got those arguments and returned.
_RUN = {"watch": None, "ran": False, "args": {}}


def _same_argument(given, expected):
    try:
        return given is expected or (type(given) is type(expected) and bool(given == expected))
    except BaseException:
        return False


def _run_watched(function, args, kwargs):
    """Call the test's own function for a decorator of the solution; the test's pass counts only if its last
    call had the arguments pytest gave the test (a wrapper cannot feed it its own ``expected``) and returned
    (a wrapper cannot swallow its failure)."""
    import inspect

    _RUN["ran"] = False
    try:
        bound = inspect.signature(function).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = None
    wanted = _RUN["args"]
    parameters = inspect.signature(function).parameters
    faithful = bound is not None and all(name in bound and _same_argument(bound[name], value)
                                         for name, value in wanted.items() if name in parameters)
    result = function(*args, **kwargs)
    _RUN["ran"] = faithful
    return result


class _SolutionBuiltin:
    """A builtin the solution holds that this side will not hand a test (``exec``, ``open``, ``delattr``,
    ``BaseException``): a token with its name, equal to the same token, never callable here. A registry of the
    solution keyed by builtins (toolz's signature table) can then still be read. A refused class
    (``BaseException``: ``except`` with it would swallow pytest's outcomes) is a token too, and said in the
    report's ``boundary`` for a test that fails."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<the solution's builtin {self.name}>"

    def __eq__(self, other):
        return type(other) is _SolutionBuiltin and other.name == self.name

    def __hash__(self):
        return hash(("builtin", self.name))

    def __call__(self, *args, **kwargs):
        raise BoundaryError(f"the solution's builtin {self.name} is not run by the tests' process")

    def _factory_handle_of(self):
        return {"bi": self.name}


class _RefusedBuiltin(WireError):
    """A builtin the solution may not hand over (``exec``, ``BaseException``, ...), in a well-formed message."""


class SolutionUnavailable(BaseException):
    """The solution's process crashed, hung past the call timeout, or broke the protocol."""


def _safe_name(text, default="SolutionObject"):
    text = str(text)[:120]
    cleaned = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text.split(".")[-1])
    return cleaned if cleaned and not cleaned[0].isdigit() else default


#: The test running now, and the tests in which a NaN from the solution was compared / was checked.
_NAN = {"current": None, "received": set(), "checked": set()}


_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def _has_nan(value, depth=0):
    """Whether a NaN is in ``value``: plain containers, namedtuples, dataclass snapshots, live containers and
    dict views too (read with the base types' own methods: nothing is asked of the solution)."""
    kind = type(value)
    if kind is float:
        return value != value
    if isinstance(value, float) and kind is not _SolutionNaN:  # a float subclass of the solution's, as its
        return float.__ne__(value, value)  # builtin value (a _SolutionNaN notes its own comparisons)
    if kind is complex:
        return value.real != value.real or value.imag != value.imag
    numpy = sys.modules.get("numpy")
    if numpy is not None and kind is numpy.ndarray:  # (rebuilt here from the solution's bytes: numbers only)
        return value.dtype.kind in "fc" and bool(numpy.isnan(value).any())
    if depth >= 50:
        return False
    if isinstance(value, _Snapshot):
        items = [item for _, item in object.__getattribute__(value, "_factory_fields")]
    elif isinstance(value, dict):
        items = [part for pair in dict.items(value) for part in pair]
    elif isinstance(value, (list, tuple, set, frozenset)):
        base = next(b for b in (list, tuple, set, frozenset) if isinstance(value, b))
        items = list(base.__iter__(value))
    elif kind in _VIEWS:
        items = [part for item in value for part in (item if kind is _VIEWS[2] else (item,))]
    else:
        return False
    return any(_has_nan(item, depth + 1) for item in items)


class _SolutionNaN(float):
    """A NaN the solution sent: an ordinary float here, except that comparing it with anything but itself
    notes the running test (such a comparison is false, so a tolerance check passes it vacuously), comparing
    it with itself (``x != x``) counts as asking whether it is NaN, and arithmetic on it gives another."""

    __slots__ = ()
    __hash__ = float.__hash__

    def __repr__(self):
        return float.__repr__(self)


def _nan_comparison(name):
    base = getattr(float, name)

    def method(self, other):
        _NAN["checked" if other is self else "received"].add(_NAN["current"])
        return base(self, other)
    method.__name__ = name
    return method


def _nan_arithmetic(name):
    base = getattr(float, name)

    def method(self, *args):
        result = base(self, *args)
        return _SolutionNaN(result) if type(result) is float and result != result else result
    method.__name__ = name
    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(_SolutionNaN, _name, _nan_comparison(_name))
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__neg__", "__pos__",
              "__abs__", "__round__"):
    setattr(_SolutionNaN, _name, _nan_arithmetic(_name))


def _marked_nans(value, depth=0):
    """``value`` with each NaN float in it a :class:`_SolutionNaN` (lists and dicts changed in place; tuples,
    namedtuples and dataclass snapshots rebuilt); a NaN it cannot mark (a set's, an array's) counts as
    compared, as before (:func:`_has_nan` finds it)."""
    kind = type(value)
    if kind is float:
        return _SolutionNaN(value) if value != value else value
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.floating) and value.ndim == 0:
        return _SolutionNaN(float(value)) if value != value else value
    if depth >= 50:
        return value
    if kind is list:
        for index, item in enumerate(list.__iter__(value)):
            marked = _marked_nans(item, depth + 1)
            if marked is not item:
                list.__setitem__(value, index, marked)
    elif kind is dict:
        for key, item in list(dict.items(value)):
            marked = _marked_nans(item, depth + 1)
            if marked is not item:
                dict.__setitem__(value, key, marked)
    elif kind is tuple or (isinstance(value, tuple) and type(getattr(kind, "_fields", None)) is tuple
                           and kind.__module__ == "collections"):
        items = [_marked_nans(item, depth + 1) for item in tuple.__iter__(value)]
        if any(a is not b for a, b in zip(items, tuple.__iter__(value))):
            return tuple(items) if kind is tuple else kind(*items)
    elif isinstance(value, _Snapshot):
        fields = object.__getattribute__(value, "_factory_fields")
        marked = tuple((name, _marked_nans(item, depth + 1)) for name, item in fields)
        if any(a[1] is not b[1] for a, b in zip(marked, fields)):
            object.__setattr__(value, "_factory_fields", marked)
    return value


def _note_nans(value):
    """``value`` with the solution's NaNs marked (see :class:`_SolutionNaN`)."""
    value = _marked_nans(value)
    if _has_nan(value):  # (one that could not be marked)
        _NAN["received"].add(_NAN["current"])
    return value


def _watch_nan_checks(pytest):
    """Record the tests that ask whether a value is NaN (the trusted side's own functions, wrapped)."""
    import cmath
    import math

    def checked(function):
        def wrapper(*args, **kwargs):
            result = function(*args, **kwargs)
            if result is True:
                _NAN["checked"].add(_NAN["current"])
            return result
        return wrapper

    math.isnan = checked(math.isnan)
    cmath.isnan = checked(cmath.isnan)
    approx = pytest.approx

    def approx_watching(*args, **kwargs):
        if kwargs.get("nan_ok"):
            _NAN["checked"].add(_NAN["current"])
        return approx(*args, **kwargs)

    pytest.approx = approx_watching


#: Builtins the solution may hand the trusted side by name (classes and pure functions: nothing that evaluates,
#: imports, opens or reaches attributes by name).
_SAFE_BUILTINS = frozenset({
    "int", "float", "complex", "str", "bytes", "bytearray", "bool", "list", "tuple", "dict", "set", "frozenset",
    "range", "object", "slice", "abs", "len", "max", "min", "sum", "sorted", "reversed", "repr", "round", "ord",
    "chr", "any", "all", "divmod", "pow", "hash", "enumerate", "zip", "map", "filter", "iter", "next",
    # pure too (a registry keyed by builtins, toolz's signatures table, holds them)
    "aiter", "anext", "callable", "isinstance", "issubclass", "format", "bin", "hex", "oct", "ascii", "id", "type",
    "memoryview", "property", "staticmethod", "classmethod", "super"})
_LIVE_BASES = (list, dict, set, bytearray)
_PYTEST_ENV = ("PYTEST_", "_PYTEST")
#: Items a solution iterator's process is asked to produce ahead: the first time, and at most (times 4 each
#: time the test took them all and asked again).
_AHEAD_FIRST = 64
#: ... once this many next() requests in a row on it were answered one by one (forking a copy costs as much as
#: several round trips).
_AHEAD_AFTER = 4
_AHEAD_MOST = 4096
#: ... unless the iterators consumed at the same place of the test's code ended, on average, fewer than this many
#: items after that point (the copy would cost more than it saves: ``all(map(isclose, solution.idft(x), x))``).
_AHEAD_WORTH = 16
#: How many causes of the solution's exception (``raise ... from exc``) are rebuilt with it.
_CAUSE_DEPTH = 4
#: References to a test's iterator passed as a temporary argument, seen from clone_ahead (see there).
_TEMPORARY_REFS = 6
#: The same at the entry of a generated mirror of a solution function (_solution_function's forward): its
#: parameter, the tuple of values and getrefcount's argument; a test's variable makes it at least one more.
_MIRROR_TEMPORARY_REFS = 3
#: Most items of an iterator consumed whole by a builtin asked for in one request (see _whole_consumer).
_WHOLE_MOST = 4096
_ITEM_TAGS = frozenset({"i", "j", "jt", "jl", "end"})
#: The test's iterators the solution may get items of ahead (clone_ahead): builtin, their items computed from
#: data they hold, copied faithfully by __reduce__.
_CLONABLE_ITERATORS = frozenset(type(x) for x in (
    iter(()), iter([]), iter(""), iter(b""), iter(range(0)), iter(range(1 << 64)), iter(bytearray()),
    itertools.permutations(()), itertools.combinations((), 0), itertools.combinations_with_replacement((), 0),
    itertools.product(), itertools.count(), itertools.repeat(None)))
#: The test's builtin iterators whose iter() is the object itself, with no code run (PyObject_SelfIter): the
#: solution's iter() on one takes no round trip (handle "selfiter").
_SELF_ITERATORS = _CLONABLE_ITERATORS | frozenset(type(x) for x in (
    (lambda: (yield))(), map(id, ()), filter(None, ()), zip(), enumerate(()), reversed([]), iter({}),
    iter({}.values()), iter({}.items()), iter(set())))
#: Attribute names of a test's object the solution may never read, whatever their prefix.
_HIDDEN_PREFIXES = ("_", "gi_", "cr_", "ag_", "f_", "tb_", "co_", "pytest")
_NAME_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})
#: Methods of a mock that would let the solution rewrite the test's assertions or records.
_MOCK_WRITERS = frozenset({"configure_mock", "attach_mock", "mock_add_spec", "reset_mock", "side_effect",
                           "return_value"})


#: Standard-library bases the solution's code checks with isinstance, by the name the solution side knows.
_STANDARD_BASES = (("tzinfo", datetime.tzinfo), ("MutableMapping", collections.abc.MutableMapping),
                   ("Mapping", collections.abc.Mapping), ("MutableSequence", collections.abc.MutableSequence),
                   ("Sequence", collections.abc.Sequence), ("MutableSet", collections.abc.MutableSet),
                   ("Set", collections.abc.Set), ("TextIOBase", io.TextIOBase),
                   ("BufferedIOBase", io.BufferedIOBase), ("RawIOBase", io.RawIOBase), ("IOBase", io.IOBase))


#: Standard modules whose exception classes a solution's error may be raised as here (never unittest's SkipTest
#: or anything else a runner reads as a verdict).
_STANDARD_ERROR_MODULES = frozenset({
    "pickle", "_pickle", "json", "json.decoder", "decimal", "_decimal", "re", "csv", "_csv", "configparser",
    "struct", "binascii", "zlib", "shutil", "subprocess", "zipfile", "tarfile", "sqlite3", "queue", "copy",
    "calendar", "statistics", "tomllib", "getopt", "argparse", "socket", "http.client", "urllib.error",
    "email.errors", "xml.parsers.expat", "concurrent.futures._base", "asyncio.exceptions", "locale", "zoneinfo",
    "zoneinfo._common", "ast", "tokenize", "binhex", "uu", "lzma", "_lzma", "bz2", "gzip", "select"})


def _standard_name(value):
    """``[module, qualname]`` of a class or function of the standard library that ``value`` is (reached again by
    that name here; never the tests' or pytest's), else None."""
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return None
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or module == "builtins" \
            or module.split(".")[0] not in sys.stdlib_module_names or "<" in qualname:
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return [module, qualname] if found is value else None


def _standard_exception(described):
    """The standard library's exception class a solution's error names (``["_pickle", "PicklingError"]``), if it
    is one of :data:`_STANDARD_ERROR_MODULES` and this side has that module imported; else None."""
    if type(described) is not list or len(described) != 2 or described[0] not in _STANDARD_ERROR_MODULES \
            or type(described[1]) is not str or not described[1].isidentifier():
        return None
    found = getattr(sys.modules.get(described[0]), described[1], None)
    if isinstance(found, type) and issubclass(found, Exception) and found.__module__ == described[0]:
        return found
    return None


def _defined_by_tests(cls, name):
    """Whether method ``name`` of ``cls`` is a function of the tests' own code (not the standard library's or
    pytest's)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            module = str(getattr(klass, "__module__", "") or "")
            return isinstance(vars(klass)[name], types.FunctionType) and not module.startswith(
                ("_pytest", "pytest", "pluggy")) and module.split(".")[0] not in sys.stdlib_module_names
    return False


def _abcs_of(cls):
    """The names of ``collections.abc``'s classes that ``cls`` is a subclass of (registered ones too)."""
    return sorted(name for name in collections.abc.__all__ if name[0] != "_" and isinstance(
        getattr(collections.abc, name), type) and issubclass(cls, getattr(collections.abc, name)))


def _lacking(cls):
    """The container protocols the handle on an object of class ``cls`` must not offer (a generator is no
    ``Sized``: code that would call ``list()`` on a sized iterable must iterate it lazily, as in-process)."""
    lacks = [name for name in ("__len__", "__next__") if getattr(cls, name, None) is None]
    if all(getattr(cls, name, None) is None for name in ("__iter__", "__getitem__", "__contains__")):
        lacks += ["__iter__", "__contains__"]
    return lacks


def _no_reverse(value):
    """Why a test's object may not be handed to the solution (None when it may)."""
    if isinstance(value, (types.FrameType, types.TracebackType, types.CodeType)):
        return f"a {type(value).__name__} cannot be passed to the solution"
    if isinstance(value, types.ModuleType):
        return (f"module {getattr(value, '__name__', '?')} cannot be passed to the solution (only the standard "
                "library's, by name)")
    module = getattr(type(value), "__module__", "") or ""
    if module.startswith(("_pytest", "pytest", "pluggy")) and type(value).__name__ in (
            "MonkeyPatch", "FixtureRequest", "SubRequest", "Config", "Session", "Pytester", "Testdir",
            "TopRequest", "PytestPluginManager", "Function", "Module", "Class"):
        return f"pytest's {type(value).__name__} cannot be passed to the solution"
    return None


def _plain_default(value, depth=0):
    """Whether a test function's default may cross to its mirror: immutable plain data only (a mutable default
    is one object the function may change; anything else stays on the trusted side)."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return type(value) not in (str, bytes) or len(value) <= 10_000
    return type(value) in (tuple, frozenset) and depth < 3 and len(value) <= 50 and all(
        _plain_default(item, depth + 1) for item in value)


#: The standard streams whose current object the solution's ``sys`` mirrors during a call.
_STREAM_NAMES = ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__")
#: This process's own streams (and their instance attributes), as it started.
_OWN_STREAMS = {name: (getattr(sys, name, None), frozenset(getattr(getattr(sys, name, None), "__dict__", {})))
                for name in _STREAM_NAMES}
#: What the solution may use of a test's stream it got as its ``sys.stdout`` (etc.) and was not handed: the
#: stream API, never reading back what was written to it (``getvalue``, ``seek``: the test's own output).
_STREAM_API = frozenset({"write", "writelines", "flush", "isatty", "fileno", "encoding", "errors", "newlines",
                         "name", "mode", "closed", "readable", "writable", "seekable", "line_buffering",
                         "write_through"})
_STDIN_API = _STREAM_API | {"read", "readline", "readlines"}
#: Attributes of the standard library's modules that a test changed (with monkeypatch or unittest.mock), with
#: their values before: the solution's own modules get the test's values during its calls.
_PATCHED = {}
_MISSING = object()
#: Those never mirrored: the solution's process needs its own (imports, environment: sent apart, the wire).
_UNMIRRORED = {"sys": frozenset({"modules", "path", "meta_path", "path_hooks", "path_importer_cache", "flags",
                                 "settrace", "setprofile", "excepthook", "unraisablehook", "displayhook",
                                 "dont_write_bytecode", "_getframe", "exc_info", "exception"} | set(_STREAM_NAMES)),
               "os": frozenset({"environ", "environb", "fstat", "pread", "chdir", "getcwd", "dup2", "fdopen"})}
_UNMIRRORED_MODULES = frozenset({"json", "struct", "socket", "base64", "threading", "_thread", "importlib",
                                 "select", "selectors", "signal", "gc", "types", "abc", "io", "_io"})
#: The builtins a test may replace for the solution (input, print, open); the rest the wire itself uses.
_MIRRORED_BUILTINS = frozenset({"input", "print", "open", "help", "exit", "quit"})


def _watch_patch(target, name, old):
    """Record that a test changed ``target.name`` (its value before: ``old``), if ``target`` is a module of
    the standard library the solution's process has too."""
    if not isinstance(target, types.ModuleType) or getattr(type(target), "_factory_handle_of", None) is not None \
            or type(name) is not str:
        return
    module = getattr(target, "__name__", None)
    if type(module) is not str or sys.modules.get(module) is not target \
            or module.split(".")[0] not in sys.stdlib_module_names or module in _UNMIRRORED_MODULES \
            or name in _UNMIRRORED.get(module, ()) or (module == "builtins" and name not in _MIRRORED_BUILTINS):
        return
    _PATCHED.setdefault((module, name), old)


def _watch_patches(pytest):
    """Watch ``monkeypatch.setattr``/``delattr`` (and ``unittest.mock.patch`` once a test imports it)."""
    cls = pytest.MonkeyPatch

    def watching(method):
        def wrapper(self, *args, **kwargs):
            done = len(getattr(self, "_setattr", ()))
            try:
                return method(self, *args, **kwargs)
            finally:
                for entry in list(getattr(self, "_setattr", ()))[done:]:
                    if type(entry) is tuple and len(entry) == 3:
                        _watch_patch(entry[0], entry[1], _MISSING if entry[2] is _monkeypatch_notset(
                            pytest) else entry[2])
        wrapper.__name__ = method.__name__
        return wrapper

    cls.setattr = watching(cls.setattr)
    cls.delattr = watching(cls.delattr)


def _monkeypatch_notset(pytest):
    import _pytest.monkeypatch

    return getattr(_pytest.monkeypatch, "notset", None)


def _watch_mock_patches():
    """``unittest.mock.patch`` and ``patch.object`` of a standard module's attribute, once mock is imported."""
    mock = sys.modules.get("unittest.mock")
    if mock is None or getattr(mock, "_patch", None) is None or getattr(mock._patch, "_factory_watched", False):
        return
    enter = mock._patch.__enter__

    def watching_enter(self):
        result = enter(self)
        original = getattr(self, "temp_original", _MISSING)
        _watch_patch(getattr(self, "target", None), getattr(self, "attribute", None),
                     _MISSING if original is mock.DEFAULT else original)
        return result

    mock._patch.__enter__ = watching_enter
    mock._patch._factory_watched = True


def _unchanged(stream, skip=frozenset()):
    """Whether nothing in ``stream``'s instance dict stands in for its class's methods (monkeypatch's undo of
    ``sys.stdout.isatty`` leaves the stream's own bound method there, which changes nothing)."""
    for name, attr in list(getattr(stream, "__dict__", {}).items()):
        if name in skip:
            continue
        own = getattr(type(stream), name, None)
        try:
            bound = own.__get__(stream, type(stream)) if hasattr(own, "__get__") else own
            if not (getattr(attr, "__self__", None) is stream and attr == bound):
                return False
        except Exception:
            return False
    return True


def _own_stream(name, value):
    """Whether ``value``, this process's ``sys.<name>`` now, is its own or pytest's capture as set up (the
    solution then writes to its own, relayed here), rather than a stream a test put there or changed."""
    own, attrs = _OWN_STREAMS[name]
    if value is own:
        return _unchanged(value, attrs)
    return type(value).__module__ == "_pytest.capture" and _unchanged(value)


def _module_state():
    """``[(module, attribute, value)]``: what the solution's modules mirror now (``_MISSING``: deleted)."""
    _watch_mock_patches()  # (in every trusted process: a unittest suite's mock.patch too)
    state = [("sys", name, value) for name in _STREAM_NAMES
             for value in (getattr(sys, name, None),) if not _own_stream(name, value)]
    for (module, name), old in _PATCHED.items():
        target = sys.modules.get(module)
        if target is not None:
            value = target.__dict__.get(name, _MISSING)
            if value is not old:
                state.append((module, name, value))
    return state


class SolutionClient(Endpoint):
    """The trusted end of the channel: requests, the proxies of the solution's objects, and the test's
    objects the solution holds handles to (served here, under a read-only, public-attributes-only policy)."""

    def __init__(self, channel, call_timeout):
        super().__init__(channel)
        self.call_timeout = call_timeout
        self.proxies = {}
        self.function_keys = {}  # id of a real function standing for one of the solution's -> its key (proxies)
        self.broken = None
        self.exported = {}
        self.export_ids = {}
        self.described = {}  # key -> the plain-data description of a test's function handed to the solution
        self.standard = {}  # (module, qualname) -> a standard library object sent by name (the only ones it returns)
        self.describing = set()
        self.epoch = 0
        self.pending = None  # a BaseException raised in the test's code during a solution call: re-raised after
        self.raised = {}  # token -> exception the test's code raised into the solution
        self.namedtuples = {}
        self.snapshot_classes = {}
        # Which comparisons the solution may decide (see _decide): the keys of its classes the tests name, of
        # the callables of those classes (alternate constructors), of the objects calls of either returned,
        # and of the objects anything else handed over (the last may never stand for the test's own value).
        self.named, self.makers, self.made, self.tainted = set(), set(), set(), set()
        self.class_of = {}
        self.unrebuilt = set()
        self.decoding_made = False
        self.value_classes = {}
        self.zones = {}
        self.base_env = dict(os.environ)
        self.sent_env = None
        self.sent_cwd = None
        self.seen_env = self.seen_cwd = None  # os.environ's raw data and the directory as last looked at
        self.ahead = {}  # key of a solution iterator -> the entries its process produced ahead (next_item)
        self.taken = []  # [[key, count]]: entries taken since the last message, in the order taken
        self.streak = (None, 0)  # the iterator the last requests were next() on, and how many in a row
        self.last_reply = None
        # Keys of the solution's objects of builtin types that are their own iterators / have no len(): the
        # solution said so with the handle (it could answer either anyway), so neither is asked each time.
        self.self_iterators, self.lenless = set(), set()
        self.handed_ahead = {}  # key of a test's iterator -> items of it the solution got ahead and not yet took
        # Iterators a builtin consumes to its end (_whole_consumer): key -> (the test's frame, its call's offset);
        # the items the solution's own iterator produced for it in one batch, not yet handed out ("whole").
        self.whole, self.rest = {}, {}
        # Where in the test's code each solution iterator is consumed (code, offset), how many items it gave so
        # far, and how long those consumed at each place were when they ended (a running mean): next_item.
        self.site_of, self.consumed, self.site_lengths = {}, {}, {}
        self.made_at = None  # (the test's frame, the offset of its call, key) of the handle a call just returned
        self.module_cache = {}  # (module key, name) -> a module's function or class, until the solution says stale
        self.temporary_args = {}  # id -> a test's builtin iterator a mirror function was passed as a temporary
        self.sent_modules = ()  # the values last sent (held, so that their ids stay theirs)
        self.stream_only = {}  # key -> whether a stream the solution got as its sys.stdin (etc.) is read
        self.root = os.getcwd()  # the trusted workspace: a working directory inside it crosses relative to it
        self.workspace_files = WorkspaceFiles(self.root)  # files the test makes there, mirrored both ways
        self.pickled = []  # the test's objects the solution pickled (it holds their index, never the bytes)
        self.raised_before_tests = None  # how importing a solution module failed before any test ran (a conftest)
        self.standard_bases = {}  # a test object's class -> the standard bases it derives from (handle "std")
        self.class_stands = {}  # a test's class -> its stand-in's description (None: it gets none)
        self.exiting = None  # [the exception of a with block a solution's __exit__ sees, whether the test caught it]
        self.shared = Shared(owner=True)  # the test's containers the solution holds (see Shared)
        self.adopted = {}  # handle key of a solution module's list (dict, set) -> the real one here (adopt)
        self.adopting = []  # those keys, for the next message
        # Objects of the solution made from none of the test's values (see _decide, _carries_no_values): key ->
        # the key of the callable whose call made them; the keys once sent with a value (never free again); the
        # handle a handle was read from (a bound method's object, fed with it); requests served for the solution.
        self.data_free, self.fed, self.parents, self.served = {}, set(), {}, 0
        self.members = set()  # keys of the functions and classes the tests read from a solution module
        self.decoding_free = self.decoding_parent = None

    # ------------------------------------------------------------ protocol

    def outgoing(self, message):
        # Whatever goes to the solution lets it act: it first catches up with the items the test took from
        # runs ahead, and the rest of them are dropped (they were computed from the state before).
        if self.taken:
            message["took"], self.taken = self.taken, []
        self.ahead.clear()
        self.made_at = None
        files = self.workspace_files.changes()  # what the test wrote in its folder, where the code may read it
        if files:
            message["files"] = files
        if self.adopting:  # (first: the states below may name them)
            message["sha"], self.adopting = self.adopting, []
        if self.shared.objects:  # what the test changed in its containers the solution holds
            states = self.shared.changes(self.encode)
            if states:
                message["shs"] = states
        if message.get("op") == "next" and type(message.get("h")) is dict:
            key = message["h"].get("h")
            self.streak = (key, self.streak[1] + 1 if self.streak[0] == key else 1)
        else:
            self.streak = (None, 0)
        if "op" in message and self.depth <= 1:
            # What the tests set; never pytest's own variables (PYTEST_CURRENT_TEST names the running test,
            # and with it its parameters: an answer key).
            # Compared raw first (one dict comparison): most requests come with nothing changed.
            raw_env = getattr(os.environ, "_data", None)
            if raw_env is None or raw_env != self.seen_env:
                self.seen_env = dict(raw_env) if raw_env is not None else None
                env = {"set": {k: v for k, v in os.environ.items()
                               if self.base_env.get(k) != v and not k.upper().startswith(_PYTEST_ENV)},
                       "unset": [k for k in self.base_env if k not in os.environ]}
                if env != self.sent_env:
                    message["env"] = self.sent_env = env
            try:
                raw_cwd = os.getcwd()
            except OSError:
                raw_cwd = None
            if raw_cwd != self.seen_cwd:
                self.seen_cwd = raw_cwd
                cwd = cwd_to_wire(raw_cwd, self.root) if raw_cwd is not None else None
                if cwd != self.sent_cwd:
                    message["cwd"] = self.sent_cwd = cwd
            state = _module_state()
            if len(state) != len(self.sent_modules) or any(
                    a[:2] != b[:2] or a[2] is not b[2] for a, b in zip(state, self.sent_modules)):
                self.sent_modules = state
                message["mods"] = self.modules_to_wire(state)
        return message

    def modules_to_wire(self, state):
        """``[[module, attribute, present, value]]`` for the solution's modules; what cannot cross is left out."""
        entries = []
        for module, name, value in state:
            if value is _MISSING:
                entries.append([module, name, False, None])
                continue
            try:
                if module == "sys" and name in _STREAM_NAMES:
                    data = self.stream_handle(value, name.strip("_") == "stdin")
                else:
                    data = self.encode(value)
            except (BoundaryError, WireError, RecursionError):
                continue
            entries.append([module, name, True, data])
        return entries

    def stream_handle(self, value, reading):
        """A test's stream as the solution's ``sys.stdout`` (etc.): the stream API only, unless the test also
        hands it over itself."""
        if value is None or getattr(type(value), "_factory_handle_of", None) is not None:
            return self.encode(value)
        new = id(value) not in self.export_ids
        handle = self.handle_of(value, grant=False)
        if new:
            self.stream_only[handle["rh"]] = reading
        return handle

    def incoming(self, message):
        """Re-emit here what the solution printed, logged and warned before sending ``message``."""
        if type(message) is not dict:
            return message
        if "files" in message:  # new files only, under names nothing trusted picks up (see WorkspaceFiles)
            self.workspace_files.apply(message.pop("files"))
        stale = message.pop("stale", None)
        if stale is not None:  # module attributes rebound in the solution: asked for afresh
            if type(stale) is list and all(type(entry) is list and len(entry) == 2 for entry in stale[:10_000]):
                for entry in stale[:10_000]:
                    self.module_cache.pop((entry[0], entry[1]) if type(entry[1]) is str else None, None)
            else:
                self.module_cache.clear()
        if "shs" in message:  # what the solution changed in the test's containers it was handed
            self.shared.apply(message.pop("shs"), self.decode)
        if "shd" in message:  # those it no longer holds: a later crossing is a copy again
            self.shared.drop(message.pop("shd"))
        if "vhd" in message:  # the test's value objects it no longer holds a stand-in of
            self.shared.release(message.pop("vhd"))
        took = message.pop("took", None)
        if type(took) is list:  # items of the test's iterators the solution took from runs ahead: advance them
            for entry in took[:100_000]:
                if type(entry) is not list or len(entry) != 2 or type(entry[1]) is not int:
                    continue
                handed = self.handed_ahead.get(entry[0], 0)
                count = max(0, min(entry[1], handed))  # never further than the items it was given
                self.handed_ahead[entry[0]] = handed - count
                target = self.exported.get(entry[0])
                for _ in range(count):
                    try:
                        next(target)
                    except Exception:  # noqa: BLE001 -- (the copy ended here too)
                        break
        self.handed_ahead.clear()  # any message: the solution dropped what it had not taken
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            text = message.get(key)
            if type(text) is str and text:
                stream.write(text)
                stream.flush()
        logs = message.get("logs")
        if type(logs) is list:
            import logging

            for entry in logs[:1000]:
                if type(entry) is list and len(entry) == 5 and all(type(x) is str for x in entry[0:4:2]) \
                        and type(entry[1]) is int and type(entry[3]) is str and type(entry[4]) is int:
                    name, level, text, path, line = entry
                    logger = logging.getLogger(name[:200] or None)
                    if logger.isEnabledFor(level):
                        logger.handle(logger.makeRecord(logger.name, level, path, line, "%s", (text,), None))
        warns = message.get("warns")
        if type(warns) is list:
            import warnings

            for entry in warns[:1000]:
                if type(entry) is not list or len(entry) != 4 or type(entry[1]) is not str \
                        or type(entry[2]) is not str or type(entry[3]) is not int:
                    continue
                try:
                    category = self.decode(entry[0])
                except WireError:
                    category = None
                if not (isinstance(category, type) and issubclass(category, Warning)):
                    category = UserWarning
                try:
                    warnings.warn_explicit(entry[1], category, entry[2], entry[3])
                except BaseException as exc:  # -W error: raised in the test once the call is over, as in-process
                    self.pending = self.pending or exc
        return message

    def request(self, op, **fields):
        return self.exchange_checked({"op": op, **fields}, None)

    def note_values(self, message, maker):
        """Which objects of the solution ``message`` may put a value of the test's into (see :meth:`feed`); for an
        attribute read of an object made from none, that object (what the read returns is read from it)."""
        op = message.get("op")
        target = message.get("h")
        key = target.get("h") if type(target) is dict else None
        if op == "getattr":
            return key if key in self.data_free or key in self.parents else None
        if op in _READING_OPS or (op == "call" and maker is not None):
            return None  # (a comparison's value: the solution may only decline it, see _decide)
        found = []
        _handle_keys(message, found)
        for found_key in found:
            self.feed(found_key)
        return None

    def feed(self, key):
        """Note that the solution's object ``key`` was sent a value of the test's (a call's argument, a method's,
        an item set): neither it nor the object it was read from is made from none of the test's values now. A
        function or class of a solution module stays as it is: the solution's code, which the test did not build."""
        while key is not None and key not in self.fed and key not in self.members:
            self.fed.add(key)
            self.data_free.pop(key, None)
            key = self.parents.get(key)

    def exchange_checked(self, message, refs, made=False, maker=None):
        if self.broken is not None:
            raise SolutionUnavailable(self.broken)
        self.epoch += 1
        outermost = self.depth == 0
        served = self.served
        parent = self.note_values(message, maker) if self.data_free or maker is not None else None
        try:
            self.channel.set_timeout(self.call_timeout)
            reply = self.last_reply = self.exchange(message)
        except TimeoutError:
            self.broken = f"the solution did not answer within {self.call_timeout:.0f}s"
            raise SolutionUnavailable(self.broken) from None
        except (EOFError, OSError) as exc:
            self.broken = f"the solution's process is gone ({exc})"
            raise SolutionUnavailable(self.broken) from None
        except WireError as exc:
            if "nested deeper" in str(exc):
                raise BoundaryError(str(exc)) from None
            self.broken = f"the solution broke the protocol ({exc})"
            raise SolutionUnavailable(self.broken) from None
        finally:
            self.epoch += 1
        try:
            if type(reply) is not dict:
                self.broken = "the solution broke the protocol (reply is not an object)"
                raise SolutionUnavailable(self.broken)
            if self.pending is not None:  # the test's own failure inside a callback: the solution cannot hide it
                pending, self.pending = self.pending, None
                raise pending
            if refs is not None and reply.get("wb"):
                try:
                    write_back(refs, reply["wb"], lambda data: self.decode(data, refs))
                except WireError as exc:
                    raise BoundaryError(f"the solution's changes to an argument could not be written back ({exc})"
                                        ) from None
            keep = reply.get("keep")
            if refs is not None and type(keep) is list:  # arguments the solution holds on to: shared from now on
                for index in keep[:len(refs.objects)]:
                    if type(index) is not int or not 0 <= index < len(refs.objects):
                        raise BoundaryError("the solution named an argument it was not handed")
                    self.shared.keep(refs.objects[index])
            if "exc" in reply:
                raise self.exception(reply["exc"])
            if "ok" not in reply:
                self.broken = "the solution broke the protocol (no result)"
                raise SolutionUnavailable(self.broken)
            try:
                self.decoding_made = made
                # (a call of the test's that served the solution nothing: what it made holds no value of the test's)
                if maker is None and parent in self.data_free:  # (read from one made from none: made from none)
                    maker = parent
                self.decoding_free = maker if maker is not None and self.served == served else None
                self.decoding_parent = parent
                value = self.decode(reply["ok"], refs)
            except _RefusedBuiltin as exc:  # a well-formed answer holding a refused builtin: this call fails
                raise BoundaryError(f"the solution's answer holds a {exc}: the call fails") from None
            except WireError as exc:
                self.broken = f"the solution broke the protocol ({exc})"
                raise SolutionUnavailable(self.broken) from None
            finally:
                self.decoding_made = False
                self.decoding_free = self.decoding_parent = None
        finally:
            if outermost:
                self.raised.clear()
            self.shared.letting_go.clear()  # (after the reply is decoded: it may name them)
        return _note_nans(value)

    # ------------------------------------------------------------ the solution's iterators, run ahead

    def next_item(self, key):
        """``next()`` of the solution's iterator ``key`` (:meth:`_next_item`), noting how long the iterators
        consumed at each place of the test's code were when they ended (only to decide when to run ahead)."""
        count = self.consumed.get(key)
        if count is None:
            if len(self.consumed) >= 100_000:  # (iterators the test left unfinished)
                self.consumed.clear()
                self.site_of.clear()
            frame = sys._getframe(2)  # (the caller of RemoteObject.__next__)
            if len(self.site_lengths) < 10_000:
                self.site_of[key] = (frame.f_code, frame.f_lasti)
            count = 0
        self.consumed[key] = count + 1
        try:
            return self._next_item(key)
        except StopIteration:
            site = self.site_of.pop(key, None)
            if site is not None:
                typical = self.site_lengths.get(site)
                self.site_lengths[site] = count if typical is None else (typical + count) / 2
            self.consumed.pop(key, None)
            raise

    def _next_item(self, key):
        """``next()`` of the solution's iterator ``key``: an item its process produced ahead, or a request.

        After a few ``next()`` requests in a row on the same iterator (``_AHEAD_AFTER``), the next asks the solution
        for more items ahead (``SolutionServer.run_ahead``: computed by a copy of its process, so the solution itself
        does not advance). They are handed out here one ``next()`` at a time, only while nothing else goes
        to the solution and the test's environment, directory and mirrored modules are unchanged; the next
        message to the solution says how many were taken (``took``), and the solution advances its iterator
        that far before it does anything else. Whatever is left is dropped then.
        """
        rest = self.rest.get(key)
        if rest:  # produced by the solution's iterator itself, for the builtin consuming it: handed out as they are
            entry = rest.popleft()
            if not rest:
                del self.rest[key]
            self.epoch += 1
            return self.ahead_entry(entry)
        consumer = self.whole.pop(key, None)
        if consumer is not None:
            frame = sys._getframe(2)  # (the caller of RemoteObject.__next__: the builtin's caller)
            if frame is consumer[0] and frame.f_lasti in (consumer[1], consumer[1] - 4):  # (CALL, or its PRECALL)
                self.whole[key] = consumer
                value = self.request("next", h={"h": key}, whole=_WHOLE_MOST)
                more = self.last_reply.get("rest") if type(self.last_reply) is dict else None
                if type(more) is list and 0 < len(more) < _WHOLE_MOST and all(
                        type(entry) is dict and len(entry) == 1 and _ITEM_TAGS.issuperset(entry) for entry in more):
                    self.rest[key] = collections.deque(more)
                return value
        queue = self.ahead.get(key)
        if queue and not self.context_changed():
            entry = queue.popleft()
            self.epoch += 1  # a live container's contents may have changed with the step: read it afresh
            if self.taken and self.taken[-1][0] == key:
                self.taken[-1][1] += 1
            else:
                self.taken.append([key, 1])
            return self.ahead_entry(entry)
        streak = self.streak[1] if self.streak[0] == key else 0
        ask = min(_AHEAD_FIRST * 4 ** (streak - _AHEAD_AFTER), _AHEAD_MOST) if streak >= _AHEAD_AFTER else 0
        typical = self.site_lengths.get(self.site_of.get(key)) if ask else None
        if typical is not None and typical - streak < _AHEAD_WORTH and streak < 4 * typical + _AHEAD_WORTH:
            ask = 0  # (an iterator much longer than those before it here runs ahead after all)
        value = self.request("next", h={"h": key}, **({"ahead": ask} if ask else {}))
        more = self.last_reply.get("more") if ask and type(self.last_reply) is dict else None
        if type(more) is list and 0 < len(more) < ask:
            entries = collections.deque()
            for entry in more:
                if type(entry) is not dict or len(entry) != 1 or not _ITEM_TAGS.issuperset(entry):
                    entries.clear()  # not what was asked for: none of it is used
                    break
                entries.append(entry)
                if "end" in entry:
                    break
            if entries:
                self.ahead[key] = entries
        return value

    def ahead_entry(self, entry):
        """The item (or the exception that ends the iterator) an entry produced ahead stands for."""
        if "end" in entry:
            self.whole.clear()
            raise self.exception(entry["end"])
        try:
            value = decode_item(entry, self.decode)
        except _RefusedBuiltin as exc:
            raise BoundaryError(f"the solution's answer holds a {exc}: the call fails") from None
        except WireError as exc:
            self.broken = f"the solution broke the protocol ({exc})"
            raise SolutionUnavailable(self.broken) from None
        return _note_nans(value)

    def clone_ahead(self, key, target, count):
        """Up to ``count`` further items of the test's iterator ``target``, from a copy of it (it stays put).

        Only for builtin iterators whose items come from data they hold (a tuple's, a list's, a range's, a
        string's, ``itertools.permutations`` and its kin, ``count``, ``repeat``: no test code runs), and only
        while the test holds no reference of its own to it (one it passed as a temporary: the items ahead
        could otherwise tell the solution what the test reads from it afterwards, without it consuming them).
        The solution reports the items it took with its next message; :meth:`incoming` advances ``target`` by
        those first (``took``), so the test finds it exactly where in-process consumption would have left it.
        """
        # References: the table of exported objects, this frame, getrefcount's argument, the two argument
        # tuples of the call in progress (_RemoteCallable.__call__) and the stack slot of the test's frame that
        # passed a temporary. Any more (the test's variable, a container, a helper's parameter): the test
        # holds it, and gets no run ahead. (Measured; if a path holds fewer, a held iterator may run ahead.)
        if count < 1 or type(target) not in _CLONABLE_ITERATORS or (
                sys.getrefcount(target) > _TEMPORARY_REFS and self.temporary_args.get(id(target)) is not target):
            return []
        try:
            rebuild, args, *state = target.__reduce__()
            clone = rebuild(*args)
            if state and state[0] is not None:
                clone.__setstate__(state[0])
        except Exception:  # noqa: BLE001 -- no copy: no items ahead
            return []
        entries, deadline = [], time.thread_time() + 0.02  # this process's CPU time: load does not shrink it
        for index in range(count):
            try:
                item = next(clone)
            except StopIteration:
                entries.append({"end": True})
                break
            except Exception:  # noqa: BLE001 -- the real iterator raises it when asked
                break
            try:
                entries.append(encode_item(item, self.encode))
            except BaseException:  # noqa: BLE001 -- asked for, it crosses (or fails) as one item
                break
            if index % 64 == 63 and time.thread_time() > deadline:
                break
        self.handed_ahead[key] = self.handed_ahead.get(key, 0) + len(entries)
        return entries

    def context_changed(self):
        """Whether the test changed its environment, directory or mirrored modules since the last request."""
        raw_env = getattr(os.environ, "_data", None)
        if raw_env is None or raw_env != self.seen_env:
            return True
        try:
            if os.getcwd() != self.seen_cwd:
                return True
        except OSError:
            return True
        if self.workspace_files.changed():  # a file the solution's steps ahead may have read
            return True
        if self.shared.objects and self.shared.changed():  # a container the solution holds
            return True
        state = _module_state()
        return len(state) != len(self.sent_modules) or any(
            a[:2] != b[:2] or a[2] is not b[2] for a, b in zip(state, self.sent_modules))

    def decode(self, data, refs=None):
        return decode_value(data, self.proxy, refs=refs, objects=self.objects_from, shared=self.shared)

    def encode(self, value, refs=None, record=False):
        return encode_value(value, self.handle_of, refs=refs, record=record, objects=self.objects_of,
                            shared=self.shared)

    def objects_of(self, value, nested):
        """The test's values the solution gets as its own: snapshots go home, namedtuples and builtins rebuilt."""
        if type(value) is _SolutionNaN:
            return {"f": float.hex(value)}
        if isinstance(value, Exception) and not isinstance(value, AssertionError) \
                and not isinstance(type(value), RemoteClass) and "_factory_object" not in vars(value):
            # The test's exception object (a retry predicate's argument, a handler's): an exception there too,
            # of its builtin or standard class (a stand-in for the test's own), with its args; back home by token.
            info = self.exception_info(value)
            if "cls" in info or "std" in info or getattr(builtins, type(value).__name__, None) is type(value):
                try:
                    info["args"] = [nested(arg) for arg in value.args[:20]]
                except BoundaryError:
                    info.pop("args", None)
                return {"ex": info}
        if value is os.environ:  # read by the solution as a mapping; never a handle it could write through
            return nested(dict(value))
        mock = sys.modules.get("unittest.mock")
        if mock is not None and isinstance(value, (mock._CallList, mock._Call)):
            # A mock's records (call_args_list, mock_calls, call_args): a copy. Through a handle the solution
            # could delete or add calls, and assert_has_calls or call_args_list == [...] would check its edits.
            return {"l" if isinstance(value, list) else "t": [nested(item) for item in tuple.__iter__(value)]
                    if isinstance(value, tuple) else [nested(item) for item in list.__iter__(value)]}
        if isinstance(value, tuple) and type(getattr(type(value), "_fields", None)) is tuple:
            cls_key = getattr(type(value), "_factory_key", None)
            return {"nt": [{"h": cls_key} if cls_key is not None else None, type(value).__name__,
                           list(type(value)._fields), [nested(v) for v in value]]}
        if isinstance(value, enum.Enum) and getattr(type(value), "_factory_key", None) is not None:
            return {"en": [{"h": type(value)._factory_key}, value.name, nested(value.value)]}
        name = getattr(value, "__name__", None)
        if type(name) is str and getattr(builtins, name, None) is value and not isinstance(value, types.ModuleType):
            return {"bi": name}
        if isinstance(value, type) and issubclass(value, Exception) \
                and _standard_exception([value.__module__, value.__qualname__]) is value:
            return {"sx": [value.__module__, value.__qualname__]}  # the solution's own class of that name
        if isinstance(value, types.ModuleType) and type(name) is str \
                and name.split(".")[0] in sys.stdlib_module_names and sys.modules.get(name) is value:
            return {"mod": name}
        standard = _standard_name(value)
        if standard is not None:  # functools.partial, collections.OrderedDict, os.path.join: the solution's own
            self.standard[tuple(standard)] = value
            return {"std": standard}
        if type(value).__module__.startswith(_DATA_LIBRARIES):
            return _data_value(value)
        fields = getattr(type(value), "__dataclass_fields__", None)
        if type(fields) is dict and not isinstance(value, type) and not _is_mock(value) \
                and getattr(type(value), "_factory_handle_of", None) is None:
            # A dataclass of the test's: a dataclass in the solution's process too (dataclasses.fields, asdict),
            # its public fields copied as it crosses, everything else asked of the test's object.
            params = getattr(type(value), "__dataclass_params__", None)
            names = [name for name, spec in fields.items() if type(name) is str and not name.startswith("_")
                     and getattr(spec, "_field_type", None) is getattr(sys.modules.get("dataclasses"), "_FIELD", 0)]
            return {"tdc": [self.handle_of(value), self.handle_of(type(value)), type(value).__name__,
                            [[name, nested(getattr(value, name))] for name in names[:200]],
                            [bool(getattr(params, flag, False)) for flag in ("eq", "order", "frozen")]]}
        if type(value).__name__ == "Namespace" and type(value).__module__ == "argparse" \
                and type(value) is getattr(sys.modules.get("argparse"), "Namespace", None):
            return {"ns": [[str(name), nested(item)] for name, item in vars(value).items()]}
        return None

    def objects_from(self, tag, body, nested):
        """The solution's value objects, rebuilt with the trusted side's classes from plain fields."""
        if tag == "ann":  # the annotations of a test's function this side described, going home (never others)
            function = self.exported.get(body) if type(body) is int and body in self.described else None
            if type(function) is types.MethodType:
                function = function.__func__
            if type(function) is not types.FunctionType:
                raise WireError("annotations of a function the tests never handed over")
            return function.__annotations__
        if tag == "std":  # a standard library object this side sent by name, going home (never any other)
            try:
                return self.standard[tuple(body)]
            except (KeyError, TypeError):
                raise WireError("a standard library object the tests never handed over") from None
        if tag == "bi":
            if body == "__dict__":  # the solution's builtins namespace (exec() added it to a dict): a copy of
                return dict(builtins.__dict__)  # ours (never this process's own, which a test could then change)
            if body not in _SAFE_BUILTINS and not (isinstance(getattr(builtins, str(body), None), type)
                                                   and issubclass(getattr(builtins, str(body)), Exception)):
                refused = getattr(builtins, str(body), None) if type(body) is str and body.isidentifier() else None
                if isinstance(refused, type) and issubclass(refused, BaseException):
                    # (said, for the test that fails over it: an ``except`` with it is a TypeError here)
                    BoundaryError(f"the solution's builtin {body} cannot cross (an except with it would swallow "
                                  "pytest's outcomes): a token that is no class stands for it")
                    return _SolutionBuiltin(body)
                if callable(refused):
                    return _SolutionBuiltin(body)  # named, never this side's own (exec, open, delattr...)
                raise _RefusedBuiltin(f"builtin {str(body)[:40]!r} cannot cross")
            return getattr(builtins, body)
        if tag == "nt":
            return self.namedtuple(body, nested)
        if tag == "dc":
            return _snapshot(self, body, nested)
        if tag == "tzo":
            return self.zone(body)
        if tag == "bv":
            return _builtin_value(self, body, nested)
        if tag == "ex":  # an exception of the solution's as a value (not raised): its stand-in, as when raised
            if type(body) is not dict:
                raise WireError("malformed exception value")
            made = self.exception({k: v for k, v in body.items() if k != "exit"})
            if isinstance(made, SolutionUnavailable):
                raise WireError("malformed exception value")
            origin = body.get("obj")
            if type(origin) is dict and type(origin.get("h")) is int and type(made) is not SolutionUnavailable \
                    and getattr(type(made), "_factory_key", None) is not None:  # (never the test's own exception)
                made._factory_object = origin["h"]
            return made
        if tag == "nd":
            return _array_from(body)
        if tag == "ns":  # an argparse.Namespace of the solution's (parse_args()): rebuilt here from its fields
            if type(body) is not list or len(body) > 1000 or not all(
                    type(pair) is list and len(pair) == 2 and type(pair[0]) is str for pair in body):
                raise WireError("malformed namespace")
            import argparse

            return argparse.Namespace(**{name: nested(item) for name, item in body})
        if tag == "en":
            if type(body) is not list or len(body) != 4 or type(body[1]) is not str:
                raise WireError("malformed enum member")
            cls = self.proxy(body[0])
            if isinstance(cls, enum.EnumMeta) and getattr(cls, "_factory_key", None) is not None:
                try:
                    return cls[body[1]] if body[1] in cls.__members__ else cls(nested(body[2]))
                except (ValueError, TypeError):  # a value the rebuilt class does not know: the member's handle
                    pass
            return self.proxy(body[3])
        raise WireError(f"the solution cannot send {tag!r}")

    def zone(self, body):
        """A fixed-offset time zone of the solution, one object per solution object (``is`` holds)."""
        if type(body) is not list or len(body) != 4:
            raise WireError("malformed time zone")
        handle, offset, name, dst = body
        try:
            key = int(handle["h"])
        except (KeyError, TypeError, ValueError):
            raise WireError("malformed time zone") from None
        if key not in self.zones:
            def delta(triple):
                if type(triple) is not list or len(triple) != 3 or any(type(x) is not int for x in triple):
                    raise WireError("malformed time zone offset")
                value = datetime.timedelta(days=triple[0], seconds=triple[1], microseconds=triple[2])
                if abs(value) >= datetime.timedelta(days=1):
                    raise WireError("time zone offset out of range")
                return value
            self.zones[key] = _SolutionZone(key, delta(offset), str(name)[:60] if name is not None else None,
                                            delta(dst) if dst is not None else None)
        return self.zones[key]

    def namedtuple(self, body, nested):
        handle, name, fields, values = body
        if type(fields) is not list or len(fields) > 200 or not all(
                type(f) is str and f.isidentifier() and not keyword.iskeyword(f) and not f.startswith("_")
                for f in fields) or len(set(fields)) != len(fields) or type(values) is not list \
                or len(values) != len(fields):
            raise WireError("malformed namedtuple")
        key = (handle.get("h") if type(handle) is dict else None, _safe_name(name, "namedtuple"), tuple(fields))
        cls = self.namedtuples.get(key)
        if cls is None:
            cls = collections.namedtuple(key[1], fields)
            if key[0] is not None:
                cls._factory_key = key[0]
            self.namedtuples[key] = cls
        return cls(*(nested(v) for v in values))

    def handle_of(self, value, grant=True):
        key = _solution_function_key(value, self)
        if key is not None:  # a real function standing for the solution's: the solution's own goes back
            return {"h": key}
        if isinstance(value, BaseException):  # a stand-in of the solution's exception goes home as its object
            key = vars(value).get("_factory_object")
            if type(key) is int:
                return {"h": key}
        handle = getattr(type(value), "_factory_handle_of", None)
        if handle is not None and not isinstance(value, BaseException):  # (a stand-in class's, not its object's)
            return handle(value)
        why = _no_reverse(value)
        if why is not None:
            raise BoundaryError(why)
        key = self.export_ids.get(id(value))
        if key is None:
            key = self.export_ids[id(value)] = len(self.exported) + 1
            self.exported[key] = value
        elif grant:  # a stream the solution had as its sys.stdout, now handed over by the test itself
            self.stream_only.pop(key, None)
        kind = ("class" if isinstance(value, type) else "function" if isinstance(value, types.FunctionType)
                else "callable" if callable(value) else "object")
        handle = {"rh": key, "k": kind, "name": _safe_name(getattr(type(value), "__name__", "object"))}
        if type(value) in _SELF_ITERATORS:
            handle["selfiter"] = True
        if kind == "class" and issubclass(value, Exception) and not any(
                getattr(base, "_factory_key", None) is not None or isinstance(base, RemoteClass)
                for base in value.__mro__):
            # The test's own exception class: the solution gets a stand-in class to raise and catch
            # (``except exceptions:`` with a tuple of them), its bases the test's classes' stand-ins.
            handle["exc"] = _builtin_exception_name(value)
            handle["cname"] = _safe_name(value.__name__, "TestError")
            handle["bases"] = [self.handle_of(base) for base in value.__bases__
                               if getattr(builtins, base.__name__, None) is not base]
        if kind == "class" and "exc" not in handle:
            described = self.class_description(value)
            if described is not None:
                handle["sc"] = described  # a class of the test's own: a real class there (issubclass, mro)
        elif kind in ("object", "callable") and self.class_description(type(value)) is not None:
            handle["cls"] = self.handle_of(type(value))  # its handle there is an object of that class
        if isinstance(value, types.CoroutineType):
            handle["await"] = "coro"  # the solution awaits it (or runs it): it runs here, to its end
        elif kind == "object" and isinstance(value, collections.abc.Awaitable):
            handle["await"] = "obj"
        if kind in ("object", "callable"):
            std = self.standard_bases.get(type(value))
            if std is None:
                std = self.standard_bases[type(value)] = [name for name, base in _STANDARD_BASES
                                                          if isinstance(value, base)]
            if std:
                handle["std"] = std  # the solution's isinstance(x, Mapping / tzinfo / io.TextIOBase) holds
            if kind == "object" and (_defined_by_tests(type(value), "__hash__")
                                     or _defined_by_tests(type(value), "__eq__")):
                handle["eq"] = True  # its own == and hash (a memoizing cache's key), asked here
            lacks = _lacking(type(value)) + (["__call__"] if kind == "object" else [])
            if lacks:
                handle["lacks"] = lacks  # isinstance(x, Sized / Iterator / Iterable) is false there too
        if type(value) is types.FunctionType or (type(value) is types.MethodType
                                                 and type(value.__func__) is types.FunctionType):
            described = self.describe_function(key, value)
            if described is not None:
                handle["fn"] = described
        return handle

    def class_description(self, cls):
        """What the solution builds a stand-in of the test's class ``cls`` from, or None where it gets none (a
        class of the standard library's or a package's, one with a metaclass of its own, or deriving from
        anything but ``object``, the tests' own classes and ``collections.abc``'s): its bases (handles of the
        tests' classes, the ABCs by name), the standard ABCs it is a subclass of (registered there too), the
        protocols its objects lack, its name, qualified name and module. Names and structure only: its
        namespace, methods and data stay here."""
        known = self.class_stands.get(cls, 0)
        if known != 0:
            if known is not None:  # (the ABCs the test registered it with since)
                known["abcs"] = _abcs_of(cls)
            return known
        self.class_stands[cls] = None  # (a cycle through its bases: none)
        module = sys.modules.get(getattr(cls, "__module__", None) or "")
        path = getattr(module, "__file__", None)
        if not isinstance(cls, type) or type(cls) not in (type, abc.ABCMeta) or type(path) is not str \
                or not os.path.realpath(path).startswith(os.path.realpath(self.root) + os.sep) \
                or issubclass(cls, BaseException):
            return None
        bases = []
        for base in cls.__bases__:
            if base is object:
                continue
            if getattr(base, "__module__", None) == "collections.abc" and getattr(collections.abc, base.__name__,
                                                                                   None) is base:
                bases.append({"abc": base.__name__})
            elif self.class_description(base) is not None:
                bases.append(self.handle_of(base))
            else:
                return None
        abcs = _abcs_of(cls)
        lacks = _lacking(cls)
        if not any("__call__" in vars(klass) for klass in cls.__mro__):
            lacks.append("__call__")
        described = {"bases": bases, "abcs": abcs, "std": [name for name, base in _STANDARD_BASES
                                                           if name != "tzinfo" and issubclass(cls, base)],
                     "lacks": lacks, "name": _safe_name(cls.__name__), "qualname": str(cls.__qualname__)[:200],
                     "module": str(cls.__module__)[:200]}
        if any(issubclass(cls, base) for name, base in _STANDARD_BASES if name == "tzinfo"):
            described = None
        self.class_stands[cls] = described
        return described

    def signature_data(self, signature, owner):
        """A signature of a test's callable as ``[name, kind, state, default, annotation text]`` per parameter:
        state 0 no default, 1 a default that crosses (immutable plain data), 2 one that stays here (anything
        else, and every default of a test function ``test*``: the test's own inputs and expected values)."""
        test_function = str(getattr(owner, "__name__", "")).startswith("test")
        params = []
        for param in list(signature.parameters.values())[:255]:
            if param.default is param.empty:
                state, default = 0, None
            elif not test_function and _plain_default(param.default):
                state, default = 1, self.encode(param.default)
            else:
                state, default = 2, None
            params.append([param.name, int(param.kind), state, default, annotation_text(param.annotation)])
        return params

    def describe_function(self, key, function):
        """A test's function as plain data, for the mirror the solution side makes of it (None: no mirror).

        Its signature (names, kinds, defaults that are immutable plain data,
        annotations as text), name, qualname, module, doc and whether it is a
        generator or coroutine function; and its public attributes as they are
        now (what the test set on it: ``f.pattern = ...``). Never its code,
        globals, closure, ``__wrapped__``, pytest's attributes, other defaults,
        nor any default of a test function (``test*``: its defaults are the
        test's inputs and expected values); a default that does not cross stays
        the trusted side's and still applies when the mirror is called without it.
        """
        import inspect

        if key in self.describing:  # (an attribute that holds the function itself)
            return None
        described = self.described.get(key)
        own = getattr(function, "__func__", function)
        try:  # (each time it crosses: a test may set __signature__ or __wrapped__ on it in between)
            signature = inspect.signature(function)
            now = {"params": self.signature_data(signature, own), "ret": annotation_text(signature.return_annotation)}
        except (TypeError, ValueError) as exc:
            if described is None:  # no mirror: a handle, whose signature the solution asks for (and gets this error)
                return None
            now = {"sigerr": type(exc).__name__}
        if described is None:
            flags = ("coro" if inspect.iscoroutinefunction(own) else "gen" if inspect.isgeneratorfunction(own)
                     else "")
            described = {"flags": flags}
            for attribute in ("name", "qualname", "module", "doc"):
                value = getattr(own, f"__{attribute}__", None)
                described[attribute] = value[:20_000] if type(value) is str else None
            if type(function) is types.FunctionType:  # (as the "repr" op answers; a function's runs no test code)
                described["repr"] = repr(function)[:1000]
            self.described[key] = described
        attrs = []
        self.describing.add(key)
        try:
            for name, value in list(vars(getattr(function, "__func__", function)).items())[:100]:
                if type(name) is str and not name.startswith(_HIDDEN_PREFIXES) and _no_reverse(value) is None:
                    try:
                        attrs.append([name, self.encode(value)])
                    except WireError:
                        continue
        finally:
            self.describing.discard(key)
        return {**described, **now, "attrs": attrs}

    def exception(self, info, depth=0):
        if type(info) is not dict:
            return SolutionUnavailable("the solution broke the protocol (malformed exception)")
        token = info.get("token")
        if type(token) is int and token in self.raised:  # the test's own exception, passed through the solution
            return self.raised[token]
        message = str(info.get("message", ""))[:2000]
        code = info.get("exit")
        if type(code) is list and len(code) == 1 and (code[0] is None or type(code[0]) in (bool, int, str)) \
                and _called_by_test():
            # The solution's sys.exit, where the test called it (``pytest.raises(SystemExit)`` around ``main()``):
            # uncaught, pytest fails that test, as in-process. Never raised into pytest's own code (collection,
            # attribute probes), where it would end the run: there it is an Exception.
            value = code[0][:2000] if type(code[0]) is str else code[0]
            return _SolutionExit(value, _exit_ends_script())
        name = str(info.get("type", "Exception"))
        base = getattr(builtins, name, None)
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = Exception
        standard = _standard_exception(info.get("std"))
        if standard is not None:  # pickle.PicklingError, json.JSONDecodeError: the test's own class, caught as such
            base = standard
            info = {**info, "cls": None}
        args = (message,)
        if type(info.get("args")) is list and len(info["args"]) <= 20:  # its own args (``KeyError('k')``, ``e.args``)
            try:
                args = tuple(self.decode(a) for a in info["args"])
            except WireError:
                args = (message,)
        try:
            made = base(*args)
        except (TypeError, ValueError):  # (UnicodeDecodeError and the like want exact arguments)
            made = base(message)
        if info.get("cls") is not None:
            try:
                cls = self.proxy(info["cls"])
            except WireError:
                cls = None
            if isinstance(cls, type) and issubclass(cls, BaseException) and isinstance(cls, RemoteClass):
                try:
                    made = type.__call__(cls, *args)
                except (TypeError, ValueError):
                    made = type.__call__(cls, message)
                made._factory_message = message
            elif isinstance(cls, type) and issubclass(cls, Exception) and type(info["cls"]) is dict \
                    and "rh" in info["cls"]:  # the test's own exception class, raised by the solution
                try:
                    made = cls(*args)
                except Exception:  # noqa: BLE001 -- a class whose constructor wants other arguments
                    pass
        if info.get("suppress") is True:  # raised ``from None`` (or with its context suppressed) there
            made.__suppress_context__ = True
        cause = info.get("cause")
        if type(cause) is dict and depth < _CAUSE_DEPTH:  # ``raise ... from exc`` there: a traceback names it
            cause = self.exception(cause, depth + 1)
            if isinstance(cause, BaseException) and not isinstance(cause, SolutionUnavailable) \
                    and cause is not made:
                made.__cause__ = cause
        attrs = info.get("attrs")
        for pair in attrs[:50] if type(attrs) is list else ():
            # its public attributes (``exc.errors``), as values or handles: never a name of the exception machinery
            if type(pair) is list and len(pair) == 2 and type(pair[0]) is str and pair[0].isidentifier() \
                    and not pair[0].startswith("_") and pair[0] not in ("args", "with_traceback", "add_note"):
                try:
                    setattr(made, pair[0], self.decode(pair[1]))
                except (WireError, AttributeError, TypeError):
                    continue
        return made

    # ------------------------------------------------------------ the solution's requests

    def serve_one(self, request):
        self.served += 1  # (what the solution's call got from the test: see exchange_checked)
        refs = Refs()
        try:
            result = self.reverse(request, refs)
            if request.get("op") in ("getattr", "getitem") and type(result) in _LIVE_BASES:
                # a container inside the test's object (a defaultdict's list): the solution changes this one
                reply = {"ok": self.handle_of(result)}
            elif request.get("op") == "call" and type(result) in _LIVE_BASES and id(result) not in refs.index \
                    and id(result) not in self.shared.keys and self.shared.room(result):
                # a test's function returning its container (a cache getter): the solution may write into it
                reply = {"ok": self.shared.share(result, lambda item: self.encode(item, refs))}
            else:
                reply = {"ok": self.encode(result, refs)}
        except BoundaryError as exc:
            self.pending = self.pending or exc
            reply = {"exc": {"type": "TypeError", "message": f"boundary: {exc}"}}
        except Exception as exc:
            if isinstance(exc, AssertionError):
                # The test's own assertion failed (in a callback, or in a test function a decorator of the solution
                # runs): the test fails, whatever the solution does with it.
                self.pending = self.pending or exc
            reply = {"exc": self.exception_info(exc)}
        except BaseException as exc:  # pytest.fail/skip, SolutionUnavailable: the test's verdict, never swallowed
            self.pending = self.pending or exc
            reply = {"exc": {"type": "Exception", "message": "the test stopped"}}
        ahead = request.get("ahead")
        if request.get("op") == "next" and "ok" in reply and type(ahead) is int:
            try:
                reply["more"] = self.clone_ahead(request["rh"], self.exported[request["rh"]], min(ahead, 4096) - 1)
            except Exception:  # noqa: BLE001 -- no items ahead; the one asked for is answered
                pass
        if refs.objects:
            try:
                reply["wb"] = states_of(refs, getattr(refs, "before", []), lambda item: self.encode(item, refs))
            except BaseException as exc:
                self.pending = self.pending or BoundaryError(f"an argument could not be written back ({exc})")
        return reply

    def unserved(self, request, exc):
        """A request of the solution's that failed here while read (:meth:`Endpoint.exchange` answers it as an
        error): the running test fails with it, whatever the solution does with the error."""
        failure = BoundaryError(str(exc)) if isinstance(exc, WireError) else exc
        self.pending = self.pending or failure
        return {"exc": {"type": "TypeError", "message": f"boundary: {exc}"[:2000]}}

    def exception_info(self, exc):
        """The test's exception ``exc`` as the solution gets it (raised into it, or thrown into its context manager):
        its builtin base's name, message and a token that brings this very object back should it return; a class
        of the test's as a handle (a stand-in there). An assertion's message is never sent: pytest names the
        expected value in it (the solution could learn it and run the test again)."""
        token = len(self.raised) + 1
        self.raised[token] = exc
        message = "an assertion of the test failed" if isinstance(exc, AssertionError) else str(exc)[:2000]
        info = {"type": _builtin_exception_name(type(exc)), "message": message, "token": token}
        standard = _standard_exception([type(exc).__module__, type(exc).__qualname__]) is type(exc)
        if getattr(builtins, type(exc).__name__, None) is not type(exc) and not standard:
            try:
                cls = self.handle_of(type(exc))
            except BaseException:  # noqa: BLE001 -- crosses as its builtin base
                cls = None
            if cls is not None and "exc" in cls:
                info["cls"] = cls
        if standard:
            info["std"] = [type(exc).__module__, type(exc).__qualname__]  # (pickle.PicklingError)
        elif isinstance(type(exc), RemoteClass):  # a stand-in of the solution's class: that class there
            info["cls"] = type(exc)._factory_handle_of()
            try:
                info["args"] = [self.encode(a) for a in exc.args[:20]]
            except BaseException:  # noqa: BLE001 -- args that cannot cross: the message stands for them
                pass
        return info

    def test_global(self, module_name, name):
        """A global of a module of the tests' that is an object of the solution's, which the solution holds anyway
        (toolz pickles a curried test class by name: ``test_serialization.GlobalCurried``, its own curry object).
        Any other global (the test's values, functions and classes) is missing to it, and so is every name of a
        module that is not the tests' (a file of this workspace)."""
        module = sys.modules.get(module_name) if type(module_name) is str else None
        file = getattr(module, "__file__", None) if type(module) is types.ModuleType else None
        value = vars(module).get(name) if type(file) is str and type(name) is str and not name.startswith("_") \
            and os.path.realpath(file).startswith(os.path.join(os.path.realpath(self.root), "")) else None
        if isinstance(value, (RemoteObject, RemoteModule)) or _solution_function_key(value, self) is not None or (
                isinstance(value, RemoteClass) and not type.__getattribute__(value, "_factory_mixed")):  # (no test's)
            return value
        raise AttributeError(f"module {str(module_name)[:100]!r} has no attribute {str(name)[:100]!r} of the "
                             "solution's")

    def reverse(self, request, refs):
        """One operation of the solution on an object of the test it was handed."""
        op = request.get("op")
        if op == "unpickle":  # a test's object the solution pickled: loaded from this side's own bytes, by token
            token = request.get("token")
            if type(token) is not int or not 0 <= token < len(self.pickled):
                raise WireError("unknown pickle token")
            import pickle

            return pickle.loads(self.pickled[token])
        if op == "testglobal":
            return self.test_global(request.get("module"), request.get("name"))
        try:
            target = self.exported[request["rh"]]
        except (KeyError, TypeError):
            raise WireError("unknown handle") from None
        reading = self.stream_only.get(request["rh"])
        if reading is not None and not (op in ("bool", "repr", "str") or (reading and op in ("iter", "next")) or (
                op == "getattr" and request.get("name") in (_STDIN_API if reading else _STREAM_API))):
            raise AttributeError(f"the test's stream is the solution's to {'read' if reading else 'write'}, not to "
                                 f"{'read ' + str(request.get('name'))[:40] if op == 'getattr' else str(op)[:20]}")
        if op == "pickle":  # (the solution pickling an object that holds it): kept here, the solution gets a token
            import pickle

            self.pickled.append(pickle.dumps(target, protocol=pickle.HIGHEST_PROTOCOL))
            return len(self.pickled) - 1
        if op == "call":
            if type(request.get("a")) is not list or type(request.get("k")) is not list:
                raise WireError("malformed call")
            args = [self.decode(a, refs) for a in request["a"]]
            kwargs = {str(k): self.decode(v, refs) for k, v in request["k"]}
            refs.before = container_states(refs, lambda item: self.encode(item, refs))
            if target is _RUN["watch"] and _RUN["watch"] is not None:
                return _run_watched(target, args, kwargs)
            if self.exiting is not None and isinstance(getattr(target, "__self__", None), types.GeneratorType) \
                    and getattr(target, "__name__", None) == "throw" and any(a is self.exiting[0] for a in args):
                # The block's exception thrown into a generator of the test's (its own context manager, made by
                # a ``contextmanager`` of the solution's): if the test's code does not raise it on, the test
                # caught it there itself (``except etype: pass``), whatever the block still held.
                try:
                    result = target(*args, **kwargs)
                except StopIteration:
                    self.exiting[1] = True
                    raise
                self.exiting[1] = True
                return result
            return target(*args, **kwargs)
        if op == "getattr":
            name = request.get("name")
            if type(name) is not str:
                raise WireError("malformed attribute name")
            if name in _NAME_DUNDERS:
                value = getattr(target, name, None)
                if type(value) is not str:
                    raise AttributeError(name)
                return value
            if name == "__dict__" and isinstance(target, type):
                # A class's namespace (``decorator(Future)`` copies it onto the decorator): its public names only,
                # read-only as a class's is; what a public attribute read would reach, never a private name's
                namespace = type.__dict__["__dict__"].__get__(target, type)  # (never a metaclass's __dict__)
                return types.MappingProxyType({
                    key: value for key, value in list(namespace.items())[:1000]
                    if type(key) is str and not key.startswith(_HIDDEN_PREFIXES) and _no_reverse(value) is None})
            functions = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
            if name.startswith(_HIDDEN_PREFIXES) or isinstance(target, functions) \
                    or (_is_mock(target) and name in _MOCK_WRITERS):
                raise AttributeError(f"{name} of the test's object is not the solution's to read")
            return getattr(target, name)
        if op == "signature":  # inspect.signature of the test's callable, computed here, as plain data
            import inspect

            if isinstance(target, type):
                own = getattr(target, "__signature__", None)
                if own is not None and not isinstance(own, inspect.Signature) and hasattr(type(own), "__get__"):
                    # A class's ``__signature__`` property (toolz's AddX): ``cls.__signature__`` is the descriptor,
                    # which the solution gets as a stand-in (never the test's getter)
                    return "descriptor"
            signature = inspect.signature(target)  # (its TypeError or ValueError is the solution's answer)
            return [self.signature_data(signature, getattr(target, "__func__", target)),
                    annotation_text(signature.return_annotation)]
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "hash":  # the test's own __hash__ (an unhashable object raises TypeError, as in-process)
            value = hash(target)
            return value
        if op == "eq":
            return bool(target == self.decode(request.get("v")))
        if op == "len":
            return len(target)
        if op == "bool":
            return bool(target)
        if op == "contains":
            return self.decode(request.get("v")) in target
        if op == "getitem":
            return target[self.decode(request.get("key"))]
        if op in ("setitem", "delitem"):
            # a mapping or sequence of the test the solution fills (a defaultdict, a Counter, a deque)
            # or an object of the test's own class that defines the item method (toolz's CustomMapping)
            if _is_mock(target) or not (isinstance(
                    target, (collections.abc.MutableMapping, collections.abc.MutableSequence, *_LIVE_BASES))
                    or _defined_by_tests(type(target), f"__{op}__")):
                raise TypeError(f"the test's {type(target).__name__} does not take items from the solution")
            key = self.decode(request.get("key"))
            if op == "delitem":
                del target[key]
            else:
                target[key] = self.decode(request.get("v"))
            return None
        if op == "await":  # an awaitable of the test's the solution awaits: run here, to its end
            return _run_to_end(target)
        if op == "close" and isinstance(target, types.CoroutineType):
            return target.close()
        if op == "enter":
            return type(target).__enter__(target)
        if op == "exit":
            if request.get("failed"):
                return type(target).__exit__(target, Exception, Exception("the solution's code raised"), None)
            return type(target).__exit__(target, None, None, None)
        if op == "repr":
            return repr(target)
        if op == "str":
            return str(target)
        raise AttributeError(f"operation {str(op)[:40]!r} on the test's object is not the solution's to make")

    # -------------------------------------------------------------- proxies

    def proxy(self, data):
        if "rh" in data:
            try:
                return self.exported[data["rh"]]
            except (KeyError, TypeError):
                raise WireError("unknown handle of the test's") from None
        try:
            key = int(data["h"])
        except (KeyError, TypeError, ValueError):
            raise WireError("malformed handle") from None
        kind = data.get("k")
        if key not in self.made and key not in self.tainted and key not in self.fed:  # (first seen here)
            if self.decoding_free is not None:
                self.data_free[key] = self.decoding_free
            if self.decoding_parent is not None:
                self.parents[key] = self.decoding_parent
        (self.made if self.decoding_made else self.tainted).add(key)
        if kind == "live" and data.get("type") in _LIVE_TYPES:  # fresh contents each time it crosses
            return _LIVE_TYPES[data["type"]]._factory_make(self, key, self.decode(data.get("v")))
        if key in self.proxies:
            return self.proxies[key]
        name = _safe_name(data.get("name") or data.get("type") or "object")
        if kind == "module":
            made = RemoteModule(str(data.get("name", name))[:200], self, key, bool(data.get("package")))
            if type(data.get("doc")) is str:  # its docstring, as the solution states it (``__doc__`` stays local)
                object.__setattr__(made, "__doc__", data["doc"][:20_000])
        elif kind == "class":
            made = None
            if type(data.get("members")) is dict:
                made = _remote_enum(self, key, name, data["members"])
                if made is None:  # an enum this side could not rebuild: its members never decide a comparison
                    self.unrebuilt.add(key)
            if made is None:
                made = _remote_class(self, key, name, data.get("exc"), data.get("bases") or [])
                if type(data.get("doc")) is str:  # the class's docstring, as the solution states it
                    type.__setattr__(made, "__doc__", data["doc"][:20_000])
        else:
            mixed = self.proxies.get(data.get("mixed")) if type(data.get("mixed")) is int else None
            if isinstance(mixed, RemoteClass) and issubclass(mixed, _MixedObject):  # an object of a test's class
                made = mixed._factory_new(self, key, _safe_name(data.get("type"), "object"), kind == "callable")
            elif data.get("zone") is True and kind == "object":  # a tzinfo of the solution's: one here too
                made = _RemoteZone(self, key)
            elif kind == "object" and data.get("await") in ("coro", "obj"):  # awaited there, to its end
                made = (_RemoteCoroutine if data["await"] == "coro" else _RemoteAwaitable)(
                    self, key, _safe_name(data.get("type"), "object"))
            elif kind == "callable" and data.get("bind") is True:
                made = _RemoteFunction(self, key, _safe_name(data.get("type"), "object"), callable_=True)
                function = _solution_function(self, made, data.get("fn")) if type(data.get("fn")) is dict else None
                if function is not None:  # a plain function of a module: a real function here (forwarding)
                    self.function_keys[id(function)] = key
                    made = function
            else:
                kinds = (_RemoteCallableDescriptor, _RemoteDescriptor) if data.get("get") is True else (
                    _RemoteCallable, RemoteObject)
                made = kinds[0 if kind == "callable" else 1](
                    self, key, _safe_name(data.get("type"), "object"), callable_=kind == "callable")
                if data.get("selfiter") is True:
                    self.self_iterators.add(key)
                if data.get("nolen") is True:
                    self.lenless.add(key)
        self.proxies[key] = made
        return made

    def adopt(self, live):
        """A solution module's list a test reads (``from pkg import FORMATS``) as a real list (``type(x) is
        list``), shared from now on: one object each side, the changes either makes synced with the messages
        and written in place (see ``Shared``), under the key ``-handle`` (never one the trusted side counts). A
        few only, within the shared limits, holding immutable plain data when adopted; else the live proxy.
        Lists only: a dict or set would hash the solution's objects the solution later puts in it while a
        message is read (each hash a request: calls nested past the limit)."""
        key = live._factory_key
        if key in self.adopted:
            return self.adopted[key]
        if len(self.adopted) >= _ADOPTED_LIMIT or not self.shared.room(live) or -key in self.shared.objects:
            return live
        if not all(_plain_default(item) for item in list.__iter__(live)):
            # (plain data only: a registry of the solution's functions or classes stays a live proxy)
            return live
        made = list.copy(live)  # (the base's copy: the same items, nothing refreshed)
        self.shared.add(made, -key)
        self.adopted[key] = made
        self.adopting.append(key)
        return made

    def call(self, key, args, kwargs, made=False):
        refs = Refs()
        message = {"op": "call", "h": {"h": key}, "a": [self.encode(a, refs, True) for a in args],
                   "k": [[str(k), self.encode(v, refs, True)] for k, v in kwargs.items()]}
        frame, outer = None, None
        if self.depth == 0:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename in _OWN_FILES:
                frame = frame.f_back
            # ``list(solution.gen(n))``: the iterator it returns is consumed whole at once, so its items may
            # come with it (only a builtin iterator, produced by the solution's own: see run_whole there).
            outer = _consumed_whole_call(frame) if frame is not None else None
            if outer is not None:
                message["whole"] = _WHOLE_MOST
        # (a module's function or an object made from none of the test's values, never sent one, given none)
        free = key not in self.fed and (key in self.members or key in self.data_free) and all(
            _carries_no_values(v, self) for v in (*args, *kwargs.values()))
        value = self.exchange_checked(message, refs, made, maker=key if free else None)
        if frame is not None and isinstance(value, RemoteObject):  # (its proxy's class: no request)
            key = object.__getattribute__(value, "_key")
            self.made_at = (frame, frame.f_lasti, key)  # the test's call that got it, for _whole_consumer
            more = self.last_reply.get("rest") if outer is not None and type(self.last_reply) is dict else None
            if type(more) is list and 0 < len(more) < _WHOLE_MOST and all(
                    type(entry) is dict and len(entry) == 1 and _ITEM_TAGS.issuperset(entry) for entry in more):
                self.rest[key] = collections.deque(more)
                self.whole[key] = (frame, outer)
        return value




#: Modules whose calls into the solution are pytest's and the import system's, never a test's.
_NOT_TESTS = ("_pytest", "pytest", "pluggy", "importlib", "inspect", "doctest", "typing", "unittest.mock")

#: Requests that read an object of the solution and build nothing in it (a test's value they carry is one the
#: solution may only answer about: a comparison's, which it may only decline, or ``in``'s).
_READING_OPS = frozenset({"repr", "str", "hash", "bool", "len", "compare", "signature", "code", "dir", "isinstance",
                          "issubclass", "owndict", "snapshot", "bvalue", "iter", "next", "contains", "copy",
                          "pickle"})


def _handle_keys(data, found, depth=0):
    """The keys of the solution's objects a message (its tagged form) names, added to ``found``."""
    if depth > MAX_DEPTH:
        return
    if type(data) is dict:
        if type(data.get("h")) is int:
            found.append(data["h"])
        for value in data.values():
            if type(value) in (dict, list):
                _handle_keys(value, found, depth + 1)
    elif type(data) is list:
        for value in data:
            if type(value) in (dict, list):
                _handle_keys(value, found, depth + 1)


def _carries_no_values(value, client):
    """Whether ``value``, an argument of a test's call into the solution, holds none of the test's values (see
    :func:`_decide`): an object of the solution made from none, a builtin function or class, a bare ``object()``,
    or a function of the test's that holds no value: no constants but ``None`` and its docstring, no defaults, free
    variables, attributes or annotations, and no name of its module's globals (``def f(a): return a``)."""
    if isinstance(value, RemoteObject):
        key = object.__getattribute__(value, "_key")
        return key in client.data_free or key in client.members
    kind = type(value)
    if kind is object:
        return True
    if kind is types.BuiltinFunctionType or kind is type:
        return getattr(builtins, getattr(value, "__name__", ""), None) is value
    if kind is not types.FunctionType:
        return False
    key = _solution_function_key(value, client)
    if key is not None:
        return key in client.data_free or key in client.members
    code = value.__code__
    return (value.__closure__ is None and not value.__defaults__ and not value.__kwdefaults__
            and not value.__dict__ and not value.__annotations__
            and all(const is None or (index == 0 and type(const) is str and const == value.__doc__)
                    for index, const in enumerate(code.co_consts))
            and not any(name in value.__globals__ for name in code.co_names))


class _SolutionExit(SystemExit):
    """The solution's ``sys.exit`` in a trusted process: the tests that catch it (``assertRaises``, ``except
    SystemExit``, ``pytest.raises``) read its code as it is. Where it escapes to the top of the process it ends
    it with that code only if the script was written to end there (see :func:`_exit_ends_script`: ``python -c
    "import cli; cli.main()"``, a console script's ``sys.exit(main())``); otherwise (a check script's ``assert
    area(2, 3) == 6``, a unittest run's ``setUpClass``) the interpreter, reading the code as the process ends,
    gets 1: the solution's exit must not skip the checks after it."""

    def __init__(self, code, final):
        super().__init__(code)
        self._factory_code, self._factory_final = code, final

    @property
    def code(self):
        try:
            sys._getframe(1)
        except ValueError:  # no Python frame left: the interpreter ending the process with it
            if not self._factory_final:
                try:
                    os.write(2, b"factory: the solution's sys.exit ended the test process before its checks ran: "
                                b"exit status 1\n")
                except OSError:
                    pass
                return 1
        return self._factory_code


def _exit_call(node):
    """Whether ``node`` is a call of ``sys.exit``, ``exit``, ``os._exit`` or ``quit``."""
    import ast

    if not isinstance(node, ast.Call):
        return False
    function = node.func
    return (function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)) in (
        "exit", "_exit", "quit")


def _is_exit_statement(node):
    """Whether ``node`` may follow the statement running when the solution exits, for the exit to end the script
    as written: ``pass``, ``sys.exit(rc)``, ``raise SystemExit(rc)`` with names or constants only (never a check
    such as ``sys.exit(rc != 6)``)."""
    import ast

    def simple(call):
        return not call.keywords and all(isinstance(arg, (ast.Constant, ast.Name)) for arg in call.args)

    if isinstance(node, ast.Pass):
        return True
    if isinstance(node, ast.Expr) and _exit_call(node.value):
        return simple(node.value)
    if isinstance(node, ast.Raise) and node.exc is not None:
        return isinstance(node.exc, ast.Name) or (isinstance(node.exc, ast.Call) and simple(node.exc))
    return False


def _final_in(body, line, span):
    """Whether the statement of ``body`` running ``line`` is the block's last (but exits) and the call with
    ``span`` (line, end line, column, end column) is what it evaluates last: a bare call, ``sys.exit(call)``,
    ``return call``, ``raise SystemExit(call)``, ``rc = call`` (never inside an ``assert``, a comparison, a
    condition or a loop)."""
    import ast

    start = (span[0], span[2]) if None not in span else (line, 0)
    for index, statement in enumerate(body):  # (statements on one line too: ``import cli; cli.main()``)
        if not (statement.lineno, statement.col_offset) <= start <= (statement.end_lineno or statement.lineno,
                                                                       statement.end_col_offset or 0):
            continue
        if not all(_is_exit_statement(rest) for rest in body[index + 1:]):
            return False
        blocks = []
        if isinstance(statement, ast.If):
            blocks = [statement.body, statement.orelse]
        elif isinstance(statement, (ast.With, ast.AsyncWith)):
            blocks = [statement.body]
        elif isinstance(statement, ast.Try):
            blocks = [statement.body, statement.orelse, statement.finalbody, *[h.body for h in statement.handlers]]
        if blocks:
            for block in blocks:
                if block and (block[0].lineno, block[0].col_offset) <= start <= (
                        block[-1].end_lineno or block[-1].lineno, block[-1].end_col_offset or 0):
                    return _final_in(block, line, span)
            return False  # the statement's own header (a condition, a context manager)
        value = getattr(statement, "value", None) if isinstance(
            statement, (ast.Expr, ast.Return, ast.Assign, ast.AnnAssign)) else None
        if isinstance(statement, ast.Raise):
            value = statement.exc
        if _exit_call(value) and value.args:
            value = value.args[0]  # sys.exit(main()), raise SystemExit(main())
        if isinstance(statement, ast.Raise) and isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        return isinstance(value, ast.Call) and span == (value.lineno, value.end_lineno, value.col_offset,
                                                         value.end_col_offset)
    return False


def _main_source(code):
    """The source of ``__main__``'s code: its file, or the ``-c`` command."""
    if code.co_filename == "<string>":
        argv = list(getattr(sys, "orig_argv", ()))
        return argv[argv.index("-c") + 1] if "-c" in argv[:-1] else None
    try:
        with open(code.co_filename, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, ValueError):
        return None


def _exit_ends_script():
    """Whether the solution's exit, raised in the call now in progress, ends the process where its script was
    written to end: every frame of the tests' code on the stack is ``__main__``'s (runpy's below it) and stands
    at a final call (:func:`_final_in`)."""
    import ast

    frame = sys._getframe(1)
    while frame is not None and frame.f_globals is globals():
        frame = frame.f_back
    seen = False
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name != "__main__":
            if not (type(name) is str and name.startswith(("runpy", "importlib"))):
                return False
            frame = frame.f_back
            continue
        code = frame.f_code
        try:
            source = _main_source(code)
            tree = ast.parse(source) if source is not None else None
            span = list(code.co_positions())[frame.f_lasti // 2]
        except (AttributeError, IndexError, SyntaxError, ValueError):
            return False
        if tree is None:
            return False
        if code.co_name == "<module>":
            body = tree.body
        else:
            body = next((node.body for node in ast.walk(tree) if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name and (
                node.decorator_list[0].lineno if node.decorator_list else node.lineno) == code.co_firstlineno), None)
        if body is None or not _final_in(body, frame.f_lineno, tuple(span)):
            return False
        seen = True
        frame = frame.f_back
    return seen


_WITH_SOURCES = {}  # file name -> its parsed source (or None), for _ends_its_block


def _raised_at(frame, exc):
    """The line of ``frame`` that ``exc`` came through and the span (line, end line, column, end column) of the
    expression that raised it there (None if it did not come through ``frame``)."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame is frame:
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    try:
        span = tuple(list(frame.f_code.co_positions())[found.tb_lasti // 2])
    except (IndexError, ValueError):
        span = (None,) * 4
    return found.tb_lineno, span


def _ends_its_block(frame, line, span):
    """Whether the exception leaving the ``with`` block that ``frame`` (the caller of ``__exit__``) runs, raised
    at ``line`` by the expression at ``span``, came from the block's last step, so that suppressing it skips
    nothing the block would have done (``with suppress(KeyError): d["k"]``; never an ``assert`` whose check it
    would skip). See :func:`_last_in`."""
    import ast
    import linecache

    filename = frame.f_code.co_filename
    if filename not in _WITH_SOURCES or filename.startswith("<"):
        try:
            _WITH_SOURCES[filename] = ast.parse("".join(linecache.getlines(filename, frame.f_globals)))
        except (SyntaxError, ValueError, TypeError):
            _WITH_SOURCES[filename] = None
    tree = _WITH_SOURCES[filename]
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.body and frame.f_lineno in (
                node.lineno, *[item.context_expr.lineno for item in node.items]) \
                and (getattr(node.body[0], "decorator_list", None) or node.body)[0].lineno <= line \
                <= (node.body[-1].end_lineno or 0):
            return _last_in(node.body, line, span)
    return False


def _last_in(body, line, span):
    """Whether ``line`` is in the last statement of ``body`` and ``span`` is what that statement evaluates last:
    a ``raise``, a definition's decorators, or the whole value of an expression statement, assignment or
    ``return`` (``int("x")``, ``d[key]``; never a call inside an argument, whose caller would be skipped,
    nor an ``assert``); in a statement that holds blocks, the last statement of the block that ran (never its
    header: a loop's, condition's or context manager's)."""
    import ast

    statement = body[-1]
    decorators = getattr(statement, "decorator_list", None)
    if not (decorators[0] if decorators else statement).lineno <= line <= (statement.end_lineno or statement.lineno):
        return False
    blocks = [getattr(statement, name, None) for name in ("body", "orelse", "finalbody")]
    blocks = [block for block in blocks if isinstance(block, list) and block and isinstance(block[0], ast.stmt)]
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Raise)):
        return True
    if blocks:
        for block in blocks:
            if block[0].lineno <= line <= (block[-1].end_lineno or block[-1].lineno):
                return _last_in(block, line, span)
        return False
    if isinstance(statement, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)):
        value = statement.value
        return value is not None and span == (value.lineno, value.end_lineno, value.col_offset,
                                              value.end_col_offset)
    return not isinstance(statement, ast.Assert)


def _called_by_test():
    """Whether the call into the solution now in progress was made by the tests' own code (the first frame
    outside this runner's)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals is globals():
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return type(name) is str and not name.startswith(_NOT_TESTS)


#: Libraries whose data objects a test hands the solution as values (arrays, frames), not handles.
_DATA_LIBRARIES = ("numpy", "pandas")
#: What a pickled data object may name (the solution's process rebuilds it; nothing of the tests' modules).
_DATA_MODULES = frozenset({"numpy", "pandas", "builtins", "copyreg", "_codecs", "datetime", "decimal", "fractions",
                           "collections", "zoneinfo", "pytz", "dateutil"})
#: The numpy dtypes the solution's arrays and scalars may have: booleans, numbers, fixed-width text and bytes.
_ARRAY_DTYPE = re.compile(r"^[<>|=]?(b1|[iu][1248]|f(2|4|8|12|16)|c(8|16|24|32)|[US][0-9]{1,6})$")


def _data_value(value):
    """A test's numpy array or scalar (``{"nd": ...}``: dtype, shape, raw bytes) or other numpy/pandas object
    (``{"pk": ...}``: pickled, naming only the data libraries' and the standard library's classes) as a value for
    the solution's process; None (a handle) when it holds anything else."""
    import base64
    import pickle
    import pickletools

    numpy = sys.modules.get("numpy")
    if numpy is not None and (type(value) is numpy.ndarray or (
            isinstance(value, numpy.generic) and type(value).__module__ == "numpy")):
        dtype = value.dtype
        if dtype.fields is None and not dtype.hasobject and dtype.subdtype is None \
                and _ARRAY_DTYPE.match(dtype.str):
            raw = numpy.ascontiguousarray(value).tobytes() if type(value) is numpy.ndarray else value.tobytes()
            return {"nd": [dtype.str, list(value.shape) if type(value) is numpy.ndarray else None,
                           base64.b64encode(raw).decode("ascii")]}
    try:
        data = pickle.dumps(value, protocol=2)  # (protocol 2: every class it names is in a GLOBAL opcode)
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID") or (
                    opcode.name == "GLOBAL" and str(arg).split(" ")[0].split(".")[0] not in _DATA_MODULES):
                return None
    except Exception:
        return None
    return {"pk": base64.b64encode(data).decode("ascii")}


def _array_from(body):
    """A numpy array or scalar of the solution's, rebuilt here from its dtype, shape and bytes (numbers, booleans
    and fixed-width text only: nothing here runs code or unpickles)."""
    import base64

    if type(body) is not list or len(body) != 3 or type(body[0]) is not str or not _ARRAY_DTYPE.match(body[0]) \
            or type(body[2]) is not str:
        raise WireError("malformed array")
    shape = body[1]
    if shape is not None and (type(shape) is not list or len(shape) > 32 or any(
            type(n) is not int or n < 0 for n in shape)):
        raise WireError("malformed array shape")
    try:
        import numpy
    except ImportError:
        raise WireError("an array, and no numpy here to rebuild it") from None
    dtype = numpy.dtype(body[0])
    raw = base64.b64decode(body[2].encode("ascii"), validate=True)
    count = 1
    for n in shape or ():
        count *= n
    if len(raw) != count * dtype.itemsize or (shape is None and count != 1):
        raise WireError("array bytes do not match its shape")
    data = numpy.frombuffer(raw, dtype=dtype)
    return data[0] if shape is None else data.reshape(shape).copy()


def _builtin_exception_name(cls):
    for base in cls.__mro__:
        if getattr(builtins, base.__name__, None) is base and issubclass(base, Exception):
            return base.__name__
    return "Exception"


class _SolutionZone(datetime.tzinfo):
    """A time zone object of the solution with a fixed offset: its offset, name and DST as it answered them;
    passed back, it is the solution's own object again."""

    def __init__(self, key, offset, name, dst):
        self._factory_key, self._offset, self._name, self._dst = key, offset, name, dst

    def _factory_handle_of(self):
        return {"h": self._factory_key}

    def utcoffset(self, dt):
        return self._offset

    def dst(self, dt):
        return self._dst

    def tzname(self, dt):
        return self._name

    def __repr__(self):
        # The solution's own repr, as a string (tests assert on it); our description if it cannot give one.
        client = _CLIENT["client"]
        try:
            text = client.request("repr", h=self._factory_handle_of()) if client is not None else None
        except BaseException:
            text = None
        return text if type(text) is str else f"<solution time zone {self._name or self._offset}>"

    def __reduce_ex__(self, protocol):
        return _pickled_by_solution(self._factory_key, protocol)


class _RemoteZone(datetime.tzinfo):
    """A time zone object of the solution whose offset depends on the moment (``isodate.LOCAL``): a ``tzinfo``
    here, so ``datetime(..., tzinfo=zone)`` takes it, each ``utcoffset``/``dst``/``tzname``/``fromutc`` answered
    by the object in the solution's process (a datetime carrying it is compared with the solution's offsets, as
    in-process); passed back, it is the solution's own object again."""

    __slots__ = ("_factory_client", "_factory_key")

    def __init__(self, client, key):
        self._factory_client, self._factory_key = client, key

    def _factory_handle_of(self):
        return {"h": self._factory_key}

    def _factory_method(self, name, *args):
        client = self._factory_client
        return client.exchange_checked({"op": "callmethod", "h": {"h": self._factory_key}, "name": name,
                                        "a": [client.encode(a) for a in args]}, None)

    def _factory_checked(self, name, dt, allowed):
        value = self._factory_method(name, dt)
        if not isinstance(value, allowed):
            raise BoundaryError(f"the solution's time zone answered {name}() with a {type(value).__name__}")
        return value

    def utcoffset(self, dt):
        return self._factory_checked("utcoffset", dt, (datetime.timedelta, type(None)))

    def dst(self, dt):
        return self._factory_checked("dst", dt, (datetime.timedelta, type(None)))

    def tzname(self, dt):
        return self._factory_checked("tzname", dt, (str, type(None)))

    def fromutc(self, dt):
        if not isinstance(dt, datetime.datetime) or dt.tzinfo is not self:
            raise ValueError("fromutc: dt.tzinfo is not self")
        return self._factory_checked("fromutc", dt, datetime.datetime)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _probe(lambda: self._factory_client.request("getattr", h={"h": self._factory_key}, name=name), name)

    def __repr__(self):
        try:
            text = self._factory_client.request("repr", h={"h": self._factory_key})
        except BaseException:
            text = None
        return text if type(text) is str else f"<solution time zone #{self._factory_key}>"

    def __reduce_ex__(self, protocol):
        return _pickled_by_solution(self._factory_key, protocol)


def _pickled_by_solution(key, protocol):
    """The reduction of the solution's object ``key``: its own pickle of itself, loaded again there."""
    client = _CLIENT["client"]
    if client is None:
        raise BoundaryError("an object of the solution can only be pickled while its tests run")
    data = client.request("pickle", h={"h": key}, protocol=int(protocol))
    if type(data) is not bytes:
        raise BoundaryError(f"the solution pickled its object #{key} as a {type(data).__name__}")
    return _solution_unpickle, (data,)


class _Snapshot:
    """A dataclass instance of the solution, by value: its compared fields, as they were when it crossed.

    Equality, ordering and hashing are computed here from the fields (the
    dataclass's generated semantics: same class, equal field tuples); every
    other attribute and method goes to the object in the solution's process.
    """

    __slots__ = ("_factory_client", "_factory_key", "_factory_class", "_factory_fields", "_factory_flags",
                 "__weakref__")

    def _factory_handle_of(self):
        return {"h": object.__getattribute__(self, "_factory_key")}

    def _factory_values(self):
        return tuple(value for _, value in object.__getattribute__(self, "_factory_fields"))

    def _factory_same(self, other):
        same = type(other) is type(self) and object.__getattribute__(other, "_factory_class") == \
            object.__getattribute__(self, "_factory_class")
        if same and not object.__getattribute__(self, "_factory_fields") \
                and object.__getattribute__(self, "_factory_key") != object.__getattribute__(other, "_factory_key"):
            # Two objects with no field to compare: every pair is "equal" (every field ``compare=False``, or a
            # solution that made its server report none). A verdict cannot rest on that.
            raise BoundaryError(f"two {type(self).__name__} objects of the solution were compared, and the "
                                "solution says they have no field to compare (every field compare=False?): "
                                "their equality would be vacuous, so it is refused")
        return same

    def __eq__(self, other):
        if not isinstance(other, _Snapshot):
            return NotImplemented
        return self._factory_same(other) and self._factory_values() == other._factory_values()

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def _factory_order(self, other, compare):
        if not object.__getattribute__(self, "_factory_flags")[0] or not self._factory_same(other):
            return NotImplemented
        return compare(self._factory_values(), other._factory_values())

    def __lt__(self, other):
        return self._factory_order(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._factory_order(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._factory_order(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._factory_order(other, lambda a, b: a >= b)

    def __hash__(self):
        if not object.__getattribute__(self, "_factory_flags")[1]:
            raise TypeError(f"unhashable type: '{type(self).__name__}'")
        return hash(self._factory_values())

    def __repr__(self):
        fields = ", ".join(f"{name}={value!r}" for name, value in object.__getattribute__(self, "_factory_fields"))
        return f"{type(self).__name__}({fields})"

    def _factory_remote(self):
        client = object.__getattribute__(self, "_factory_client")
        return _RemoteCallable(client, object.__getattribute__(self, "_factory_key"), type(self).__name__)

    def __getattr__(self, name):
        for field_name, value in object.__getattribute__(self, "_factory_fields"):
            if field_name == name:
                return value
        return getattr(self._factory_remote(), name)

    def __setattr__(self, name, value):
        setattr(self._factory_remote(), name, value)
        fields = object.__getattribute__(self, "_factory_fields")
        object.__setattr__(self, "_factory_fields", tuple((n, value if n == name else v) for n, v in fields))

    def __call__(self, *args, **kwargs):
        return self._factory_remote()(*args, **kwargs)

    def __iter__(self):
        return iter(self._factory_remote())

    def __len__(self):
        return len(self._factory_remote())


def _snapshot(client, body, nested):
    """A :class:`_Snapshot` from the solution's ``[object, class, name, fields, order, frozen]``."""
    if type(body) is not list or len(body) != 6 or type(body[3]) is not list or len(body[3]) > 500:
        raise WireError("malformed dataclass value")
    origin, cls_handle, name, fields, order, frozen = body
    try:
        key, cls_key = int(origin["h"]), int(cls_handle["h"])
    except (KeyError, TypeError, ValueError):
        raise WireError("malformed dataclass value") from None
    names = []
    for pair in fields:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or not pair[0].isidentifier():
            raise WireError("malformed dataclass field")
        names.append(pair[0])
    if len(set(names)) != len(names):
        raise WireError("malformed dataclass fields")
    cls = client.snapshot_classes.get(cls_key)
    if cls is None:
        cls = type(_safe_name(name, "SolutionValue"), (_Snapshot,), {"__slots__": ()})
        client.snapshot_classes[cls_key] = cls
    snapshot = object.__new__(cls)
    object.__setattr__(snapshot, "_factory_client", client)
    object.__setattr__(snapshot, "_factory_key", key)
    object.__setattr__(snapshot, "_factory_class", cls_key)
    object.__setattr__(snapshot, "_factory_fields", tuple((n, nested(v)) for n, (_, v) in zip(names, fields)))
    object.__setattr__(snapshot, "_factory_flags", (order is True, frozen is True))
    return snapshot


def _remote_enum(client, key, name, members):
    """The solution's enum class rebuilt here, its members' values as plain data (None if it cannot be)."""
    base = {"intflag": enum.IntFlag, "flag": enum.Flag, "int": enum.IntEnum}.get(members.get("base"), enum.Enum)
    entries = members.get("list")
    if type(entries) is not list:
        return None
    try:
        pairs = [(str(entry[0]), client.decode(entry[1])) for entry in entries[:1000]]
        if not all(p[0].isidentifier() and not p[0].startswith("_") for p in pairs):
            return None
        cls = enum.Enum(name, pairs, type=str) if members.get("base") == "str" else base(name, pairs)
    except BaseException:  # values that cannot be compared or hashed here: the class stays a handle
        return None
    if any(cls[name].name != name for name in cls.__members__):
        # Aliases (members of equal value are one member): the values are the solution's word, so a solution
        # could list every member with one value and make RED == GREEN here. The class stays a handle.
        return None
    cls._factory_key = key
    cls._factory_handle_of = lambda self_or_cls=None: {"h": key}
    return cls


class _Live:
    """Mixin for a list, dict, set or bytearray of the solution's state (a module's registry, an object's
    items): the real type here, its contents refreshed from the solution before each read that follows a
    call, and its changes made there."""

    _factory_base = None
    _READERS = ()
    _WRITERS = ()

    @classmethod
    def _factory_make(cls, client, key, contents):
        made = client.proxies.get(key)
        if type(made) is not cls:
            made = cls.__new__(cls)
            object.__setattr__(made, "_factory_client", client)
            object.__setattr__(made, "_factory_key", key)
            client.proxies[key] = made
        made._factory_fill(contents)
        return made

    def _factory_handle_of(self):
        return {"h": self._factory_key}

    def _factory_fill(self, contents):
        base = type(self)._factory_base
        if type(contents) is not base:
            raise WireError(f"a live {base.__name__} snapshot of another type")
        if base in (dict, set):
            base.clear(self)
            base.update(self, contents)
        else:
            base.__setitem__(self, slice(None), contents)
        object.__setattr__(self, "_factory_epoch", self._factory_client.epoch)

    def _factory_refresh(self):
        client = self._factory_client
        if getattr(self, "_factory_epoch", None) != client.epoch:
            self._factory_fill(client.request("snapshot", h=self._factory_handle_of()))

    def _factory_forward(self, name, args):
        client = self._factory_client
        result = client.exchange_checked({"op": "callmethod", "h": self._factory_handle_of(), "name": name,
                                          "a": [client.encode(a) for a in args]}, None)
        self._factory_refresh()
        return result


#: Methods of the mutable builtins that change the object: run in the solution's process.
_CONTAINER_WRITERS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                                "__setitem__", "__delitem__", "add", "discard", "update", "setdefault", "popitem",
                                "difference_update", "intersection_update", "symmetric_difference_update",
                                "__iadd__", "__ior__", "__iand__", "__isub__", "__ixor__", "__imul__"})


def _refreshing(base, name):
    """``base``'s method ``name`` for a proxy of a solution container: it reads the contents the solution holds now."""
    own = getattr(base, name)

    def method(self, *args, **kwargs):
        self._factory_refresh()
        return own(self, *args, **kwargs)
    method.__name__ = name
    return method


def _live_class(base):
    namespace = {"_factory_base": base}

    def writer(name):
        def write(self, *args):
            return self._factory_forward(name, args)
        write.__name__ = name
        return write

    readers = {"__len__", "__iter__", "__contains__", "__getitem__", "__eq__", "__ne__", "__repr__", "__bool__",
               "__lt__", "__le__", "__gt__", "__ge__", "__reversed__", "count", "index", "copy", "get", "keys",
               "values", "items", "issubset", "issuperset", "isdisjoint", "union", "intersection", "difference",
               "symmetric_difference", "__or__", "__and__", "__sub__", "__xor__", "__add__", "__mul__", "decode",
               "hex", "startswith", "endswith", "find"}
    for name in readers:
        if hasattr(base, name):
            namespace[name] = _refreshing(base, name)

    def __repr__(self):  # as the solution's own container prints
        self._factory_refresh()
        return repr(base(self))
    namespace["__repr__"] = __repr__
    for name in _CONTAINER_WRITERS:
        if hasattr(base, name):
            namespace[name] = writer(name)
    namespace["__hash__"] = None
    return type(f"Live{base.__name__.capitalize()}", (_Live, base), namespace)


_LIVE_TYPES = {base.__name__: _live_class(base) for base in (list, dict, set, bytearray)}
#: How many of a solution's module containers become real ones here (SolutionClient.adopt): the rest of the
#: shared room stays the test's containers'.
_ADOPTED_LIMIT = 16

#: The builtin values an object of a subclass of a builtin crosses as (see _builtin_value).
_VALUE_TYPES = {"str": str, "int": int, "float": float, "bytes": bytes, "tuple": tuple, "frozenset": frozenset,
                "list": list, "dict": dict, "set": set, "odict": collections.OrderedDict,
                "counter": collections.Counter}
_MUTABLE_VALUES = frozenset({"list", "dict", "set", "odict", "counter"})
_VALUE_WRITERS = _CONTAINER_WRITERS | {"move_to_end", "subtract"}
_VALUE_COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
#: Operators and protocols a subclass may add to its builtin: its own, run in the solution's process.
_VALUE_OPERATORS = frozenset({f"__{p}{n}__" for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow",
                                                       "matmul", "and", "or", "xor", "lshift", "rshift")
                              for p in ("", "r", "i")} | {"__neg__", "__pos__", "__abs__", "__invert__",
                                                          "__call__", "__enter__", "__exit__", "__divmod__",
                                                          "__rdivmod__", "__round__", "__trunc__", "__floor__",
                                                          "__ceil__"})
#: Never the solution's, never rewrapped: comparison and hash stay the builtin's, the rest is the proxy's own.
_VALUE_KEPT = frozenset({*_VALUE_COMPARISONS, "__hash__", "__new__", "__init__", "__getattribute__", "__getattr__",
                         "__setattr__", "__delattr__", "__class__", "__reduce__", "__reduce_ex__", "__getstate__",
                         "__setstate__", "__init_subclass__", "__subclasshook__", "__sizeof__", "__dir__",
                         "__getnewargs__", "__class_getitem__", "__doc__", "__module__", "__dict__", "__weakref__",
                         "__slots__", "__copy__", "__deepcopy__", "__format__", "__bool__", "fromkeys",
                         "maketrans"})


class _BuiltinValue:
    """Mixin for an object of a solution class deriving from a builtin value type (a ``dict`` subclass such as
    a config section, a ``str`` or ``tuple`` subclass): here it *is* that builtin, holding the value the
    solution's object holds, so ``==``, ``<``, ``hash``, ``isinstance(x, dict)`` are the builtin's, computed
    here on plain data, whatever the class overrides (a subclass cannot forge equality). The methods the class
    defines itself, and every change to a mutable one, run on the object in the solution's process; the
    contents of a mutable one are refreshed from there before each read that follows a call.
    """

    def _factory_handle_of(self):
        return {"h": self._factory_key}

    def _factory_remote(self):
        return _RemoteCallable(self._factory_client, self._factory_key, type(self).__name__)

    def _factory_call(self, name, args, kwargs):
        client = self._factory_client
        if not kwargs:  # one round trip; an item read (``section["a"]``) comes back live, as the object's own
            return client.exchange_checked({"op": "callmethod", "h": self._factory_handle_of(), "name": name,
                                            "a": [client.encode(a) for a in args]}, None)
        method = self._factory_remote()._op("getattr", name=name)
        return method(*args, **kwargs)

    def _factory_refresh(self):
        if type(self)._factory_kind in _MUTABLE_VALUES and self._factory_epoch != self._factory_client.epoch:
            contents = self._factory_client.request("bvalue", h=self._factory_handle_of())
            self._factory_fill(contents)

    def _factory_fill(self, contents):
        base = type(self)._factory_base
        if type(contents) is not (dict if issubclass(base, dict) else base):
            raise WireError(f"a {base.__name__} value of another type")
        if base is collections.OrderedDict:
            collections.OrderedDict.clear(self)
            for key, value in contents.items():
                collections.OrderedDict.__setitem__(self, key, value)
        elif issubclass(base, dict):
            dict.clear(self)
            dict.update(self, contents)
        elif base is set:
            set.clear(self)
            set.update(self, contents)
        elif base is list:
            list.__setitem__(self, slice(None), contents)
        object.__setattr__(self, "_factory_epoch", self._factory_client.epoch)

    @property
    def __class__(self):  # ``x.__class__ is pkg.Section`` in a test: the solution's class (see RemoteObject)
        if not _by_test(sys._getframe(1)):
            return type(self)
        cls = self._factory_remote()._op("getattr", name="__class__")
        return cls if isinstance(cls, type) else type(self)

    def __getattr__(self, name):
        if name.startswith("_factory") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._factory_remote(), name)

    def __setattr__(self, name, value):
        setattr(self._factory_remote(), name, value)

    def __delattr__(self, name):
        delattr(self._factory_remote(), name)

    def __reduce_ex__(self, protocol):  # (pickle, copy) the solution pickles its own object, as RemoteObject
        return _pickled_by_solution(self._factory_key, protocol)


#: A proxy's own attributes (``_factory_key``...), where its ``__dict__`` property does not reach.
_PROXY_DICT = _BuiltinValue.__dict__["__dict__"]


def _value_dict(self):
    """``x.__dict__`` / ``vars(x)`` in a test: the solution object's own attributes (a class caching its hash
    there); elsewhere the proxy's own."""
    if not _by_test(sys._getframe(1)):
        return _PROXY_DICT.__get__(self)
    return self._factory_remote()._op("getattr", name="__dict__")


def _value_hash(base):
    """``hash()`` of an object whose class overrides ``__hash__``: the builtin's, computed here, after the
    solution's own ran on its object (what it keeps there, a cached hash, is as in-process; its answer is not
    used: a subclass cannot steer a lookup here)."""
    own = base.__hash__

    def __hash__(self):
        self._factory_call("__hash__", (), {})
        return own(self)
    return __hash__


def _value_class(base, kind, name, overridden):
    """The proxy class for one solution class deriving from ``base`` (see :class:`_BuiltinValue`)."""
    mutable = kind in _MUTABLE_VALUES
    namespace = {"_factory_base": base, "_factory_kind": kind, "__module__": "solution"}

    def forward(method_name):
        def method(self, *args, **kwargs):
            return self._factory_call(method_name, args, kwargs)
        method.__name__ = method_name
        return method

    def comparison(method_name):
        own = getattr(base, method_name)

        def method(self, other):
            self._factory_refresh()
            if isinstance(other, _BuiltinValue):
                other._factory_refresh()
            return own(self, other)
        method.__name__ = method_name
        return method

    for method_name in dir(base):
        if method_name in _VALUE_KEPT or not callable(getattr(base, method_name, None)):
            continue
        if method_name in overridden or (mutable and method_name in _VALUE_WRITERS):
            namespace[method_name] = forward(method_name)
        elif mutable:
            namespace[method_name] = _refreshing(base, method_name)
    for method_name in overridden & _VALUE_OPERATORS:  # operators the builtin lacks (a tuple's __radd__)
        namespace.setdefault(method_name, forward(method_name))
    if mutable:
        for method_name in _VALUE_COMPARISONS:
            namespace[method_name] = comparison(method_name)
        namespace["__hash__"] = None
    elif "__hash__" in overridden:
        namespace["__hash__"] = _value_hash(base)
    namespace["__dict__"] = property(_value_dict)
    for method_name in ("__repr__", "__str__"):
        if method_name in overridden:
            def text(self, _name=method_name):
                result = self._factory_call(_name, (), {})
                if type(result) is not str:
                    raise BoundaryError(f"the solution's {type(self).__name__}.{_name} answered with a "
                                        f"{type(result).__name__}")
                return result
            namespace[method_name] = text
    return type(name, (_BuiltinValue, base), namespace)


def _builtin_value(client, body, nested):
    """An object of a solution class deriving from a builtin value type, from ``[object, class, name, builtin,
    value, names the class defines]``: one proxy per solution object (``is`` holds), its value refreshed."""
    if type(body) is not list or len(body) != 6 or body[3] not in _VALUE_TYPES or type(body[5]) is not list:
        raise WireError("malformed builtin value")
    origin, cls_handle, name, kind, data, names = body
    try:
        key, cls_key = int(origin["h"]), int(cls_handle["h"])
    except (KeyError, TypeError, ValueError):
        raise WireError("malformed builtin value") from None
    base = _VALUE_TYPES[kind]
    contents = nested(data)
    if type(contents) is not (dict if issubclass(base, dict) else base):
        raise WireError(f"a {kind} value of another type")
    cls = client.value_classes.get((cls_key, kind))
    if cls is None:
        overridden = frozenset(n for n in names[:500] if type(n) is str)
        cls = client.value_classes[(cls_key, kind)] = _value_class(base, kind, _safe_name(name, kind), overridden)
    made = client.proxies.get(key)
    if type(made) is cls:
        if kind in _MUTABLE_VALUES:
            made._factory_fill(contents)
        return made
    made = cls.__new__(cls) if kind in _MUTABLE_VALUES else cls.__new__(cls, contents)
    object.__setattr__(made, "_factory_client", client)
    object.__setattr__(made, "_factory_key", key)
    if kind in _MUTABLE_VALUES:
        made._factory_fill(contents)
    client.proxies[key] = made
    return made


def _probe(read, name):
    """An attribute read of a handle. When pytest's own code probes one (collecting fixtures and tests,
    reporting) and the solution cannot answer, the probe sees a missing attribute: an error there would
    crash pytest, which a solution must never be able to cause. Tests themselves still get the error."""
    try:
        return read()
    except (SolutionUnavailable, BoundaryError):
        caller = sys._getframe(2).f_globals.get("__name__", "")
        if caller.startswith(("_pytest", "pluggy", "inspect")):
            raise AttributeError(name) from None
        raise


#: Modules whose reads of a solution module's attributes are not the test naming a class (collection, probes,
#: introspection walks, this runner itself).
_MACHINERY = frozenset({"_pytest", "pytest", "pluggy", "inspect", "doctest", "pydoc", "importlib", "typing",
                        "unittest", "__main__", "factory", "dataclasses", "pickle", "copy", "copyreg", "functools",
                        "abc", "enum"})


def _by_test(frame):
    """Whether ``frame`` (the code reading an attribute or a class) is the tests' own code."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    # (whole module names: a test module called copy_test or enum_cases is the tests' own)
    return type(name) is str and name.split(".")[0] not in _MACHINERY


#: Test node id -> how many comparisons and hashes the solution's own methods decided while it ran.
_DECIDED = {}
_COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _class_named(client, obj):
    """Whether the class of the solution's object ``obj`` is one the tests name (asked once per object)."""
    key = object.__getattribute__(obj, "_key")
    if key not in client.class_of:
        try:
            cls = obj._op("getattr", name="__class__")
        except (AttributeError, TypeError):
            cls = None
        client.class_of[key] = cls._factory_key if isinstance(cls, RemoteClass) else None
    return client.class_of[key] in client.named and client.class_of[key] not in client.unrebuilt


def _decide(self, other, name):
    """``self <op> other`` decided by the method of ``self``'s class in the solution's process, where the test
    relies on that class's semantics; otherwise refused.

    Allowed only when ``self``'s class is one the tests name (``from pkg import Version``) and either ``other``
    is another object of a class the tests name, or ``self`` was built by the test itself (a call of the class or
    of one of its class's callables, ``Version.parse``) and never handed over by anything else. So a function's
    result compared with the test's own expected value (``add(2, 3) == 5``) is never the solution's word, even
    when its class is one the test names. The answer must be a bool (or NotImplemented: Python then asks the
    other operand, as in-process); each one decided is counted in the report.
    """
    client = object.__getattribute__(self, "_client")
    key = object.__getattribute__(self, "_key")
    symbol = _COMPARISONS[name]
    if not _class_named(client, self):
        # Objects made from none of the test's values (compose(f, g) == compose(f, g)): between two the same
        # callable made, the solution's word, as for a class the tests name; against a value of the test's
        # (``== AlwaysEquals()``), it may only decline. Anything else is refused.
        maker = client.data_free.get(key)
        if maker is None or (isinstance(other, RemoteObject)
                             and client.data_free.get(object.__getattribute__(other, "_key")) != maker):
            raise BoundaryError(f"{self._factory_describe()} is an object of the solution whose class the tests do "
                                f"not name (or an enum this side could not rebuild): comparing it ({symbol}) would run "
                                "the solution's own comparison, so it is refused (only two objects one callable made "
                                "from none of the test's values may be); the solution must return plain data")
        undecided_only = not isinstance(other, RemoteObject)
    else:
        if isinstance(other, RemoteObject) and not _class_named(client, other):
            raise BoundaryError(f"{other._factory_describe()} is an object of the solution whose class the tests "
                                f"do not name (or an enum this side could not rebuild): comparing it ({symbol}) would "
                                "run the solution's own comparison, so it is refused; the solution must return plain "
                                "data")
        # An object the test did not build, against the test's own value: its class may only decline
        # (NotImplemented, and Python asks the test's value) or raise (semver's ValueError, the TypeError of an
        # unordered pair), neither of which is the solution's word on the expected value; a bool is refused.
        # So does one of a class named like a function (``add``, ``to_roman``): a solution that turned the
        # starter's function into a class would have ``add(2, 3)`` "built by the test" (the starter's own check,
        # function_made_class, needs a starter; this one does not).
        cls = client.proxies.get(client.class_of.get(key))
        undecided_only = not isinstance(other, RemoteObject) and (
            key not in client.made or key in client.tainted or not str(getattr(cls, "__name__", ""))[:1].isupper())
    answer = self._op("compare", name=name, v=client.encode(other))
    if type(answer) is not list or len(answer) > 1 or (answer and type(answer[0]) is not bool):
        shown = type(answer[0]).__name__ if type(answer) is list and answer else type(answer).__name__
        raise BoundaryError(f"{self._factory_describe()}: its comparison ({symbol}) answered with a {shown}, not a "
                            "bool")
    if answer and undecided_only:
        raise BoundaryError(f"{self._factory_describe()} was not built by the test calling a class it names "
                            "(CapWords, as classes are named): compared "
                            f"({symbol}) with the test's own {type(other).__name__}, the solution's comparison would "
                            "decide the test's expected value, so it is refused; the solution must return plain data")
    if not answer:  # declined: Python asks the other operand, nothing was decided here
        return NotImplemented
    _DECIDED[_NAN["current"]] = _DECIDED.get(_NAN["current"], 0) + 1
    return answer[0]


def _test_asks_isfunction(frame):
    """Whether ``frame`` is ``inspect.isfunction`` called (directly or through ``inspect.getmembers``) by a test's
    own code; pytest, doctest and this runner keep seeing a handle, which has no code or globals to read."""
    if frame is None or frame.f_code.co_name != "isfunction" or frame.f_globals.get("__name__") != "inspect":
        return False
    while frame is not None and frame.f_globals.get("__name__") == "inspect":
        frame = frame.f_back
    return _by_test(frame)


def _asked_by_pytest():
    """Whether pytest's machinery (not a test) is asking, through ``inspect``, for a signature."""
    frame = sys._getframe(2)
    for _ in range(40):
        if frame is None:
            return False
        module = frame.f_globals.get("__name__", "")
        if type(module) is not str or module.startswith(("_pytest", "pytest", "pluggy")):
            return True
        if module not in ("inspect", "functools", "__main__", __name__):
            return False
        frame = frame.f_back
    return True


def _remote_code(remote):
    """A code object standing for a solution function's: our own empty body, with the function's generator,
    and coroutine flags, file name, name, first line, local names and argument counts as the solution states
    them (what ``inspect.iscoroutinefunction``, ``isgeneratorfunction`` and a test reading ``co_filename`` or
    ``co_varnames`` use). Never for pytest, which keeps seeing a handle that has no code."""
    if _asked_by_pytest():
        raise AttributeError("__code__")
    try:
        flags, filename, name, line, *more = remote._op("code")
        template = (lambda: None).__code__
        made = template.replace(co_flags=(template.co_flags & ~0x3A0) | (int(flags) & 0x3A0),
                                co_filename=str(filename)[:500], co_name=str(name)[:200] or "<solution>",
                                co_firstlineno=max(1, int(line)))
        names = more[0] if len(more) == 2 and type(more[0]) is list and len(more[0]) <= 255 else None
        if names is not None and all(type(n) is str and n.isidentifier() for n in names) \
                and len(set(names)) == len(names) and type(more[1]) is list and len(more[1]) == 4 \
                and all(type(n) is int for n in more[1]):
            # Its argument counts and local names, as data (a test reading co_varnames). Checked to describe a
            # frame the names fill (the arguments, *args and **kw among them): the code object is made here.
            argcount, posonly, kwonly, star = more[1]
            star &= 0x0C
            if 0 <= posonly <= argcount and kwonly >= 0 and argcount + kwonly + bin(star).count("1") <= len(names):
                try:
                    made = made.replace(co_varnames=tuple(names), co_nlocals=len(names), co_argcount=argcount,
                                        co_posonlyargcount=posonly, co_kwonlyargcount=kwonly,
                                        co_flags=made.co_flags | star)
                except (TypeError, ValueError):  # (an interpreter that checks more: the counts are left out)
                    pass
        return made
    except (SolutionUnavailable, BoundaryError, AttributeError, TypeError, ValueError):
        raise AttributeError("__code__") from None


def _remote_signature(remote):
    """``inspect.signature`` of a callable of the solution, rebuilt here from plain data (names, kinds,
    defaults as they cross, annotations as text).

    Never for pytest itself: it decides which fixtures a test receives from its signature, and that stays the
    test's own function's (through ``__wrapped__``), never what the solution declares.
    """
    import inspect

    if _asked_by_pytest():
        raise AttributeError("__signature__")
    try:
        described = remote._op("signature")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"no signature found for {remote._factory_describe()}: {exc}") from None
    except (SolutionUnavailable, BoundaryError, AttributeError):
        raise AttributeError("__signature__") from None
    try:
        params, returns = described
        empty = inspect.Parameter.empty
        parameters = [inspect.Parameter(
            str(name), inspect._ParameterKind(kind), default=default if has_default is True else empty,
            annotation=annotation_of(annotation, empty))
            for name, kind, has_default, default, annotation in params[:255]]
        return inspect.Signature(parameters, return_annotation=annotation_of(returns, inspect.Signature.empty))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the solution described a malformed signature for {remote._factory_describe()}: "
                         f"{str(exc)[:200]}") from None


def _comparison(name):
    def method(self, other):
        return _decide(self, other, name)
    method.__name__ = f"__{name}__"
    return method


#: Dunder attributes of the solution's objects a test may read (names and a function's metadata: what comes back is
#: plain data or handles, read here as data). None steers Python's or pytest's machinery (``__source__``: the text
#: of a function ``decorator.FunctionMaker`` generated, which only a test reads); a protocol dunder never is one.
_DATA_DUNDERS = frozenset({"__name__", "__doc__", "__qualname__", "__module__", "__annotations__", "__defaults__",
                           "__kwdefaults__", "__version__", "__all__", "__source__"})


class _Forwarded(str):
    """``__doc__`` and ``__module__`` of :class:`RemoteObject`: the class's own text, and on a handle the
    solution object's (as data; a class attribute would otherwise answer for every handle)."""

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        name = self.__dict__["attribute"]
        return _probe(lambda: obj._op("getattr", name=name), name)


def _forwarded(text, attribute):
    made = _Forwarded(text)
    made.__dict__["attribute"] = attribute
    return made


#: Builtins that consume an iterable to its end in their own C code, running none of the test's between its
#: items: ``list(solution.gen(n))`` asks the solution for its items in batches, produced by the real iterator
#: (:meth:`SolutionClient.next_item`, "whole"). Value: the argument counts taken, and the iterable's position.
#: The solution ends a batch after an item that is not plain data, so what the consumer does with an item that
#: could ask the solution (hash, compare, add a handle) happens after as many steps as in-process.
_WHOLE_CONSUMERS = {builtins.list: ((1,), 0), builtins.tuple: ((1,), 0), builtins.sorted: ((1,), 0),
                    builtins.set: ((1,), 0), builtins.frozenset: ((1,), 0), builtins.sum: ((1,), 0),
                    builtins.min: ((1,), 0), builtins.max: ((1,), 0), functools.reduce: ((2, 3), 1)}
#: Functions such a consumer may be given besides the iterable (``reduce(operator.mul, factor(n), 1)``).
_PURE_OPERATORS = tuple(getattr(operator, n) for n in ("add", "mul", "sub", "and_", "or_", "xor", "concat", "truediv",
                                                        "floordiv", "mod", "pow", "lshift", "rshift", "matmul"))
_NAME_LOADS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_CLASSDEREF"})
_STACK_11 = {**dict.fromkeys(("LOAD_FAST", "LOAD_CONST", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLOSURE", "PUSH_NULL",
                              "LOAD_CLASSDEREF"), (0, 1)),
             **dict.fromkeys(("LOAD_ATTR", "GET_ITER", "UNARY_NOT", "UNARY_NEGATIVE", "UNARY_INVERT",
                              "UNARY_POSITIVE"), (1, 1)),
             **dict.fromkeys(("BINARY_OP", "COMPARE_OP", "BINARY_SUBSCR", "IS_OP", "CONTAINS_OP"), (2, 1)),
             **dict.fromkeys(("PRECALL", "KW_NAMES", "NOP", "CACHE", "EXTENDED_ARG"), (0, 0)),
             "LOAD_METHOD": (1, 2)}
_CONSUMER_SITES = {}  # (code, offset) -> what the call there is made of, or None (see _consumer_site)


def _stack_counts(instruction):
    """``(popped, pushed)`` of a CPython 3.11 instruction that may make up a call's arguments, or None."""
    name, arg = instruction.opname, instruction.arg or 0
    if name == "LOAD_GLOBAL":
        return 0, 1 + (arg & 1)
    if name == "CALL":
        return arg + 2, 1
    if name in ("BUILD_TUPLE", "BUILD_LIST", "BUILD_SET", "BUILD_STRING", "BUILD_SLICE"):
        return arg, 1
    if name == "BUILD_MAP":
        return 2 * arg, 1
    if name == "FORMAT_VALUE":
        return 1 + (arg & 4 == 4), 1
    return _STACK_11.get(name)


def _consumer_site(code, offset):
    """The call at ``offset`` of ``code`` as ``(callable, [arguments])``, each ``(opname, argval, offset, object)``
    of the one instruction that pushed it (``object``: for a method load, the instruction that pushed what it was
    read from); None where it is not a plain positional call made of straight-line code."""
    key = (code, offset)
    if key in _CONSUMER_SITES:
        return _CONSUMER_SITES[key]
    import dis

    site = None
    try:
        instructions = list(dis.get_instructions(code))
        index = next(i for i, ins in enumerate(instructions) if ins.offset == offset)
        if instructions[index].opname == "PRECALL" and index + 1 < len(instructions):
            index += 1  # (a specialized PRECALL of a builtin class makes the call itself: the frame stands there)
        call = instructions[index]
        if call.opname == "CALL" and index >= 2 and instructions[index - 1].opname == "PRECALL" \
                and instructions[index - 2].opname != "KW_NAMES" and 1 <= call.arg <= 3:
            argc = call.arg
            wanted = {argc: "callable", **{argc - 1 - j: j for j in range(argc)}}  # depth -> what
            found, position = {}, index - 2
            while wanted and position >= 0 and index - position < 80:
                ins = instructions[position]
                counts = _stack_counts(ins)
                if counts is None:
                    break
                popped, pushed = counts
                moved = {}
                for depth, what in wanted.items():
                    if depth < pushed:
                        found[what] = position
                    else:
                        moved[depth - pushed + popped] = what
                wanted = moved
                position -= 1
            if not wanted and not any(ins.is_jump_target for ins in instructions[found["callable"] + 1:index + 1]):
                def described(position):
                    ins = instructions[position]
                    held = instructions[position - 1] if ins.opname == "LOAD_METHOD" and position else None
                    return (ins.opname, ins.argval, ins.offset,
                            (held.opname, held.argval) if held is not None and held.opname in _NAME_LOADS else None)

                site = (described(found["callable"]), [described(found[j]) for j in range(argc)])
    except Exception:  # noqa: BLE001 -- bytecode this reading does not know: no batches
        site = None
    if len(_CONSUMER_SITES) < 4096:
        _CONSUMER_SITES[key] = site
    return site


def _loaded(frame, opname, name):
    """The value a name load of ``frame`` gives now (reading no object's attributes), or ``_MISSING``."""
    if opname == "LOAD_GLOBAL":
        return frame.f_globals.get(name, frame.f_builtins.get(name, _MISSING))
    if opname == "LOAD_NAME":
        for namespace in (frame.f_locals, frame.f_globals, frame.f_builtins):
            if type(namespace) is dict and name in namespace:
                return namespace[name]
        return _MISSING
    namespace = frame.f_locals
    return namespace.get(name, _MISSING) if type(namespace) is dict else _MISSING


def _whole_consumer(frame, obj, client, lasti=None, inner=None):
    """Whether ``frame`` is at a call of a :data:`_WHOLE_CONSUMERS` builtin whose iterable is ``obj`` (a handle of
    the solution's: the variable holding it, or the call into the solution that returned it just before).

    With ``lasti`` and ``inner``: whether the call at ``lasti`` is one whose iterable is what the call at offset
    ``inner`` returns (asked while that call is made, ``obj`` None).
    """
    if _CONSUMER_SITE_READER is None or frame is None:
        return False
    site = _consumer_site(frame.f_code, frame.f_lasti if lasti is None else lasti)
    if site is None:
        return False
    (opname, name, _, held), arguments = site
    if opname in _NAME_LOADS:
        consumer = _loaded(frame, opname, name)
    elif opname == "LOAD_METHOD" and held is not None:
        module = _loaded(frame, *held)
        consumer = vars(module).get(name, _MISSING) if type(module) is types.ModuleType else _MISSING
    else:
        return False
    spec = next((spec for known, spec in _WHOLE_CONSUMERS.items() if consumer is known), None)
    if spec is None or len(arguments) not in spec[0]:
        return False
    for position, (opname, name, offset, _) in enumerate(arguments):
        if position == spec[1]:
            if inner is not None:
                if opname != "CALL" or offset != inner:
                    return False
            elif opname == "CALL":
                made = client.made_at
                if made is None or made[0] is not frame or made[1] not in (offset, offset - 4) \
                        or made[2] != object.__getattribute__(obj, "_key"):
                    return False
            elif opname not in _NAME_LOADS or _loaded(frame, opname, name) is not obj:
                return False
            continue
        value = name if opname == "LOAD_CONST" else _loaded(frame, opname, name) if opname in _NAME_LOADS \
            else _MISSING
        if not (type(value) in (int, float, str, bytes, bool, type(None))
                or any(value is pure for pure in _PURE_OPERATORS)):
            return False
    return True


def _consumed_whole_call(frame):
    """The offset of the call of a :data:`_WHOLE_CONSUMERS` builtin that takes what the test's call in progress
    at ``frame`` returns as its iterable (``list(solution.gen(n))``), or None."""
    if _CONSUMER_SITE_READER is None:
        return None
    code, lasti = frame.f_code, frame.f_lasti
    try:
        instructions = _INSTRUCTIONS.get(code)
        if instructions is None:
            import dis

            listed = list(dis.get_instructions(code))
            instructions = (listed, {ins.offset: index for index, ins in enumerate(listed)})
            if len(_INSTRUCTIONS) < 4096:
                _INSTRUCTIONS[code] = instructions
        listed, index = instructions[0], instructions[1].get(lasti)
        if index is not None and listed[index].opname == "PRECALL":
            index += 1
        if index is None or listed[index].opname != "CALL" or index + 2 >= len(listed) \
                or listed[index + 1].opname != "PRECALL" or listed[index + 2].opname != "CALL":
            return None
        outer = listed[index + 2].offset
    except Exception:  # noqa: BLE001 -- bytecode this reading does not know: no batch
        return None
    return outer if _whole_consumer(frame, None, None, lasti=outer, inner=listed[index].offset) else None


_INSTRUCTIONS = {}  # code -> (its instructions, offset -> index)
#: Only CPython 3.11's bytecode is read (see _stack_counts); elsewhere iterators are never consumed whole.
_CONSUMER_SITE_READER = _consumer_site if sys.version_info[:2] == (3, 11) else None
#: Where this runner's frames (and its generated mirrors of the solution's functions) come from.
_OWN_FILES = frozenset({_consumer_site.__code__.co_filename, "<a solution's function>"})


class RemoteObject:
    """A handle on an object that lives in the solution's process."""

    __slots__ = ("_client", "_key", "_type", "_callable", "__weakref__")

    def __init__(self, client, key, type_name, callable_=False):
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_callable", callable_)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_forwarded" in globals():
            cls.__doc__ = _forwarded(cls.__doc__ or "", "__doc__")
            cls.__module__ = _forwarded(cls.__module__, "__module__")

    def _factory_handle_of(self):
        return {"h": object.__getattribute__(self, "_key")}

    def _op(self, op, **fields):
        return object.__getattribute__(self, "_client").request(op, h=self._factory_handle_of(), **fields)

    def _factory_wrapped(self):
        """The test's own function this object of the solution wraps (``__wrapped__``), or None."""
        try:
            value = self._op("getattr", name="__wrapped__")
        except BaseException:  # pytest asks while collecting: no answer is no wrapped function
            return None
        return value if isinstance(value, types.FunctionType) else None

    def _factory_describe(self):
        kind = "function" if object.__getattribute__(self, "_callable") else "object"
        return f"<solution {kind} {object.__getattribute__(self, '_type')} #{object.__getattribute__(self, '_key')}>"

    def __repr__(self):
        # The solution's own repr, as a string (tests assert on it); our description if it cannot give one.
        try:
            result = self._op("repr")
        except BaseException:
            return self._factory_describe()
        return result if type(result) is str else self._factory_describe()

    def __getattr__(self, name):
        if name in ("__dict__", "pytestmark"):
            # A decorator of the solution on a test's function: pytest reads keywords and marks from the
            # test's own function, never from the solution.
            wrapped = self._factory_wrapped()
            if name == "__dict__":
                return dict(wrapped.__dict__) if wrapped is not None else {}
            if wrapped is None or not hasattr(wrapped, name):
                raise AttributeError(name)
            return wrapped.pytestmark
        if name == "__wrapped__":  # pytest finds the test's function through it
            if not _asked_by_pytest():  # a test reads it: the test's own object it wraps, or a handle
                return _probe(lambda: self._op("getattr", name=name), name)
            wrapped = self._factory_wrapped()
            if wrapped is None:
                raise AttributeError(name)
            return wrapped
        if name == "__signature__":
            return _remote_signature(self)
        if name == "__code__":
            return _remote_code(self)
        if name.startswith("__") and name.endswith("__") and name not in _DATA_DUNDERS:
            raise AttributeError(name)
        return _probe(lambda: self._op("getattr", name=name), name)

    def __setattr__(self, name, value):
        object.__getattribute__(self, "_client")  # proxies have no local attributes
        self._op("setattr", name=name, v=object.__getattribute__(self, "_client").encode(value))

    def __delattr__(self, name):
        self._op("delattr", name=name)

    def __len__(self):
        if object.__getattribute__(self, "_key") in object.__getattribute__(self, "_client").lenless:
            raise TypeError(f"object of type '{object.__getattribute__(self, '_type')}' has no len()")
        return self._op("len")

    def __iter__(self):
        client = object.__getattribute__(self, "_client")
        frame = sys._getframe(1)
        whole = _whole_consumer(frame, self, client)  # (before the request below: it forgets the call before)
        iterator = self if object.__getattribute__(self, "_key") in client.self_iterators else self._op("iter")
        if whole and type(iterator).__iter__ is RemoteObject.__iter__:
            client.whole[object.__getattribute__(iterator, "_key")] = (frame, frame.f_lasti)
        return iterator

    def __next__(self):
        return object.__getattribute__(self, "_client").next_item(object.__getattribute__(self, "_key"))

    def __getitem__(self, key):
        return self._op("getitem", key=object.__getattribute__(self, "_client").encode(key))

    def __setitem__(self, key, value):
        client = object.__getattribute__(self, "_client")
        self._op("setitem", key=client.encode(key), v=client.encode(value))

    def __delitem__(self, key):
        self._op("delitem", key=object.__getattribute__(self, "_client").encode(key))

    def __contains__(self, value):
        result = self._op("contains", v=object.__getattribute__(self, "_client").encode(value))
        if type(result) is not bool:
            raise BoundaryError(f"{self._factory_describe()}: `in` answered with a {type(result).__name__}, not a bool")
        return result

    def __str__(self):
        result = self._op("str")
        if type(result) is not str:
            raise BoundaryError(f"{self._factory_describe()}: str() answered with a {type(result).__name__}")
        return result

    def __enter__(self):
        return self._op("getattr", name="__enter__")()

    def __exit__(self, *exc_info):
        exc = exc_info[1]
        if exc is not None and isinstance(exc, Exception) and not isinstance(exc, AssertionError):
            # An exception of the block's (a test's ``raise``, or the solution's own code): its __exit__ sees it
            # and may suppress it, as in-process (``suppress``, a ``contextmanager`` whose generator catches it).
            client = object.__getattribute__(self, "_client")
            frame = sys._getframe(1)
            where = _raised_at(frame, exc)  # (before the solution's __exit__: a generator it throws into adds on)
            outer, client.exiting = client.exiting, [exc, False]
            try:
                if self._op("exit", exc=client.exception_info(exc)) is not True:
                    return False
                caught = client.exiting[1]
            finally:
                client.exiting = outer
            if not caught and (where is None or not _ends_its_block(frame, *where)):
                # Swallowed before the block's end, it would skip the test's checks after it (as a decorator of
                # the solution's that swallowed a test function's error): the test fails, saying why.
                raise BoundaryError(f"the solution's context manager suppressed {type(exc).__name__}, which "
                                    "did not come from the last step of the test's with block") from exc
            return True
        # A test's failure (an assertion, pytest's outcomes) stays here: the solution never sees or swallows it.
        result = self._op("getattr", name="__exit__")(None, None, None)
        return exc_info[0] is None and result is True

    def __reduce_ex__(self, protocol):
        # Pickled by the solution, in its process: the stream made here holds its bytes as data and names only
        # _solution_unpickle, which hands them back to the solution to load (never loaded here).
        return _pickled_by_solution(object.__getattribute__(self, "_key"), protocol)

    def __copy__(self):
        return self._op("copy", deep=False)

    def __deepcopy__(self, memo):
        return self._op("copy", deep=True)

    def __bool__(self):
        # The solution's own answer, as a plain bool: no more than a function of it returning True or False
        # (no value of the test's takes part; ``assert parser`` on an ArgumentParser it made).
        answer = self._op("bool")
        if type(answer) is not bool:
            raise BoundaryError(f"{self._factory_describe()}: its truth value answered with a "
                                f"{type(answer).__name__}, not a bool")
        return answer

    __eq__, __ne__, __lt__, __le__, __gt__, __ge__ = (_comparison(name) for name in _COMPARISONS)

    def __hash__(self):
        # By identity, unless the tests name the object's class or it was made from none of the test's values (see
        # _decide): then its own hash, a plain int.
        client = object.__getattribute__(self, "_client")
        if not _class_named(client, self) and object.__getattribute__(self, "_key") not in client.data_free:
            return object.__hash__(self)
        value = self._op("hash")
        if type(value) is not int:
            raise BoundaryError(f"{self._factory_describe()}: hash() answered with a {type(value).__name__}")
        _DECIDED[_NAN["current"]] = _DECIDED.get(_NAN["current"], 0) + 1
        return value

    @property
    def __class__(self):
        # ``obj.__class__ is pkg.Validator`` in a test: the solution's class. The runner's own isinstance checks
        # (encoding, NaN scans, pytest) see the proxy's class and ask nothing of the solution.
        if object.__getattribute__(self, "_type") == "function" and _test_asks_isfunction(sys._getframe(1)):
            return types.FunctionType  # inspect.getmembers(pkg, inspect.isfunction) in a test finds its functions
        if not _by_test(sys._getframe(1)):
            return RemoteObject
        try:
            cls = self._op("getattr", name="__class__")
        except (AttributeError, TypeError):
            return RemoteObject
        return cls if isinstance(cls, type) else RemoteObject


def _run_to_end(awaitable):
    """What awaiting the test's ``awaitable`` gives, run to its end in an event loop of its own.

    The solution awaits it while the test's loop (if any) waits in a call into
    the solution: that loop is set aside meanwhile, as in a nested run.
    """
    import asyncio

    async def awaiting():
        return await awaitable

    outer = asyncio.events._get_running_loop()
    loop = asyncio.new_event_loop()
    asyncio.events._set_running_loop(None)
    try:
        return loop.run_until_complete(awaiting())
    finally:
        loop.close()
        asyncio.events._set_running_loop(outer)


class _RemoteAwaitable(RemoteObject):
    """An awaitable of the solution's: awaiting it runs it there, to its end, in the solution's own event loop
    (a loop cannot span two processes), while this side waits and serves the calls it makes back."""

    __slots__ = ()

    def __await__(self):
        return self._op("await")
        yield  # (a generator: ``await`` gets the result when it stops)


class _RemoteCoroutine(CoroutineFace, _RemoteAwaitable):
    """A coroutine of the solution's (``asyncio.run(solution.fetch())``, ``loop.run_until_complete``,
    ``create_task``): a Task drives it by ``send``, which runs it to its end there."""

    __slots__ = ()

    def close(self):
        self._op("callmethod", name="close", a=[])


collections.abc.Coroutine.register(_RemoteCoroutine)


class _RemoteCallable(RemoteObject):
    """A handle on a callable object of the solution (a handle on anything else has no ``__call__``: a test's
    ``callable(x)`` is the solution's answer, as in-process)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        client = object.__getattribute__(self, "_client")
        key = object.__getattribute__(self, "_key")
        return client.call(key, args, kwargs, made=key in client.makers)


class _RemoteFunction(_RemoteCallable):
    """A function of the solution: a class attribute of the test's (``@cachedmethod(...) def get(self, ...)``,
    ``helper = solution.f``) binds to the test's objects as a function does."""

    __slots__ = ()

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        bound = object.__new__(_RemoteMethod)
        RemoteObject.__init__(bound, object.__getattribute__(self, "_client"), object.__getattribute__(self, "_key"),
                              object.__getattribute__(self, "_type"), True)
        object.__setattr__(bound, "_factory_self", obj)
        return bound


class _Described:
    """A descriptor of the solution's (its class defines ``__get__``: ``curry`` or a property subclass on a test's
    class, or called as ``p.__get__(obj)``): the solution's own ``__get__`` runs there, with the test's object and
    class as handles, and what it returns crosses as any result does."""

    __slots__ = ()

    def __get__(self, obj, *owner):
        client = object.__getattribute__(self, "_client")
        return self._op("get", a=[client.encode(value) for value in (obj, *owner[:1])])


class _RemoteDescriptor(_Described, RemoteObject):
    __slots__ = ()


class _RemoteCallableDescriptor(_Described, _RemoteCallable):
    __slots__ = ()


class _RemoteMethod(_RemoteCallable):
    """A function of the solution bound to an object of the test's; still a handle on the function (its
    attributes, ``__wrapped__`` for a test method the solution decorated), called with the object first."""

    __slots__ = ("_factory_self",)

    def __call__(self, *args, **kwargs):
        return _RemoteCallable.__call__(self, object.__getattribute__(self, "_factory_self"), *args, **kwargs)


def _solution_function_key(value, client=None):
    """The handle key of the solution's function that ``value`` stands for, if it is one of
    :func:`_solution_function`'s real functions; else None."""
    client = client or _CLIENT["client"]
    if client is None or type(value) is not types.FunctionType:
        return None
    key = client.function_keys.get(id(value))
    return key if key is not None and client.proxies.get(key) is value else None


def _solution_function(client, remote, described):
    """A real function standing for a plain function of a solution module (``type(f) is FunctionType``, as a
    test may assert), or None where ``described`` is malformed (the handle ``remote`` then stands for it).

    Its code is ours, generated from the solution's plain-data description (parameter names checked as
    identifiers, defaults immutable plain data, annotations as text, name, qualname, module, doc, file and
    line as data): calling it calls ``remote``, so the function runs in the solution's process with the
    arguments crossing as they do for a handle. A default left out by the caller (the mirror's own default
    object) is left out of the forwarded call, so the solution's own default applies. Its globals are this
    runner's (its frame is this runner's, never a test's); it has no attributes of the solution's (only
    functions without any are described), and what a test sets on it stays here. It is never collected as a
    test (see ``_Outcomes.pytest_pycollect_makeitem``).
    """
    import inspect

    try:
        def default_of(state, default):
            value = client.decode(default)
            if not _plain_default(value):
                raise WireError("a default that is not immutable plain data")
            return value

        # (kinds in order, defaults trailing, plain ones only: the signature is the one described)
        made = parameters_from(described["params"], (False, True), default_of)
        if made is None:
            return None
        text, parameters, defaults, kwdefaults = made
        names, kinds = [p[0] for p in parameters], [p[1] for p in parameters]
        own = {p[0]: p[3] for p in parameters if p[2]}  # name -> the mirror's default (left out when passed back)
        annotations = {p[0]: annotation_of(p[4], None) for p in parameters if annotation_of(p[4], None) is not None}
        source = (f"def _factory_make(_factory_forward):\n    def _factory_mirror({text}):\n"
                  f"        return _factory_forward(({''.join(n + ', ' for n in names)}))\n"
                  "    return _factory_mirror\n")
        scratch = {}
        exec(compile(source, "<a solution's function>", "exec"), scratch)  # noqa: S102 -- our own template

        def forward(values):
            # A test's builtin iterator passed as a temporary (``nth(permutations(...), n)``) may run ahead as
            # through a handle (SolutionClient.clone_ahead): told here, where its references are few and known.
            temporaries = {id(values[index]): values[index] for index in range(len(values))
                           if type(values[index]) in _CLONABLE_ITERATORS
                           and sys.getrefcount(values[index]) <= _MIRROR_TEMPORARY_REFS}
            omitted = [name in own and value is own[name] for name, value in zip(names, values)]
            # Positional parameters before a positional-only one that was passed (or extra positional
            # arguments) must go positionally, even where the caller passed the default's very object.
            last = max([i for i, kind in enumerate(kinds) if kind == 0 and not omitted[i]], default=-1)
            if 2 in kinds and values[kinds.index(2)]:
                last = kinds.index(2)
            args, kwargs, skipped = [], {}, False
            for index, (name, kind, value) in enumerate(zip(names, kinds, values)):
                if kind == 2:
                    args.extend(value)
                elif kind == 4:
                    kwargs.update(value)
                elif kind in (0, 1) and index <= last:
                    args.append(value)
                elif omitted[index]:
                    skipped = True
                elif kind == 3 or skipped:
                    kwargs[name] = value
                else:
                    args.append(value)
            if not temporaries:
                return remote(*args, **kwargs)
            outer, client.temporary_args = client.temporary_args, {**client.temporary_args, **temporaries}
            try:
                return remote(*args, **kwargs)
            finally:
                client.temporary_args = outer

        inner = scratch["_factory_make"](forward)
        code = described.get("code")
        filename, line = (code if type(code) is list and len(code) == 2 and type(code[0]) is str
                          and type(code[1]) is int else ["<solution>", 1])
        name = described.get("name")
        name = name[:200] if type(name) is str and name.isidentifier() else "function"
        made = types.FunctionType(inner.__code__.replace(co_name=name, co_filename=filename[:500],
                                                         co_firstlineno=max(1, min(line, 10_000_000))),
                                  globals(), name, tuple(defaults) or None, inner.__closure__)
        made.__kwdefaults__ = kwdefaults or None
        if annotation_of(described.get("ret"), None) is not None:
            annotations["return"] = annotation_of(described["ret"], None)
        made.__annotations__ = annotations
        for attribute, limit in (("qualname", 500), ("module", 200), ("doc", 20_000)):
            value = described.get(attribute)
            if type(value) is str or (attribute == "doc" and value is None):
                setattr(made, f"__{attribute}__", value if value is None else value[:limit])
        inspect.signature(made)  # (one that does not resolve: the handle stands for it)
        return made
    except (KeyError, TypeError, ValueError, SyntaxError, WireError, OverflowError):
        return None


#: The one connection to the solution of this run (what an unpickled handle reconnects to).
_CLIENT = {"client": None}


def _solution_unpickle(data):
    """An object of the solution that a test pickled, loaded again by the solution from its own bytes."""
    client = _CLIENT["client"]
    if client is None or type(data) is not bytes:
        raise BoundaryError("an object of the solution can only be unpickled while its tests run")
    return client.request("unpickle", data=client.encode(data))


_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
           "rshift")
_OPERATOR_NAMES = {"and": "and_", "or": "or_"}


def _built_by_test(obj):
    """Whether the test built the solution's object ``obj`` (a call of a class it names) and nothing else handed
    it over: arithmetic on it (``-Duration(years=1)``) is that class's own, so its result counts as built too."""
    client = object.__getattribute__(obj, "_client")
    key = object.__getattribute__(obj, "_key")
    return key in client.made and key not in client.tainted


def _binary(name, reflected):
    def method(self, other):
        client = object.__getattribute__(self, "_client")
        return client.exchange_checked({"op": "binop", "h": self._factory_handle_of(),
                                        "name": _OPERATOR_NAMES.get(name, name), "v": client.encode(other),
                                        "reflected": reflected}, None, _built_by_test(self))
    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


def _unary(name):
    def method(self):
        return object.__getattribute__(self, "_client").exchange_checked(
            {"op": "unop", "h": self._factory_handle_of(), "name": name}, None, _built_by_test(self))
    method.__name__ = f"__{name}__"
    return method


# Arithmetic on the solution's objects runs there, as their own semantics (the result is another handle or
# plain data); only comparison and truth, which a test would read as its verdict, are refused.
for _class in (RemoteObject, *RemoteObject.__subclasses__()):  # (subclasses defined later: __init_subclass__)
    _class.__doc__ = _forwarded(_class.__doc__ or "", "__doc__")
    _class.__module__ = _forwarded(_class.__module__, "__module__")
for _name in _BINARY:
    setattr(RemoteObject, f"__{_name}__", _binary(_name, False))
    setattr(RemoteObject, f"__r{_name}__", _binary(_name, True))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(RemoteObject, f"__{_name}__", _unary(_name))


#: Module attributes the import system, pickle and inspect look up on any module: answered here (missing).
_MODULE_PROBES = frozenset({"__path__", "__spec__", "__loader__", "__file__", "__cached__", "__builtins__",
                            "__wrapped__", "__signature__", "__getattr__", "__dir__", "__class_getitem__",
                            "__reduce__", "__reduce_ex__", "__getstate__", "__origin__", "__set_name__"})


class _RemoteNamespace(collections.abc.Mapping):
    """A solution module's attributes as a read-only mapping; each read asks the solution's process."""

    def __init__(self, target):
        self._module = target

    def __getitem__(self, name):
        if type(name) is not str:
            raise KeyError(name)
        if name == "__builtins__" and isinstance(self._module, types.ModuleType):
            # Every module's: the builtins (this side's), whose unsafe members never cross from the solution.
            return builtins.__dict__
        target = self._module
        try:
            return target._factory_client.request("owndict", h=target._factory_handle_of(), name=name)
        except (KeyError, AttributeError):
            raise KeyError(name) from None

    def __iter__(self):
        target = self._module
        names = target._factory_client.request("owndict", h=target._factory_handle_of(), name=None)
        return iter([n for n in names if type(n) is str] if type(names) is list else [])

    def __len__(self):
        return sum(1 for _ in self)

    def copy(self):
        """A plain dict of the namespace as it is now (``vars(module).copy()``: doctest's globals)."""
        return {name: self[name] for name in self}


class RemoteModule(types.ModuleType):
    """A solution module: attribute reads and writes go to the solution's process."""

    _LOCAL = frozenset({"__spec__", "__loader__", "__file__", "__path__", "__package__", "__name__",
                        "__cached__", "__builtins__", "__doc__", "_factory_client", "_factory_key"})

    def __init__(self, name, client, key, package):
        super().__init__(name)
        object.__setattr__(self, "_factory_client", client)
        object.__setattr__(self, "_factory_key", key)
        if package:
            object.__setattr__(self, "__path__", [])

    def _factory_handle_of(self):
        return {"h": object.__getattribute__(self, "_factory_key")}

    @property
    def __dict__(self):
        # The solution module's namespace (``vars(module)``, and monkeypatch, which reads the old value from
        # it to restore it): reads go to the solution's process.
        return _RemoteNamespace(self)

    def __getattr__(self, name):
        client = object.__getattribute__(self, "_factory_client")
        if name == "__all__":  # `from solution import *`
            try:
                names = client.request("getattr", h=self._factory_handle_of(), name=name)
            except AttributeError:
                names = [n for n in self.__dir__() if not n.startswith("_")]
            # A star import never rebinds a name the importing test module already has (``from math import
            # isclose`` above it): the solution would swap the test's own checks for its answers.
            try:
                bound = sys._getframe(1).f_globals
            except ValueError:
                bound = {}
            if isinstance(names, (list, tuple)):
                return [n for n in names if type(n) is not str or n not in bound]
            return names
        if name in _MODULE_PROBES:  # what the import system and inspect ask of any module: not forwarded
            raise AttributeError(name)
        # Dunders too (``__version__``, ``__author__``): a module's attributes are plain data or handles here.
        cache_key = (object.__getattribute__(self, "_factory_key"), name)
        value = client.module_cache.get(cache_key, _MISSING)
        if value is _MISSING:
            value = _probe(lambda: client.request("getattr", h=self._factory_handle_of(), name=name), name)
            # A function or class of the module: reused until the solution rebinds the name (it says so: "stale").
            if type(client.last_reply) is dict and client.last_reply.get("cache") is True \
                    and client.depth == 0 and len(client.module_cache) < 4096 and (
                        isinstance(value, (RemoteObject, RemoteClass)) or _solution_function_key(value, client)):
                client.module_cache[cache_key] = value
            if type(client.last_reply) is dict and client.last_reply.get("cache") is True:
                member = _solution_function_key(value, client) if type(value) is types.FunctionType else getattr(
                    value, "_factory_key", None) if isinstance(value, RemoteClass) else object.__getattribute__(
                    value, "_key") if isinstance(value, RemoteObject) else None
                if type(member) is int:
                    client.members.add(member)  # (a call of it may make an object from none of the test's values)
        if type(value) is _LIVE_TYPES["list"]:  # module state the test reads: a real list kept in sync
            value = client.adopt(value)
        if isinstance(value, RemoteClass) and _by_test(sys._getframe(1)):
            client.named.add(value._factory_key)  # the test relies on this class's own semantics
        return value

    def __setattr__(self, name, value):
        if name in RemoteModule._LOCAL or (isinstance(value, types.ModuleType) and not isinstance(
                value, RemoteModule) and getattr(value, "__name__", None) == f"{self.__name__}.{name}"):
            # (the import system binding a trusted submodule, ``pkg.tests``, to its parent: it stays here, never
            # handed to the solution)
            object.__setattr__(self, name, value)
            return
        client = object.__getattribute__(self, "_factory_client")
        client.request("setattr", h=self._factory_handle_of(), name=name, v=client.encode(value))

    def __delattr__(self, name):
        client = object.__getattribute__(self, "_factory_client")
        client.request("delattr", h=self._factory_handle_of(), name=name)

    def __dir__(self):
        client = object.__getattribute__(self, "_factory_client")
        names = client.request("dir", h=self._factory_handle_of())
        return [n for n in names if type(n) is str] if type(names) is list else []


class RemoteClass(type):
    """The metaclass of stand-ins for the solution's classes.

    Calling one constructs the object in the solution's process;
    ``isinstance`` asks that process. Stand-ins for exception classes are
    real exception classes here (with the nearest builtin base), so that
    ``pytest.raises(solution.MyError)`` works.
    """

    def __new__(mcs, name, bases, namespace, **kwargs):
        # A test's own class deriving from a solution class (not an exception: those are real exceptions here)
        # is a mixed class: see _mixed_class.
        if "_factory_key" in namespace or any(isinstance(b, type) and issubclass(b, BaseException) for b in bases):
            return super().__new__(mcs, name, bases, namespace, **kwargs)
        return _mixed_class(mcs, name, bases, namespace, kwargs)

    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace)  # class keywords went to the solution's __init_subclass__

    def __call__(cls, *args, **kwargs):
        if issubclass(cls, BaseException):
            if _own_namespace(cls).get("_factory_key") is not None:
                # built by the solution's own class (its __init__ makes the message, sets attributes), then
                # this side's stand-in of it, which pytest.raises and except match
                made = cls._factory_client.call(cls._factory_key, args, kwargs)
                if isinstance(made, cls):
                    return made
            return type.__call__(cls, *args)
        return cls._factory_client.call(cls._factory_key, args, kwargs,
                                        made=cls._factory_key in cls._factory_client.named)

    def __instancecheck__(cls, obj):
        if issubclass(cls, BaseException):
            return type.__instancecheck__(cls, obj)
        if type.__subclasscheck__(cls, type(obj)):  # an object of a test's class deriving from this one
            return True
        handle_of = getattr(type(obj), "_factory_handle_of", None)
        if handle_of is None or isinstance(obj, type):
            return False
        result = cls._factory_client.request("isinstance", h=handle_of(obj), cls={"h": cls._factory_key})
        return result is True

    def __subclasscheck__(cls, other):
        if type.__subclasscheck__(cls, other):
            return True
        key = getattr(other, "_factory_key", None) if isinstance(other, RemoteClass) else None
        if key is None or issubclass(cls, BaseException):
            return False
        return cls._factory_client.request("issubclass", h={"h": key}, cls={"h": cls._factory_key}) is True

    @property
    def __dict__(cls):
        # The solution class's own namespace (monkeypatch reads the old value from it to restore it); a test's
        # mixed class has its own.
        if type.__getattribute__(cls, "_factory_mixed"):
            return _own_namespace(cls)
        return _RemoteNamespace(cls)

    def __setattr__(cls, name, value):
        if name.startswith(("_factory_", "__")):
            type.__setattr__(cls, name, value)
            return
        if cls._factory_mixed:  # the test's class: its own attribute here, and its solution half's (a function
            type.__setattr__(cls, name, value)  # there forwards to this one)
        cls._factory_client.request("setattr", h={"h": cls._factory_key}, name=name,
                                    v=cls._factory_client.encode(value))

    def __delattr__(cls, name):
        if name.startswith(("_factory_", "__")):
            type.__delattr__(cls, name)
            return
        if cls._factory_mixed and name in _own_namespace(cls):
            type.__delattr__(cls, name)
        cls._factory_client.request("delattr", h={"h": cls._factory_key}, name=name)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__") and (name != "__wrapped__" or _asked_by_pytest()):
            # (a class's own ``__wrapped__``, toolz's Compose.__wrapped__ is None, is the solution's answer to a test)
            raise AttributeError(name)
        value = _probe(lambda: cls._factory_client.request("getattr", h={"h": cls._factory_key}, name=name), name)
        if isinstance(value, RemoteObject) and cls._factory_key in cls._factory_client.named:
            # ``Version.parse``: what it returns the test built with the class, as by calling it
            cls._factory_client.makers.add(object.__getattribute__(value, "_key"))
        return value

    def __repr__(cls):
        return f"<solution class {cls.__name__} #{cls._factory_key}>"

    def _factory_handle_of(cls):
        return {"h": cls._factory_key}


def _exception_text(self):
    """A stand-in exception's text: what the solution's own ``str()`` of it said (its ``__str__`` ran there)."""
    text = vars(self).get("_factory_message")
    if type(text) is str:
        return text
    return next(b for b in type(self).__mro__ if b.__module__ == "builtins").__str__(self)


def _remote_class(client, key, name, exception_base, bases):
    namespace = {"_factory_client": client, "_factory_key": key, "_factory_mixed": False, "__module__": "solution"}
    if exception_base is None:
        return RemoteClass(name, (), namespace)
    namespace["__str__"] = _exception_text
    builtin = getattr(builtins, str(exception_base), None)
    if not (isinstance(builtin, type) and issubclass(builtin, Exception)):
        builtin = Exception
    # The solution's own exception bases too, so pytest.raises(solution.BaseError) catches a subclass.
    parents = [p for p in (client.proxy(b) for b in bases[:8]) if isinstance(p, RemoteClass)
               and issubclass(p, BaseException)] if type(bases) is list else []
    try:
        return RemoteClass(name, (*parents, builtin), namespace)
    except TypeError:  # an MRO the stand-ins cannot reproduce
        return RemoteClass(name, (builtin,), namespace)


def _own_namespace(cls):
    """A class's own ``__dict__`` (``RemoteClass.__dict__`` is the solution's namespace for stand-ins)."""
    return type.__dict__["__dict__"].__get__(cls)


#: Entries of a test class's namespace that are its class machinery here, never sent to the solution.
_CLASS_MACHINERY = frozenset({"__module__", "__qualname__", "__dict__", "__weakref__", "__doc__", "__slots__",
                              "__init_subclass__", "__class_getitem__", "__new__", "__getattribute__",
                              "__set_name__", "__classcell__", "__firstlineno__", "__static_attributes__",
                              "__orig_bases__", "__annotations__", "__parameters__", "__class__"})


class _MixedObject(_RemoteCallable):
    """An object of a test's class deriving from a solution class (see :func:`_mixed_class`).

    It lives in the solution's process; here it is an instance of the test's
    class: the test's methods run here with it as ``self``, everything else
    goes to the object there.
    """

    __slots__ = ()

    @classmethod
    def _factory_new(cls, client, key, type_name, callable_):
        made = object.__new__(cls)
        RemoteObject.__init__(made, client, key, type_name, callable_)
        return made

    @property
    def __class__(self):
        return type(self)


class _SolutionAttribute:
    """An attribute of a solution class that a test's subclass overrides, reached past the override
    (``super().name``, ``Base.name(self)``): looked up in the solution's process along the object's MRO from the
    class this stand-in mirrors, as Python's ``super`` does."""

    def __init__(self, holder, name):
        self.holder, self.name = holder, name

    def __get__(self, obj, owner=None):
        holder = self.holder
        client = holder._factory_client
        if obj is None and isinstance(owner, RemoteClass) and owner is not holder and owner._factory_key is not None:
            # super().parse(...) in a test's classmethod: bound to the test's class (its solution half)
            value = client.request("superattr", h={"h": owner._factory_key}, cls={"h": holder._factory_key},
                                   name=self.name)
            if isinstance(value, RemoteObject) and owner._factory_key in client.named:  # as RemoteClass.__getattr__
                client.makers.add(object.__getattribute__(value, "_key"))
            return value
        if obj is None:  # read on the class: the solution class's own attribute (an unbound function there)
            value = client.request("getattr", h={"h": holder._factory_key}, name=self.name)
            if isinstance(value, RemoteObject) and holder._factory_key in client.named:  # as RemoteClass.__getattr__
                client.makers.add(object.__getattribute__(value, "_key"))
            return value
        handle_of = getattr(type(obj), "_factory_handle_of", None)
        if handle_of is None:
            raise TypeError(f"{holder.__name__}.{self.name} of the solution needs an object of the solution, not a "
                            f"{type(obj).__name__}")
        return client.request("superattr", h=handle_of(obj), cls={"h": holder._factory_key}, name=self.name)


def _mixed_class(mcs, name, bases, namespace, kwargs):
    """A test's class deriving from solution classes: a class here and its half in the solution's process.

    The half there derives from the solution classes (their metaclass and
    ``__init_subclass__`` run there, never here); each method, property and
    attribute the test's class defines is, in that half, a forwarder to the
    test's own, which runs here. So the solution's methods calling
    ``self.getsizeof(v)`` or ``self.__missing__(k)`` reach the test's
    override, and the test's ``super().__init__(...)`` reaches the solution's
    (through :class:`_SolutionAttribute`). The solution receives handles on
    the test's functions only: never the class, its ``__dict__`` or the
    functions' globals.
    """
    client = next(b._factory_client for b in bases if isinstance(b, RemoteClass))
    own = {k: v for k, v in namespace.items() if k != "__slots__"}  # slots live in the solution's half
    own.update(_factory_key=None, _factory_mixed=True)
    if not any(issubclass(b, _MixedObject) for b in bases):
        bases = (*bases, _MixedObject)
    cls = type.__new__(mcs, name, bases, own)
    mro = cls.__mro__
    first = next(i for i, k in enumerate(mro) if isinstance(k, RemoteClass) and k is not cls)
    # the test's own class and its plain mixins ahead of the first solution class (later ones lose to it)
    sources = [k for k in mro[:first] if k is cls or not isinstance(k, RemoteClass)]
    entries = {}
    for klass in reversed(sources):
        entries.update((key, value) for key, value in vars(klass).items()
                       if key not in _CLASS_MACHINERY and not key.startswith("_factory_"))
    members = []
    for key, value in entries.items():
        if isinstance(value, staticmethod):
            kind, parts = "static", [value.__func__]
        elif isinstance(value, classmethod):
            kind, parts = "class", [value.__func__]
        elif isinstance(value, property):
            kind, parts = "property", [value.fget, value.fset, value.fdel]
        elif key.startswith("_") and not key.endswith("__") and not callable(value):
            continue  # the test class's private data stays here (its methods, even private hooks, forward)
        else:
            kind, parts = "value", [value]
        try:
            members.append([key, kind, [client.encode(part) for part in parts]])
        except (BoundaryError, WireError):  # (a module, a frame: what never crosses stays this side's only)
            continue
    slots = namespace.get("__slots__")
    request = {"name": name, "qualname": str(namespace.get("__qualname__", name)),
               "module": str(namespace.get("__module__", "")), "members": members,
               "bases": [client.encode(b) for b in cls.__bases__ if isinstance(b, RemoteClass)],
               "kw": [[str(k), client.encode(v)] for k, v in kwargs.items()]}
    if slots is not None:
        request["slots"] = client.encode([slots] if isinstance(slots, str) else list(slots))
    key = client.request("subclass", **request)
    if type(key) is not int or key in client.proxies:  # (a fresh class there: never a handle this side knows)
        raise BoundaryError(f"the solution did not make its half of the test's class {name}")
    type.__setattr__(cls, "_factory_key", key)
    client.proxies[key] = cls
    if any(isinstance(b, RemoteClass) and b._factory_key in client.named for b in mro[1:]):
        client.named.add(key)  # the test's own class, on a class it names: it relies on their semantics
    for klass in mro:  # super() past the test's overrides reaches the solution's own
        if isinstance(klass, RemoteClass) and not klass._factory_mixed and not issubclass(klass, BaseException):
            for member in entries:
                if member not in _own_namespace(klass):
                    type.__setattr__(klass, member, _SolutionAttribute(klass, member))
    return cls


#: The text of the empty ``__init__.py`` that the trusted sandbox holds for a solution package with tests inside
#: it (``pkg/tests/``), so that pytest names the tests ``pkg.tests.test_x`` as it would beside the solution.
#: Only the verifier writes it there (the agent writes nothing in that sandbox); ``pkg`` is still the solution's.
PACKAGE_MARKER = "# factory: the solution's package; its modules are imported from the solution\n"


def _is_package_marker(origin):
    if not origin or os.path.basename(origin) != "__init__.py":
        return False
    try:
        with open(origin, encoding="utf-8") as handle:
            return handle.read(len(PACKAGE_MARKER) + 1) == PACKAGE_MARKER
    except (OSError, ValueError):
        return False


class SolutionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the solution's top-level names (and their submodules) from the solution's process."""

    def __init__(self, client, names):
        self.client = client
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        # What the trusted side can import itself wins (pytest, the tests' helpers, the tests inside a solution
        # package: ``pkg.tests``, found on the package's ``__path__``), except a namespace package (a directory
        # without __init__.py somewhere on its path: in-process, the solution's own module, first on the path,
        # would win over that) and a package marker (the solution's package, which holds the tests).
        # Submodules of an ordinary solution package are never local: its ``__path__`` is empty.
        own = importlib.machinery.PathFinder.find_spec(fullname, path) if "." not in fullname or path else None
        marker = own is not None and _is_package_marker(own.origin)
        if own is not None and own.origin is not None and not marker:
            return None
        try:
            module = self.client.request("import", name=fullname)
        except ModuleNotFoundError:
            if marker:  # never the empty marker in the solution's place
                raise ImportError(f"the solution's package {fullname} cannot be imported") from None
            return None
        except BaseException as exc:
            if _NAN["current"] is None and self.client.raised_before_tests is None:
                self.client.raised_before_tests = f"{type(exc).__name__}: {str(exc)[:300]}"
            raise
        if not isinstance(module, RemoteModule):
            raise ImportError(f"{fullname} did not import as a module")
        if marker and own.submodule_search_locations:
            # The folder that holds the tests (trusted files only): what exists there imports locally, the
            # rest (``from ..mod import x``) from the solution, as above.
            object.__setattr__(module, "__path__", list(own.submodule_search_locations))
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=hasattr(module, "__path__"))
        spec._factory_module = module
        return spec

    def create_module(self, spec):
        return spec._factory_module

    def exec_module(self, module):
        return None


class _NotFound:
    """The last import finder: records the top-level modules no finder here could find.

    A test file's collection that fails on such a module (``No module named 'numpy'`` from this process's own
    import system, not an exception relayed from the solution, which never reaches a finder here) means the
    environment lacks it; the verifier reports that as the environment's lack when the host has the module.
    """

    missing = set()

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is None:
            cls.missing.add(name.partition(".")[0])
        return None


def _lacked_by_environment(text, solution_modules):
    """Top-level modules a failed collection's traceback (``text``) shows this process's own import statement
    failing to find: ``E   ModuleNotFoundError: No module named 'M'`` right under a source line that imports M,
    with M one no finder here found (:class:`_NotFound`) and not the solution's. The source line is this
    process's (the tests'), so an exception the solution raised and the boundary relayed, whatever its message,
    never matches: under it is the line that imported the solution's module."""
    import re

    found = set()
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"E\s+ModuleNotFoundError: No module named '([\w.]+)'\s*$", line)
        if not match or index == 0:
            continue
        name = match.group(1)
        top = name.partition(".")[0]
        source = lines[index - 1]
        imports = re.match(rf"\s*(from\s+{re.escape(name)}\s+import\b|import\s+([\w.]+(\s+as\s+\w+)?\s*,\s*)*"
                           rf"{re.escape(name)}\b)", source)
        if imports and top in _NotFound.missing and top not in solution_modules:
            found.add(top)
    return found


class _Outcomes:
    """A pytest plugin recording every test's outcome in this process."""

    def __init__(self):
        self.outcomes = {}
        self.messages = {}
        self.collection_errors = []
        self.missing_modules = set()  # modules a failed collection lacked that no finder here found
        self.solution_modules = frozenset()
        self.boundary = []
        self.functions = {}
        self.watched = set()
        self.progress = time.monotonic()  # when a test (or a file's collection) last finished
        self.quiet = 0.0  # the longest stretch so far without one finishing, seconds

    def finished(self):
        """Note that a test or a file's collection finished now (what the inactivity window watches)."""
        now = time.monotonic()
        self.quiet = max(self.quiet, now - self.progress)
        self.progress = now

    def pytest_collectreport(self, report):
        self.finished()
        if report.failed:
            self.collection_errors.append(report.nodeid)
            self.outcomes[report.nodeid or "<collection>"] = "failed"
            self.messages[report.nodeid or "<collection>"] = report.longreprtext[-600:]
            self.missing_modules.update(_lacked_by_environment(report.longreprtext, self.solution_modules))
        elif report.skipped and report.nodeid:
            # A module skipped as a whole (``pytest.skip(allow_module_level=True)`` when an import of the
            # solution fails): its tests must not vanish unseen (the verifier compares skips with the
            # pristine task's).
            self.outcomes[report.nodeid] = "skipped"

    def pytest_runtest_setup(self, item):
        _NAN["current"] = item.nodeid
        _watch_mock_patches()

    def pytest_runtest_call(self, item):
        # A test function the solution decorated: the pass counts only if the test's own function ran.
        _RUN["watch"], _RUN["ran"] = None, False
        _RUN["args"] = dict(getattr(item, "funcargs", {}) or {})
        obj = getattr(item, "obj", None)
        if _solution_function_key(getattr(obj, "__func__", obj)) is not None:
            # (a unittest method a decorator of the solution replaced with a real function standing for one of
            # its own: it wraps nothing, so the pass never counts)
            self.watched.add(item.nodeid)
        elif getattr(type(obj), "_factory_handle_of", None) is not None:
            try:
                _RUN["watch"] = obj.__wrapped__
            except BaseException:
                _RUN["watch"] = None
            self.watched.add(item.nodeid)

    def pytest_pycollect_makeitem(self, collector, name, obj):
        # A test function the solution replaced by something pytest cannot collect (a decorator returning a
        # non-function) would vanish from the run silently: it fails instead.
        solution_function = _solution_function_key(obj) is not None
        if solution_function and collector.funcnamefilter(name):
            # A real function standing for the solution's is never a test pytest runs (a decorator of the
            # solution returning one would have the test pass without running it): as a handle, it fails
            # where it replaced a test the file defines, and is not collected otherwise.
            if name in self.defined_functions(collector.path):
                self.replaced(collector, name)
            return []
        if isinstance(obj, (types.FunctionType, type, staticmethod, classmethod)) \
                or not collector.funcnamefilter(name) or name not in self.defined_functions(collector.path):
            return None
        from _pytest.fixtures import getfixturemarker

        if getattr(type(obj), "_factory_handle_of", None) is None and getfixturemarker(obj) is not None:
            return None  # a fixture named test* (pytest 8.4+ wraps it in an object of its own): never a test
        try:
            wrapped = obj.__wrapped__ if getattr(type(obj), "_factory_handle_of", None) is not None else None
        except BaseException:
            wrapped = None
        if not isinstance(wrapped, types.FunctionType) or wrapped.__name__ != name:
            # (the name too: a wrapper must not borrow another test's function, and with it its marks)
            self.replaced(collector, name)
        return None

    def replaced(self, collector, name):
        """Fail the test ``name`` that a decorator of the solution replaced with something not wrapping it."""
        node = f"{collector.nodeid}::{name}"
        self.outcomes[node] = "failed"
        self.messages[node] = ("the test function was replaced (by a decorator of the solution) with something "
                               "that does not wrap it (no __wrapped__): it cannot be collected, so it fails")
        self.boundary.append({"test": node, "what": "a test function decorated by the solution does not "
                                                    "carry __wrapped__, so pytest cannot collect it"})

    def defined_functions(self, path):
        """Names of the functions a test file defines (``def``), read from its source."""
        if path not in self.functions:
            import ast

            try:
                tree = ast.parse(path.read_text())
            except (OSError, SyntaxError, ValueError):
                tree = None
            self.functions[path] = frozenset(node.name for node in ast.walk(tree) if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef))) if tree is not None else frozenset()
        return self.functions[path]

    def boundary_entries(self):
        """``[{"test", "what"}]``: what could not cross, for each test that failed."""
        entries = list(self.boundary)
        for node, outcome in list(self.outcomes.items()):  # (a copy: the inactivity watch reads it from a thread)
            if outcome == "failed":
                # (what could not cross while collecting is filed under None, before any test ran)
                key = None if node in self.collection_errors or node == "<collection>" else node
                entries.extend({"test": node, "what": what} for what in _BOUNDARY.get(key, []))
        return entries[:200]

    def pytest_runtest_logreport(self, report):
        if report.when == "teardown":
            self.finished()
        node = report.nodeid
        previous = self.outcomes.get(node)
        if report.when == "call" and report.passed and node in _NAN["received"] - _NAN["checked"]:
            self.outcomes[node] = "failed"
            self.messages[node] = ("a NaN from the solution took part in the test's comparisons and the test "
                                   "never checked it with "
                                   "math.isnan or pytest.approx(nan_ok=True): NaN passes ordered comparisons "
                                   "vacuously, so the pass is not counted")
            return
        if report.when == "call" and report.passed and node in self.watched and not _RUN["ran"]:
            self.outcomes[node] = "failed"
            self.messages[node] = ("the test function is wrapped by a decorator of the solution that did not run it "
                                   "to its end with the test's own arguments: the pass is not counted")
            return
        if report.failed:
            self.outcomes[node] = "failed"
            self.messages[node] = report.longreprtext[-600:]
        elif previous == "failed":
            return
        elif report.skipped:
            self.outcomes[node] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        elif report.when == "call":
            self.outcomes[node] = "xpassed" if hasattr(report, "wasxfail") else "passed"


def _connect(path, deadline):
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


_STOPPED_EXIT = 75  # the exit status of a run the inactivity window stopped (its report says so)


def _write_report(fd, nonce, payload):
    """Write the report line ``<nonce> <base64 JSON>`` to ``fd`` (all of it)."""
    import base64
    import json

    data = ("\n" + nonce + " " + base64.b64encode(json.dumps(payload).encode()).decode() + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _payload(outcomes, client, exit_code):
    """The report payload: what pytest's hooks in this process saw, and what the solution's side did."""
    return {"exit": exit_code, "outcomes": dict(outcomes.outcomes), "messages": dict(outcomes.messages),
            "collection_errors": list(outcomes.collection_errors), "solution_error": client.broken,
            "missing_modules": sorted(outcomes.missing_modules)[:20],
            "boundary": outcomes.boundary_entries(),
            # (pytest's usage error when a conftest's import of the solution raised: the solution's failure)
            "solution_raised_before_tests": client.raised_before_tests,
            # comparisons and hashes the solution's own methods decided (classes the tests name), per test
            "solution_decided": {str(k): v for k, v in list(_DECIDED.items())[:1000]},
            # the longest stretch without a test finishing (how near the run came to its inactivity window)
            "quiet_s": round(max(outcomes.quiet, time.monotonic() - outcomes.progress), 1)}


def _watch_inactivity(outcomes, client, window, nonce, done):
    """Stop this run once no test has finished for ``window`` seconds: report what did finish, then exit.

    The run's own process decides it, from pytest's reports in this process (the solution never runs
    here): a hung call, a test looping on the solution, an endless iterator all stop here, long before the
    run's ceiling, while a slow suite that keeps finishing tests runs on. The report goes to the real
    stdout (``fd``, a copy taken before pytest captures fd 1). ``done`` (a lock and a flag) keeps it from
    racing the run's own report.
    """
    import threading

    fd = os.dup(1)

    def watch():
        while True:
            quiet = time.monotonic() - outcomes.progress
            if quiet >= window:
                break
            time.sleep(min(1.0, window - quiet + 0.01))
        with done["lock"]:
            if done["finished"]:
                return
            try:
                payload = _payload(outcomes, client, None)
            except Exception:  # (the main thread changed what it was reading): the stop alone is the report
                payload = {"exit": None}
            payload["stopped"] = {"name": "inactivity", "value": f"{window:g} s without a test finishing"}
            try:
                _write_report(fd, nonce, payload)
            finally:
                os._exit(_STOPPED_EXIT)

    threading.Thread(target=watch, name="factory-inactivity", daemon=True).start()


def run_tests(settings, nonce=None):
    """Connect, hook imports, run pytest; return the report payload.

    With ``settings["inactivity"]`` (seconds) and ``nonce``, a run in which no test finishes for that long
    reports and exits (:func:`_watch_inactivity`).
    """
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    try:
        sock = _connect(settings["socket"], time.monotonic() + settings.get("connect_timeout", 30))
    except OSError as exc:  # no agent code has run yet: this is the infrastructure's failure
        return {"infra_error": f"cannot reach the solution's process: {exc}"}
    client = SolutionClient(Channel(sock), settings.get("call_timeout", 60))
    _CLIENT["client"] = client
    finder = SolutionFinder(client, settings["modules"])
    # Just before the path finder: after the builtin and frozen importers, ahead of namespace packages.
    path_finder = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
                       len(sys.meta_path))
    sys.meta_path.insert(path_finder, finder)

    import pytest

    solution_names = frozenset(settings["modules"])
    original_importorskip = pytest.importorskip

    def importorskip(modname, *args, **kwargs):
        if modname.split(".")[0] in solution_names:
            import importlib

            return importlib.import_module(modname)
        return original_importorskip(modname, *args, **kwargs)

    pytest.importorskip = importorskip
    _watch_nan_checks(pytest)
    _watch_patches(pytest)
    outcomes = _Outcomes()
    outcomes.solution_modules = solution_names
    sys.meta_path.append(_NotFound)
    import threading

    done = {"lock": threading.Lock(), "finished": False}
    if settings.get("inactivity") and nonce:
        _watch_inactivity(outcomes, client, float(settings["inactivity"]), nonce, done)
    exit_code = pytest.main(["-p", "no:cacheprovider", "-p", "no:pastebin", *settings["args"]], plugins=[outcomes])
    with done["lock"]:
        done["finished"] = True
    return _payload(outcomes, client, int(exit_code))


if __name__ == "__main__":
    import base64
    import json

    sys.dont_write_bytecode = True
    _settings = json.loads(sys.stdin.read())
    sys.stdin.close()
    _nonce = _settings.pop("nonce")
    _report = run_tests(_settings, _nonce)
    sys.stdout.flush()
    print("\n" + _nonce + " " + base64.b64encode(json.dumps(_report).encode()).decode(), flush=True)
