"""The solution's side of the import boundary: serves the agent's modules to the trusted side.

Sent as source (after :mod:`._wire`, before :mod:`._program_server`, the
front door that listens and forks a child per trusted connection) to
``python -I -B`` in the *solution* sandbox, which holds the agent's files and
no test file. In each child, :func:`serve_connection` starts capturing output
and only then puts the workspace on ``sys.path`` (last, so nothing in it
shadows the standard library) — no agent code runs before the trusted peer
is connected. Then it answers requests until the peer
hangs up: import a module, get/set/delete an attribute, call, and the few
operations containers need (``len``, ``iter``, ``next``, item access,
``in``, ``str``, ``repr``, ``isinstance``) and arithmetic operators.

Results cross as plain data when their type is exactly a plain type; value
objects (dataclasses with a generated ``__eq__``, namedtuples, enum
members, the standard library's value types) as snapshots of their fields;
the lists, dicts, sets and bytearrays an attribute read returns (module
state such as a registry) as live handles; anything else as a handle.
Exceptions cross as their class name and message (a builtin class by name,
a solution class by handle).

Objects of the test passed to a call arrive as :class:`TrustedObject`
handles (a test's function as a generated mirror function with its
signature and metadata, :func:`_mirror_function`): calling one (a key function, a callback, a test function the
solution decorated) asks the trusted side to run it there, and the solution
waits for the answer while serving the calls that code makes back into it.
The containers a call received are sent back after it (write-back). What the
solution prints, logs and warns during a call travels with its messages and
is re-emitted on the trusted side; the test's environment changes and
working directory arrive with each call. A class of the test's own is a
real stand-in class here (:meth:`SolutionServer.test_class`), whose objects
are the handles on the test's objects of that class; the test's exceptions
are exceptions here; an awaitable of the test's runs there when awaited, one
of ours the test awaits runs here (:func:`_run_to_end`). A test's class deriving from a
solution class has its half here (:meth:`SolutionServer.subclass`), whose
test-defined members forward to the trusted side; pickling for the test
happens here (:func:`_pickle`), and ``unpickle`` loads only in this process.

An iterator of the solution that the test consumes item by item is run
ahead by a forked copy of this process (:meth:`SolutionServer.run_ahead`):
the items travel in batches, this process catches up by the items the test
took before it does anything else, so what the test observes of it is never
ahead of what it consumed; a step that would ask the test, print, or touch
or read the world outside the process is never run ahead.

Nothing in this process is trusted: the agent's code can rewrite every line
of it at run time, and all it gains is the ability to send the trusted side
other data, which the trusted side decodes into its own classes only.
"""

from __future__ import annotations

import abc
import builtins
import collections
import collections.abc
import contextlib
import dataclasses
import datetime
import enum
import io
import keyword
import logging
import os
import sys
import tempfile
import types
import warnings

if __name__ != "__main__":  # imported on the host (tests); in the sandbox _wire's source precedes this
    from factory.verifiers._wire import (
        HANDLE_KEYS,
        SIDE_TAGS,
        CoroutineFace,
        Endpoint,
        Refs,
        Shared,
        WireError,
        WorkspaceFiles,
        annotation_of,
        annotation_text,
        container_states,
        cwd_from_wire,
        decode_item,
        decode_value,
        encode_item,
        encode_value,
        parameters_from,
        retained,
        states_of,
        write_back,
    )

__all__ = ["SolutionServer", "TrustedFunction", "TrustedObject", "serve_connection"]

#: This process's workspace, where it started (a working directory the trusted side sends is mapped onto it).
_WORKSPACE_ROOT = os.getcwd()

_RELAY_LIMIT = 1 << 20  # bytes of output relayed with one message
#: How many causes of an exception (``raise ... from exc``) cross with it, each inside the one before.
_CAUSE_DEPTH = 4
#: What relaying needs, bound now: a test may give the solution's ``os`` its own functions (monkeypatch).
_fstat, _pread, _chdir = os.fstat, os.pread, os.chdir
_MISSING = object()
_LIVE = (list, dict, set, bytearray)


def _builtin_exception_name(cls):
    """The nearest builtin ``Exception`` class in ``cls``'s MRO (``Exception`` at worst)."""
    for base in cls.__mro__:
        if getattr(builtins, base.__name__, None) is base and issubclass(base, Exception):
            return base.__name__
    return "Exception"


def _generated_eq(cls):
    """Whether ``cls`` is a dataclass whose ``__eq__`` is the one dataclasses generated for it."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.eq:
        return False
    for klass in cls.__mro__:  # the class that defines __eq__ must be a dataclass that generated it
        if "__eq__" in klass.__dict__:
            eq = klass.__dict__["__eq__"]
            return ("__dataclass_params__" in klass.__dict__ and klass.__dict__["__dataclass_params__"].eq
                    and getattr(getattr(eq, "__code__", None), "co_filename", None) == "<string>")
    return False


#: Builtin value types whose subclasses' objects cross as their builtin value (``{"bv": ...}``), compared by the
#: trusted side with the builtin's semantics; their own methods still run here. OrderedDict and Counter first:
#: their comparisons are not dict's.
_VALUE_BASES = ((collections.OrderedDict, "odict"), (collections.Counter, "counter"), (str, "str"), (int, "int"),
                (float, "float"), (bytes, "bytes"), (tuple, "tuple"), (frozenset, "frozenset"), (list, "list"),
                (dict, "dict"), (set, "set"))


#: The numpy dtypes whose arrays and scalars cross to the trusted side as values (raw bytes; no object).
_ARRAY_KINDS = "biufcUS"


def _array_of(value):
    """``{"nd": [dtype, shape or None for a scalar, base64 bytes]}`` for a plain numpy array or scalar."""
    kind = type(value)
    if not kind.__module__.startswith("numpy"):
        return None
    import base64

    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    if kind is numpy.ndarray:
        dtype, shape, raw = value.dtype, list(value.shape), numpy.ascontiguousarray(value).tobytes()
    elif isinstance(value, numpy.generic) and kind.__module__ == "numpy":
        dtype, shape, raw = value.dtype, None, value.tobytes()
    else:
        return None
    if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.hasobject or dtype.subdtype is not None:
        return None
    return {"nd": [dtype.str, shape, base64.b64encode(raw).decode("ascii")]}


def _value_base(kind):
    """``(builtin, name)`` when objects of ``kind`` cross as a builtin value, else None."""
    if issubclass(kind, (enum.Enum, BaseException, type)):
        return None
    for base, name in _VALUE_BASES:
        if issubclass(kind, base) and (kind is not base or name in ("odict", "counter")):
            return base, name
    return None


def _builtin_contents(value, base):
    """The builtin value inside ``value`` (its subclass's methods bypassed): an exact str, int, ..., dict."""
    if base is str:
        return str.__str__(value)
    if base is int:
        return int.__index__(value)
    if base is float:
        return float.__float__(value)
    if base is bytes:
        return bytes(memoryview(value))
    if base in (tuple, list, set, frozenset):
        return base(base.__iter__(value))
    if base is collections.OrderedDict:
        return dict(collections.OrderedDict.items(value))
    return dict(dict.items(value))


def _overridden(kind, base):
    """The names ``kind`` defines above ``base`` (its methods that the trusted side must not run as the base's)."""
    names = set()
    for klass in kind.__mro__:
        if klass in base.__mro__:
            break
        names.update(name for name in vars(klass) if type(name) is str)
    if "__missing__" in names:  # (a defaultdict's lookup fills it: only the solution can)
        names.add("__getitem__")
    return sorted(names)[:500]


def _is_namedtuple(value):
    cls = type(value)
    fields = getattr(cls, "_fields", None)
    return (isinstance(value, tuple) and type(fields) is tuple and len(fields) == len(value) <= 200
            and all(type(f) is str and f.isidentifier() and not f.startswith("_") and not keyword.iskeyword(f)
                    for f in fields) and cls.__eq__ is tuple.__eq__)


#: This process's halves of the tests' classes deriving from solution classes: id(class) -> handle key, and back.
_MIXED_KEYS = {}
_MIXED_CLASSES = {}
#: Keys of the test's objects whose class defines its own == or hash: asked of the trusted side.
_CUSTOM_EQ = set()
#: This process's server (one trusted peer per process).
_SERVER = []


class _TestModule(types.ModuleType):
    """A module of the tests', as the solution may import it (:class:`_TestModuleFinder`): its attributes are
    those of the test module's globals that are the solution's own objects, asked of the trusted side each time;
    any other name is missing."""

    def __getattr__(self, name):
        if name.startswith("__") or not _SERVER:
            raise AttributeError(name)
        return _SERVER[0].request("testglobal", module=self.__name__, name=name)


class _TestModuleFinder:
    """``import_module`` of a module of the tests' (a name the solution learned from the ``__module__`` of a
    test's class or function: toolz's ``curry.__reduce__`` looks a curried test class up there to pickle it by
    name, and its ``_restore_curry`` again to load it): a :class:`_TestModule`, never the tests' code."""

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if not _SERVER or fullname not in _SERVER[0].test_modules:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        spec.submodule_search_locations = []  # (a package: importing a submodule of it asks this finder again)
        return spec

    def create_module(self, spec):
        return _TestModule(spec.name)

    def exec_module(self, module):
        return None


def _mixed_class(key):
    """The half of a test's class with handle ``key`` (what a pickle of its objects names: the test's module is
    not importable here)."""
    return _MIXED_CLASSES[key]


def _standard_error(described):
    """The standard library's exception class ``[module, qualname]`` names, or None."""
    if type(described) is not list or len(described) != 2 or not all(type(x) is str for x in described) \
            or described[0].split(".")[0] not in sys.stdlib_module_names or not described[1].isidentifier():
        return None
    import importlib

    try:
        found = getattr(importlib.import_module(described[0]), described[1], None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def _trusted_unpickle(token):
    """A copy of a test's object pickled inside a solution object (the trusted side loads its own bytes)."""
    return _SERVER[0].request("unpickle", token=token)


def _pickle(obj, protocol):
    """``obj`` pickled for a test's ``pickle.dumps``; the halves of test classes by key."""
    import io
    import pickle

    class Pickler(pickle.Pickler):
        def reducer_override(self, value):
            if isinstance(value, type) and _MIXED_KEYS.get(id(value)) is not None and \
                    _MIXED_CLASSES.get(_MIXED_KEYS[id(value)]) is value:
                return _mixed_class, (_MIXED_KEYS[id(value)],)
            server = _SERVER[0] if _SERVER else None
            if _is_trusted_handle(value):  # pickled there, kept there
                return _trusted_unpickle, (value._op("pickle"),)
            if type(value) is types.FunctionType and server is not None and id(value) in server.mirrors:
                return _trusted_unpickle, (server.request("pickle", rh=server.mirrors[id(value)]),)
            return NotImplemented

    for function in (_trusted_unpickle, _mixed_class):  # importable by the name pickle records, however this
        module = sys.modules.get(function.__module__)  # server's source was loaded
        if module is None:
            module = sys.modules[function.__module__] = types.ModuleType(function.__module__)
        if getattr(module, function.__name__, None) is not function:
            setattr(module, function.__name__, function)
    buffer = io.BytesIO()
    Pickler(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()


class TrustedObject:
    """A handle on an object of the test (a callback, a key function, a mock, a file): it runs there."""

    __slots__ = ("_server", "_key", "_kind", "_name")

    def __init__(self, server, key, kind, name):
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_name", name)

    def _op(self, op, **fields):
        return object.__getattribute__(self, "_server").request(op, rh=object.__getattribute__(self, "_key"),
                                                                 **fields)

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_server").call_trusted(object.__getattribute__(self, "_key"),
                                                                      args, kwargs)

    def __getattr__(self, name):
        return self._op("getattr", name=name)

    @property
    def __signature__(self):
        # inspect.signature of the test's callable, as the trusted side computes it (or its TypeError/ValueError)
        described = self._op("signature")
        if described == "descriptor":  # a test's class whose __signature__ is a property: that is what it reads
            return _SIGNATURE_DESCRIPTOR
        return _signature_of(described, object.__getattribute__(self, "_server").value)

    def __setattr__(self, name, value):
        raise AttributeError(f"objects of the test are read-only to the solution ({name})")

    def __delattr__(self, name):
        raise AttributeError(f"objects of the test are read-only to the solution ({name})")

    def __iter__(self):
        return self._op("iter")

    def __next__(self):
        return object.__getattribute__(self, "_server").trusted_next(object.__getattribute__(self, "_key"))

    def __len__(self):
        return self._op("len")

    def __bool__(self):
        return self._op("bool") is True

    def __contains__(self, item):
        return self._op("contains", v=object.__getattribute__(self, "_server").encode(item)) is True

    def __getitem__(self, key):
        return self._op("getitem", key=object.__getattribute__(self, "_server").encode(key))

    def __setitem__(self, key, value):
        server = object.__getattribute__(self, "_server")
        self._op("setitem", key=server.encode(key), v=server.encode(value))

    def __delitem__(self, key):
        self._op("delitem", key=object.__getattribute__(self, "_server").encode(key))

    def __enter__(self):
        return self._op("enter")

    def __exit__(self, *exc_info):
        return self._op("exit", failed=exc_info[0] is not None) is True

    def __repr__(self):
        return self._op("repr")

    def __str__(self):
        return self._op("str")

    def __eq__(self, other):
        same = _is_trusted_handle(other) and object.__getattribute__(other, "_key") == \
            object.__getattribute__(self, "_key")
        if same or object.__getattribute__(self, "_key") not in _CUSTOM_EQ:
            return same
        return self._op("eq", v=object.__getattribute__(self, "_server").encode(other)) is True

    def __hash__(self):
        key = object.__getattribute__(self, "_key")
        if key not in _CUSTOM_EQ:
            return hash(("trusted", key))
        value = self._op("hash")
        if type(value) is not int:
            raise TypeError("the test's object answered hash() with something else than an int")
        return value

    @property
    def __doc__(self):
        return self._op("getattr", name="__doc__")

    @property
    def __module__(self):
        return self._op("getattr", name="__module__")


class _SelfIterating(TrustedObject):
    """A handle on a test's builtin iterator (a list's, a generator, ``map``): ``iter()`` returns it, as
    there, without asking."""

    __slots__ = ()

    def __iter__(self):
        return self


class TrustedFunction(TrustedObject):
    """A function of the test: set on a class of the solution (monkeypatch), it binds like a method."""

    __slots__ = ()

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)


def _run_to_end(awaitable, owner):
    """What awaiting ``awaitable`` gives, run to its end in an event loop of this process.

    Each side runs its own coroutines (a loop cannot span two processes): an
    awaitable of ours the test awaits runs here, in ``owner``'s loop, kept
    across awaits as a test's loop is; one awaited while a loop of ours is
    already running (nested through the test's code) in a loop of its own,
    the running one set aside meanwhile, its callbacks waiting, as the caller
    does.
    """
    import asyncio

    async def awaiting():
        return await awaitable

    outer = asyncio.events._get_running_loop()
    loop = getattr(owner, "loop", None) if outer is None else None
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        if outer is None:
            owner.loop = loop
    asyncio.events._set_running_loop(None)
    try:
        return loop.run_until_complete(awaiting())
    finally:
        if outer is not None:
            loop.close()
        asyncio.events._set_running_loop(outer)


class _TrustedAwaitable(TrustedObject):
    """An awaitable of the test's (a coroutine it made): awaiting it runs it there, to its end, in a loop of the
    trusted side's, while this side waits (and serves the calls it makes back)."""

    __slots__ = ()

    def __await__(self):
        return self._op("await")
        yield  # (a generator: ``await`` gets the result when it stops)


class _TrustedCoroutine(CoroutineFace, _TrustedAwaitable):
    """A coroutine of the test's: ``asyncio.run``, ``create_task`` and ``send``/``throw``/``close`` take it."""

    __slots__ = ()

    def close(self):
        self._op("close")


collections.abc.Coroutine.register(_TrustedCoroutine)


#: Standard-library bases that code checks with isinstance: a test's object of one is one here too.
_STANDARD_ABCS = {"Mapping": collections.abc.Mapping, "MutableMapping": collections.abc.MutableMapping,
                  "Sequence": collections.abc.Sequence, "MutableSequence": collections.abc.MutableSequence,
                  "Set": collections.abc.Set, "MutableSet": collections.abc.MutableSet,
                  "IOBase": io.IOBase, "TextIOBase": io.TextIOBase, "BufferedIOBase": io.BufferedIOBase,
                  "RawIOBase": io.RawIOBase}
#: The classes of handles on the test's objects (TrustedObject, TrustedFunction and those made below).
_TRUSTED_TYPES = {TrustedObject, TrustedFunction}


def _is_trusted_handle(value):
    """Whether ``value`` is a handle on a test's object (of any class made for them, subclasses too)."""
    return type(value) in _TRUSTED_TYPES or isinstance(value, tuple(_TRUSTED_TYPES)) or (
        isinstance(type(value), _TestClassMeta) and type(vars(type(value)).get("_factory_rkey")) is int)
_TRUSTED_CLASSES = {}


#: Protocols a handle's class goes without where the test's object has none (``callable(x)``, ``hasattr(x,
#: "__len__")`` and the ABCs' checks see no method, ``len(x)`` raises TypeError, as they would in-process).
_PROTOCOLS = ("__call__", "__len__", "__next__", "__iter__", "__contains__")
_LACKING_CLASSES = {}


def _lacking_class(kind, names):
    """``kind`` without the protocols ``names``: a class with ``kind``'s other members copied and no such method
    at all (a method set to None would still fill the type's slot: ``callable()`` true, ``len()`` calling None)."""
    if not names:
        return kind
    cls = _LACKING_CLASSES.get((kind, names))
    if cls is None:
        # an object with no __iter__ here has no __getitem__ either: iter() must not fall back to item access
        generic = vars(TrustedObject)
        dropped = {*names, *(("__getitem__",) if "__iter__" in names else ())}

        def ours(klass):
            return klass in _TRUSTED_TYPES or issubclass(klass, TrustedObject)

        namespace = {}
        for klass in reversed(kind.__mro__):
            if ours(klass):  # (a protocol a handle class defines itself, a coroutine's __next__, is kept)
                namespace.update((name, value) for name, value in vars(klass).items() if name not in (
                    "__slots__", "__dict__", "__weakref__", *TrustedObject.__slots__) and not (
                    name in dropped and value is generic.get(name)))
        namespace["__slots__"] = TrustedObject.__slots__
        bases = tuple(base for base in kind.__bases__ if not ours(base))  # (tzinfo's)
        cls = _LACKING_CLASSES[(kind, names)] = type(kind.__name__, bases, namespace)
        for abc in _STANDARD_ABCS.values():
            if issubclass(kind, abc):
                abc.register(cls)
        _TRUSTED_TYPES.add(cls)
    return cls


def _trusted_class(kind, names):
    """The class of a handle on a test's object whose class derives from the standard bases ``names``.

    An abstract base (``Mapping``, ``io.TextIOBase``) registers the handle
    class (isinstance holds; every method is still the test's own); a
    ``datetime.tzinfo`` is a real subclass, so ``datetime`` takes it, whose
    ``utcoffset``/``dst``/``tzname``/``fromutc`` run the test's.
    """
    cls = _TRUSTED_CLASSES.get((kind, names))
    if cls is not None:
        return cls
    own = vars(TrustedObject)
    namespace = {name: value for name, value in vars(kind).items() if name not in own or kind is TrustedObject}
    namespace = {name: value for name, value in {**own, **namespace}.items()
                 if name not in ("__slots__", "__dict__", "__weakref__") and name not in TrustedObject.__slots__}
    if "tzinfo" in names:
        def forward(name):
            def method(self, dt):
                return self._op("getattr", name=name)(dt)
            method.__name__ = name
            return method

        namespace.update({name: forward(name) for name in ("utcoffset", "dst", "tzname", "fromutc")})
        namespace["__eq__"] = lambda self, other: self is other
        namespace["__slots__"] = TrustedObject.__slots__
        cls = type(f"{kind.__name__}Zone", (datetime.tzinfo,), namespace)
    else:
        cls = type(kind.__name__, (kind,),
                   {"__slots__": (), "__module__": own["__module__"], "__doc__": own["__doc__"]})
        for name in names:
            if name in _STANDARD_ABCS:
                _STANDARD_ABCS[name].register(cls)
    _TRUSTED_CLASSES[(kind, names)] = cls
    _TRUSTED_TYPES.add(cls)
    return cls


class _TestDoc:
    """``__doc__`` of a stand-in of a test's class: on the class, the class's docstring (None, or text, as the
    trusted side reads it; toolz's curry copies it), and on one of its objects, the object's."""

    __slots__ = ()

    def __get__(self, obj, cls=None):
        if obj is not None:
            return obj._op("getattr", name="__doc__")
        key = vars(cls).get("_factory_rkey") if isinstance(cls, type) else None
        if type(key) is not int:
            return None
        try:
            doc = vars(cls)["_factory_server"].request("getattr", rh=key, name="__doc__")
        except AttributeError:  # (the trusted side gives text only: a class without a docstring has None)
            return None
        return doc if type(doc) is str else None


_TEST_DOC = _TestDoc()


class _TestClassMeta(abc.ABCMeta):
    """The metaclass of the stand-ins of the test's classes (:meth:`SolutionServer.test_class`): calling one
    makes an object of the test's class there (its handle here is an object of the stand-in), and its
    attributes are read there; what the solution derives from one is a class of its own."""

    def __call__(cls, *args, **kwargs):
        key = vars(cls).get("_factory_rkey")
        if type(key) is not int:
            return super().__call__(*args, **kwargs)
        return vars(cls)["_factory_server"].call_trusted(key, args, kwargs)

    def __getattr__(cls, name):
        key = vars(cls).get("_factory_rkey")
        if type(key) is not int or name.startswith("__"):
            raise AttributeError(name)
        return vars(cls)["_factory_server"].request("getattr", rh=key, name=name)

    @property
    def __signature__(cls):
        key = vars(cls).get("_factory_rkey")
        if type(key) is not int:
            return None
        server = vars(cls)["_factory_server"]
        described = server.request("signature", rh=key)
        if described == "descriptor":  # the test's class has a __signature__ property: that is what it reads
            return _SIGNATURE_DESCRIPTOR
        return _signature_of(described, server.value)

    def __repr__(cls):
        return f"<class '{cls.__module__}.{cls.__qualname__}'>"


def _handle_namespace(lacks):
    """A handle's members (:class:`TrustedObject`'s) without the protocols ``lacks``, for a class of its own."""
    dropped = {*lacks, *(("__getitem__",) if "__iter__" in lacks else ()), "__slots__", "__dict__", "__weakref__",
               *TrustedObject.__slots__}
    return {name: value for name, value in vars(TrustedObject).items() if name not in dropped}


class _SignatureDescriptor:
    """What a test's class whose ``__signature__`` is a property (toolz's ``AddX``) answers for
    ``cls.__signature__``: a descriptor, as in-process (``inspect.signature(cls)`` raises its TypeError, and
    ``hasattr(cls.__signature__, "__get__")`` holds). Bound to one of the test's objects it is that object's
    signature, asked of the trusted side; the test's getter itself never crosses."""

    __slots__ = ()

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if not _is_trusted_handle(obj):
            raise TypeError("the test's __signature__ property reads only the test's own objects")
        return obj.__signature__

    def __repr__(self):
        return "<the test's __signature__ property>"


_SIGNATURE_DESCRIPTOR = _SignatureDescriptor()


def _plain_value(value, depth=0):
    """Whether ``value`` is immutable plain data (a default the trusted side may show as its own copy)."""
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return type(value) not in (str, bytes) or len(value) <= 10_000
    return type(value) in (tuple, frozenset) and depth < 3 and len(value) <= 50 and all(
        _plain_value(item, depth + 1) for item in value)


def _signature_of(described, decode):
    """An ``inspect.Signature`` from the trusted side's plain-data description of a test's callable (``decode``
    rebuilds a default that crossed; one that did not is :data:`_HIDDEN_DEFAULT`)."""
    import inspect

    try:
        params, returns = described
        empty = inspect.Parameter.empty
        parameters = [inspect.Parameter(name, inspect._ParameterKind(kind),
                                        default=empty if not state else _HIDDEN_DEFAULT if state == 2
                                        else decode(default),
                                        annotation=annotation_of(annotation, empty))
                      for name, kind, state, default, annotation in params]
        return inspect.Signature(parameters, return_annotation=annotation_of(returns, inspect.Signature.empty))
    except (TypeError, ValueError, WireError) as exc:
        raise ValueError(f"the test's callable has no signature that crosses ({exc})") from None


class _HiddenDefault:
    """The default of a test function's parameter that is not plain data: it stays on the trusted side."""

    __slots__ = ()

    def __repr__(self):
        return "<a default of the test's>"


_HIDDEN_DEFAULT = _HiddenDefault()
#: A mirror's ``__signature__`` once the test's function has none (inspect.signature then raises TypeError).
_NO_SIGNATURE = _HiddenDefault()
#: ``inspect.Parameter`` kinds as they cross (the enum's values).
_POSITIONAL_ONLY, _POSITIONAL, _VAR_POSITIONAL, _KEYWORD_ONLY, _VAR_KEYWORD = range(5)


def _mirror_function(server, key, described):
    """A real function standing for a test's function (None if ``described`` is malformed).

    Generated from the plain-data description the trusted side sends (names,
    kinds, plain-data defaults, annotations as text, name, qualname, module,
    doc, generator or coroutine), so that ``inspect.signature``, ``getfullargspec``,
    ``functools.wraps`` and ``decorator``-style code see what they would see on
    the test's own function. Its code is ours: calling it forwards the
    arguments to the trusted side, where the test's function runs. A default
    that is not plain data is :data:`_HIDDEN_DEFAULT` here and is left out of
    the forwarded call, so the test's own default applies there.
    """
    try:
        made = parameters_from(described["params"], (0, 1, 2),
                               lambda state, default: server.value(default) if state == 1 else _HIDDEN_DEFAULT)
        if made is None:
            return None
        text, parameters, defaults, kwdefaults = made
        names, kinds = [p[0] for p in parameters], [p[1] for p in parameters]
        annotations = {p[0]: annotation_of(p[4], None) for p in parameters if annotation_of(p[4], None) is not None}
        flags = described.get("flags")
        call = f"_factory_forward(({''.join(n + ', ' for n in names)}))"
        body = {"gen": f"yield from {call}", "coro": f"return await {call}"}.get(flags, f"return {call}")
        source = f"{'async ' if flags == 'coro' else ''}def _factory_mirror({text}):\n    {body}\n"

        def forward(values):
            args, kwargs, skipped = [], {}, False
            for name, kind, value in zip(names, kinds, values):
                if kind == _VAR_POSITIONAL:
                    if value and skipped:
                        raise TypeError("a default of the test's function that is not plain data cannot be "
                                        "passed on before positional arguments")
                    args.extend(value)
                elif kind == _VAR_KEYWORD:
                    kwargs.update(value)
                elif value is _HIDDEN_DEFAULT:
                    skipped = True
                elif kind == _KEYWORD_ONLY or (kind == _POSITIONAL and skipped):
                    kwargs[name] = value
                elif kind == _POSITIONAL_ONLY and skipped:
                    raise TypeError("a default of the test's function that is not plain data cannot be passed on "
                                    "before a positional-only argument")
                else:
                    args.append(value)
            return server.call_trusted(key, args, kwargs)

        namespace = {"_factory_forward": forward, "__name__": str(described.get("module") or "")[:200]}
        exec(compile(source, "<a test's function>", "exec"), namespace)  # noqa: S102 -- our own template
        made = namespace["_factory_mirror"]
        made.__defaults__ = tuple(defaults) or None
        made.__kwdefaults__ = kwdefaults or None
        if annotation_of(described.get("ret"), None) is not None:
            annotations["return"] = annotation_of(described["ret"], None)
        made.__annotations__ = annotations
        for attribute in ("name", "qualname", "module", "doc"):
            value = described.get(attribute)
            if type(value) is str or (attribute == "doc" and value is None):
                setattr(made, f"__{attribute}__", value)
        return made
    except (KeyError, TypeError, ValueError, SyntaxError, WireError):
        return None


class _LogRelay(logging.Handler):
    """Keeps the solution's log records for the next message to the trusted side."""

    def __init__(self, server):
        super().__init__(logging.NOTSET)
        self.server = server

    def emit(self, record):
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.server.logs.append([str(record.name)[:200], int(record.levelno), message[:20_000],
                                 str(record.pathname)[:300], int(record.lineno or 0)])


#: Run-ahead of an iterator the test consumes (:meth:`SolutionServer.run_ahead`): at most this many items,
#: this many bytes and this many seconds of the copy's time per batch; the copy is killed past the last bound.
_AHEAD_ITEMS = 8192
_AHEAD_BYTES = 1 << 20
_AHEAD_SECONDS = 0.02
_AHEAD_KILL_SECONDS = 2.0
_AHEAD_CHUNK = 32

#: The last line a copy running ahead writes: its entries are complete.
_AHEAD_DONE = b"!\n"
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time, not a builtin type
#: Audit events a step of the copy may raise: this process's own business, invisible to the test.
_AHEAD_QUIET_EVENTS = frozenset({
    "object.__getattr__", "object.__setattr__", "object.__delattr__", "compile", "exec", "import",
    "sys._getframe", "sys._getframemodulename", "code.__new__", "function.__new__", "builtins.id",
    "marshal.loads", "marshal.dumps", "array.__new__", "gc.get_referrers", "gc.get_referents", "gc.get_objects",
    "os.putenv", "os.unsetenv", "pickle.find_class", "copyreg.__reduce_ex__"})
#: Modules whose C functions read or change the world outside this process (files, clocks, signals, ...);
#: a step calling one is not produced ahead. Their harmless functions are listed apart.
_AHEAD_WORLD_MODULES = frozenset({"posix", "nt", "time", "select", "signal", "fcntl", "resource", "_socket",
                                  "mmap", "termios", "_posixsubprocess", "faulthandler", "_thread", "msvcrt"})
_AHEAD_HARMLESS = frozenset({"fspath", "urandom", "cpu_count", "strerror", "getcwd", "putenv", "unsetenv",
                             "allocate_lock", "RLock", "get_ident", "get_native_id", "WIFEXITED", "WEXITSTATUS",
                             "WIFSIGNALED", "WTERMSIG"})


def _plain_data(data, depth=0):
    """Whether encoded ``data`` holds no handle and no side's own value tag (plain data and standard values)."""
    if type(data) is list:
        return depth < 50 and all(_plain_data(item, depth + 1) for item in data)
    if type(data) is dict:
        return depth < 50 and not any(key in HANDLE_KEYS or key in SIDE_TAGS for key in data) \
            and all(_plain_data(item, depth + 1) for item in data.values())
    return True


def _builtin_iterator(value):
    """Whether ``value`` is a generator or an iterator of a builtin type (its own iterator: ``iter`` runs no code)."""
    kind = type(value)
    try:
        return (kind is types.GeneratorType or not kind.__flags__ & _HEAP_TYPE) and hasattr(kind, "__next__") \
            and iter(value) is value
    except Exception:  # noqa: BLE001
        return False


#: Module attributes (functions, classes) whose handles the trusted side may reuse without asking, at most.
_CACHED_ATTRS = 512


class _Ahead(BaseException):
    """A step of the copy that runs ahead did something the test could see: that item is not produced ahead."""


def _clock_reader(function):
    """Whether ``function`` (a C function a step called) reads a clock of the datetime module."""
    owner = getattr(function, "__self__", None)
    return isinstance(owner, type) and issubclass(owner, datetime.date) and \
        getattr(function, "__name__", "") in ("now", "utcnow", "today", "fromtimestamp", "utcfromtimestamp")


def _ahead_watch(state):
    """The copy's audit hook and profile function: any effect outside the process, any read of the world
    (files, clocks, streams, sockets) during a step taints it (``state["tainted"]``)."""
    import _socket

    local_io = (io.BytesIO, io.StringIO)

    def audit(event, args):
        if state["active"] and event not in _AHEAD_QUIET_EVENTS:
            state["tainted"] = True
            raise _Ahead(event)

    def profile(frame, event, function):
        if event != "c_call" or not state["active"]:
            return
        owner = getattr(function, "__self__", None)
        if isinstance(owner, types.ModuleType):
            world = owner.__name__ in _AHEAD_WORLD_MODULES and \
                getattr(function, "__name__", "") not in _AHEAD_HARMLESS
        else:
            world = (isinstance(owner, (io.IOBase, _socket.socket)) and not isinstance(owner, local_io)) \
                or _clock_reader(function)
        if world:
            state["tainted"] = True

    return audit, profile


class SolutionServer(Endpoint):
    """Objects of the solution, kept by handle, and the operations on them."""

    def __init__(self, channel):
        super().__init__(channel, initiates=False)  # (its threads ask only while the test waits on it)
        self.objects = {}
        self.ids = {}
        self.trusted = {}
        self.mirrors = {}  # id of a mirror of a test's function -> its key (kept alive by self.trusted)
        self.mirror_reprs = {}  # key of a mirrored test function -> that function's repr there
        self.dataclass_mirrors = {}  # key of a test's dataclass instance -> its mirror here
        self.dataclass_keys = {}  # id of such a mirror -> the key
        self.dataclass_classes = {}  # (the test's class key, its field names) -> the mirror's class
        self.dataclass_trusted = {}  # key -> the handle on the test's object itself
        self.mirror_seen = {}  # key -> the test function's attributes when it last crossed
        self.mirror_signature = {}  # key -> the test function's signature when it last crossed
        self.test_modules = set()  # names of the tests' modules, as their classes and functions here state them
        # id of a mirror's __annotations__ -> (the test function's key, that dict, its items as made): the dict
        # (held, so its id is not reused) crosses back as the test function's own while it is unchanged
        self.mirror_annotations = {}
        self.described = {}  # key of a function of the solution -> its description (describe_function) or None
        self.standard = {}  # id -> (a standard library object the trusted side sent by name, that name)
        self.logs = []
        self.warns = []
        self.workspace_files = WorkspaceFiles(_WORKSPACE_ROOT)  # files made in the top folder, mirrored both ways
        self.base_env = dict(os.environ)
        self.outputs = []  # [(stream name, file, offset)]
        self.streams = []  # this process's own text streams on fds 1 and 2
        self.mirrored = {}  # (module, attribute) -> this side's value before the test's replaced it
        self.mirrored_as = {}  # (module, attribute) -> what the trusted side last sent for it
        self.speculating = None  # in a copy running an iterator ahead: its watch state (see run_ahead)
        self.ahead_failures = 0
        self.copies = []  # pids of run_ahead's copies, killed and not yet collected
        self.cached_attrs = {}  # (module key, name) -> (module, object): handles the trusted side reuses
        self.ahead_refused = []  # handles ({"h": key}) of iterators whose copy produced nothing ahead
        self.last_reply = None
        self.trusted_ahead = {}  # key of a test's iterator -> items the trusted side produced ahead from a copy
        self.trusted_taken = []  # [[key, count]] taken from them since the last message, in order
        self.trusted_streak = (None, 0)
        self.shared = Shared(owner=False)  # the test's containers this side holds (see Shared)
        self.kept = set()  # keys of those kept by the reply being sent (not released before the test hears of it)
        _SERVER[:] = [self]

    def exchange(self, request):
        if self.speculating is not None:  # a copy running ahead never asks the test: the item is not produced
            self.speculating["tainted"] = True
            raise _Ahead("a request to the trusted side")
        reply = self.last_reply = super().exchange(request)  # (the solution's threads take turns: Endpoint)
        return reply

    # ------------------------------------------------------------ relaying

    def capture(self):
        """Send fds 1 and 2 to files read back with every message: print, os.write and children alike."""
        try:
            for fd, name in ((1, "out"), (2, "err")):
                sink = tempfile.TemporaryFile()  # noqa: SIM115 -- open for the server's lifetime
                os.dup2(sink.fileno(), fd)
                self.outputs.append((name, sink, 0))
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
            self.streams = [sys.stdout, sys.stderr]
        except OSError:  # no writable temporary directory: output is not relayed, the rest still is
            pass
        logging.getLogger().addHandler(_LogRelay(self))
        logging.getLogger().setLevel(logging.DEBUG)  # the trusted side's loggers decide what is kept
        warnings.simplefilter("always")
        warnings.showwarning = self.keep_warning

    def keep_warning(self, message, category, filename, lineno, file=None, line=None):
        self.warns.append([self.encode(category), str(message)[:20_000], str(filename)[:300], int(lineno or 0)])

    def outgoing(self, message):
        # The trusted side first advances the test's iterators by what was taken from its runs ahead; the rest
        # is dropped (whatever this message leads to may change what the test's iterators would give).
        if self.trusted_taken:
            message["took"], self.trusted_taken = self.trusted_taken, []
        self.trusted_ahead.clear()
        files = self.workspace_files.changes()  # what the code wrote in its folder (the trusted side filters it)
        if files:
            message["files"] = files
        if self.shared.objects:  # what the code changed in the test's containers it holds, then those it let go
            states = self.shared.changes(self.encode)
            if states:
                message["shs"] = states
            gone = self.shared.released(self.kept)
            if gone:
                message["shd"] = gone
        self.kept = set()
        if self.shared.let_go:  # stand-ins of the test's value objects that are gone (see Shared.stand_in)
            message["vhd"], self.shared.let_go = self.shared.let_go, []
        if self.cached_attrs:  # a module attribute the trusted side reuses without asking, rebound since: forget it
            stale = [[key, name] for (key, name), (module, obj) in self.cached_attrs.items()
                     if vars(module).get(name, _MISSING) is not obj]
            if stale:
                message["stale"] = stale
                for key, name in stale:
                    del self.cached_attrs[key, name]
        if message.get("op") == "next" and "rh" in message:
            key = message["rh"]
            self.trusted_streak = (key, self.trusted_streak[1] + 1 if self.trusted_streak[0] == key else 1)
        else:
            self.trusted_streak = (None, 0)
        # (this process's own streams: sys.stdout may be the test's stream now, whose flush is a request)
        for stream in self.streams:
            try:
                stream.flush()
            except Exception:
                pass
        for position, (name, sink, offset) in enumerate(self.outputs):
            end = _fstat(sink.fileno()).st_size
            if end > offset:
                data = _pread(sink.fileno(), min(end - offset, _RELAY_LIMIT), offset)
                self.outputs[position] = (name, sink, end)
                message[name] = data.decode("utf-8", errors="replace")
        if self.logs:
            message["logs"], self.logs = self.logs[:1000], []
        if self.warns:
            message["warns"], self.warns = self.warns[:1000], []
        return message

    def apply_context(self, request):
        """The test's environment changes and working directory, before its call runs."""
        env = request.get("env")
        if type(env) is dict:
            wanted = dict(self.base_env)
            wanted.update({str(k): str(v) for k, v in (env.get("set") or {}).items()})
            for key in env.get("unset") or []:
                wanted.pop(str(key), None)
            for key in [k for k in os.environ if k not in wanted]:
                del os.environ[key]
            for key, value in wanted.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
        if "files" in request:  # what the test wrote in its folder since, before the code may read it
            self.workspace_files.apply(request.pop("files"))
        cwd = request.get("cwd")
        if type(cwd) is str:
            try:
                _chdir(cwd_from_wire(cwd, _WORKSPACE_ROOT))
            except OSError:
                pass  # a directory only the trusted sandbox has
        if type(request.get("mods")) is list:
            self.mirror_modules(request["mods"])

    def mirror_modules(self, entries):
        """The test's standard streams and its changes to standard modules (``os.isatty``, ``sys.argv``,
        ``builtins.input``), as the trusted side has them now: set on this process's modules, and the values
        they replaced put back once the test's are gone."""
        wanted = {}
        for entry in entries[:500]:
            if type(entry) is list and len(entry) == 4 and type(entry[0]) is str and type(entry[1]) is str:
                wanted[(entry[0], entry[1])] = (entry[2] is True, entry[3])
        for key in [key for key in self.mirrored if key not in wanted]:
            module, original = sys.modules.get(key[0]), self.mirrored.pop(key)
            self.mirrored_as.pop(key, None)
            if module is None:
                continue
            if original is _MISSING:
                module.__dict__.pop(key[1], None)
            else:
                setattr(module, key[1], original)
        for (name, attribute), (present, data) in wanted.items():
            if self.mirrored_as.get((name, attribute)) == (present, data):
                continue  # unchanged: whatever the solution made of it since stays
            module = sys.modules.get(name)
            if module is None and name.split(".")[0] in sys.stdlib_module_names:
                import importlib

                try:
                    module = importlib.import_module(name)
                except ImportError:
                    continue
            if module is None:
                continue
            try:
                value = self.value(data) if present else None
            except WireError:
                continue
            self.mirrored.setdefault((name, attribute), module.__dict__.get(attribute, _MISSING))
            self.mirrored_as[(name, attribute)] = (present, data)
            if present:
                setattr(module, attribute, value)
            else:
                module.__dict__.pop(attribute, None)

    # ------------------------------------------------------------ encoding

    def handle_of(self, obj, live=False):
        key = id(obj)
        if key not in self.ids:
            if self.speculating is not None:  # a copy's new handle would name nothing in this process
                raise _Ahead("a new handle")
            self.ids[key] = len(self.objects) + 1
            self.objects[self.ids[key]] = obj
        handle = {"h": self.ids[key], "type": type(obj).__name__}
        if live and type(obj) in _LIVE:
            handle["k"] = "live"
            handle["type"] = type(obj).__name__
            handle["v"] = self.encode(obj)
        elif isinstance(obj, types.ModuleType):
            handle["k"] = "module"
            handle["name"] = obj.__name__
            handle["package"] = hasattr(obj, "__path__")
            doc = vars(obj).get("__doc__")
            if type(doc) is str:
                handle["doc"] = doc[:20_000]  # the module's docstring, as data
        elif isinstance(obj, type):
            handle["k"] = "class"
            handle["name"] = obj.__qualname__
            try:
                doc = obj.__doc__  # (the class's docstring, as data)
            except Exception:
                doc = None
            if type(doc) is str:
                handle["doc"] = doc[:20_000]
            if issubclass(obj, BaseException):
                handle["exc"] = _builtin_exception_name(obj)
                handle["bases"] = [self.handle_of(base) for base in obj.__bases__
                                   if getattr(builtins, base.__name__, None) is not base]
            elif issubclass(obj, enum.Enum):
                handle["members"] = self.enum_members(obj)
        elif callable(obj):
            handle["k"] = "callable"
            handle["name"] = getattr(obj, "__qualname__", type(obj).__name__)
            if isinstance(obj, types.FunctionType):
                handle["bind"] = True  # a class attribute of the test's binds to its objects, as a function does
                described = self.describe_function(handle["h"], obj)
                if described is not None:
                    handle["fn"] = described  # a real function there (type(f) is FunctionType in a test)
        else:
            handle["k"] = "object"
            if isinstance(obj, types.CoroutineType):
                handle["await"] = "coro"  # asyncio.run() and a Task take it there; awaited here, in our loop
            elif isinstance(obj, collections.abc.Awaitable):
                handle["await"] = "obj"
            if isinstance(obj, datetime.tzinfo):
                handle["zone"] = True  # a time zone whose offset depends on the moment: a tzinfo there too
            if not type(obj).__flags__ & _HEAP_TYPE:  # a builtin type (a generator, map, zip): it cannot change
                if hasattr(type(obj), "__next__"):
                    handle["selfiter"] = True  # an iterator of its own: iter() returns it
                if not hasattr(type(obj), "__len__"):
                    handle["nolen"] = True  # list() asks len() first: refused here, not asked
        if handle.get("k") in ("callable", "object") and not isinstance(obj, types.FunctionType) and hasattr(
                type(obj), "__get__"):
            handle["get"] = True  # a descriptor: on a test's class, its __get__ runs here
        if not isinstance(obj, type) and _MIXED_KEYS.get(id(type(obj))) is not None:
            handle["mixed"] = _MIXED_KEYS[id(type(obj))]  # an object of a test's class: one there too
        return handle

    def describe_function(self, key, function):
        """A plain function of a module (``def f`` at its top level: no attributes, no ``__wrapped__``, not a
        generator or coroutine, only immutable plain-data defaults) as plain data, from which the trusted side
        builds a real function forwarding its calls here; None for any other (it stays a handle)."""
        if key in self.described:
            return self.described[key]
        self.described[key] = None
        try:
            import inspect

            code = function.__code__
            qualname = function.__qualname__
            if type(function) is not types.FunctionType or vars(function) or code.co_flags & 0x3A0 \
                    or type(qualname) is not str or "." in qualname or "<" in qualname:
                return None
            signature = inspect.signature(function, follow_wrapped=False)
            params = []
            for p in signature.parameters.values():
                if p.default is not p.empty and not _plain_value(p.default):
                    return None
                params.append([p.name, int(p.kind), p.default is not p.empty,
                               None if p.default is p.empty else self.encode(p.default),
                               annotation_text(p.annotation)])
            doc = function.__doc__
            self.described[key] = {
                "name": str(function.__name__), "qualname": qualname, "module": str(function.__module__),
                "doc": doc[:20_000] if type(doc) is str else None, "params": params,
                "ret": annotation_text(signature.return_annotation),
                "code": [str(code.co_filename)[:500], int(code.co_firstlineno)]}
        except Exception:  # (anything odd about it: a handle, as before)
            return None
        return self.described[key]

    def enum_members(self, cls):
        base = ("intflag" if issubclass(cls, enum.IntFlag) else "flag" if issubclass(cls, enum.Flag)
                else "int" if issubclass(cls, int) else "str" if issubclass(cls, str) else "")
        return {"base": base, "list": [[name, self.encode(member.value)]
                                       for name, member in cls.__members__.items()][:1000]}

    def objects_of(self, value, nested):
        """Value objects of the solution as snapshots; the test's handles and builtins by name."""
        kind = type(value)
        if _is_trusted_handle(value):
            return {"rh": object.__getattribute__(value, "_key")}
        if isinstance(value, type) and type(vars(value).get("_factory_rkey")) is int:
            return {"rh": vars(value)["_factory_rkey"]}
        if kind is types.FunctionType and id(value) in self.mirrors:
            return {"rh": self.mirrors[id(value)]}
        if id(value) in self.standard and self.standard[id(value)][0] is value:
            return {"std": self.standard[id(value)][1]}
        if id(value) in self.dataclass_keys and self.dataclass_mirrors.get(self.dataclass_keys[id(value)]) is value:
            return {"rh": self.dataclass_keys[id(value)]}  # a test's dataclass instance goes home
        if isinstance(value, enum.Enum) and isinstance(kind, enum.EnumMeta):
            # The member's own handle too: where the trusted side cannot rebuild the class, it keeps a handle.
            return {"en": [self.handle_of(kind), str(value.name), nested(value.value), self.handle_of(value)]}
        if _is_namedtuple(value):
            return {"nt": [self.handle_of(kind), kind.__name__, list(kind._fields), [nested(v) for v in value]]}
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and _generated_eq(kind):
            params = kind.__dataclass_params__
            fields = [f.name for f in dataclasses.fields(value) if f.compare]
            return {"dc": [self.handle_of(value), self.handle_of(kind), kind.__name__,
                           [[name, nested(getattr(value, name))] for name in fields],
                           bool(params.order), bool(params.frozen)]}
        if isinstance(value, datetime.tzinfo):
            return self.zone_of(value)
        array = _array_of(value)
        if array is not None:
            return array
        if kind.__name__ == "Namespace" and kind.__module__ == "argparse":  # parse_args()'s: its fields, a value
            return {"ns": [[str(name), nested(item)] for name, item in vars(value).items()]}
        if isinstance(value, BaseException):  # an exception as a value (a list of errors): the same as raised
            info = self.encode_exception(value)
            info.pop("exit", None)
            info["obj"] = self.handle_of(value)  # (passed back, it is this object again)
            return {"ex": info}
        found = _value_base(kind)
        if found is not None:
            return {"bv": [self.handle_of(value), self.handle_of(kind), kind.__name__, found[1],
                           nested(_builtin_contents(value, found[0])), _overridden(kind, found[0])]}
        if kind in (type, types.BuiltinFunctionType) and getattr(builtins, getattr(value, "__name__", ""),
                                                                  None) is value:
            return {"bi": value.__name__}
        return None

    def zone_of(self, zone):
        """A time zone class of the solution with a fixed offset, as ``{"tzo": [...]}`` (None: a handle)."""
        try:
            offset, name, dst = zone.utcoffset(None), zone.tzname(None), zone.dst(None)
            # the same answers in winter and summer, or its offset depends on the moment: a handle (a tzinfo
            # asked at each use on the trusted side)
            moments = [datetime.datetime(2000, month, 1, tzinfo=zone) for month in (1, 7)]
            fixed = all((zone.utcoffset(m), zone.tzname(m), zone.dst(m)) == (offset, name, dst) for m in moments)
        except Exception:
            return None
        if not fixed or type(offset) is not datetime.timedelta or (
                dst is not None and type(dst) is not datetime.timedelta):
            return None
        triple = [offset.days, offset.seconds, offset.microseconds]
        return {"tzo": [self.handle_of(zone), triple, str(name)[:60] if name is not None else None,
                        [dst.days, dst.seconds, dst.microseconds] if dst is not None else None]}

    def objects_from(self, tag, body, nested):
        """The side tags the trusted side sends: namedtuples, enum members, builtins and modules by name."""
        if tag == "bi":
            return getattr(builtins, body)
        if tag == "sx":
            return _standard_error(body) or Exception
        if tag == "ex":  # an exception object of the test's: one of its class here (args and all)
            if type(body) is not dict:
                raise WireError("malformed exception value")
            return self.exception_from(body)
        if tag == "mod":
            import importlib

            return importlib.import_module(body)
        if tag == "std":  # a class or function of the standard library, by name: this process's own
            import importlib

            found = importlib.import_module(body[0])
            for part in str(body[1]).split("."):
                found = getattr(found, part)
            self.standard[id(found)] = (found, body)  # sent back by name, it is the test's own object again
            return found
        if tag == "nt":
            cls = self.resolve(body[0]) if body[0] is not None else None
            values = [nested(v) for v in body[3]]
            if isinstance(cls, type) and issubclass(cls, tuple):
                return cls(*values)
            return collections.namedtuple(body[1], body[2])(*values)
        if tag == "en":
            cls = self.resolve(body[0])
            if type(body[1]) is str and body[1] in cls.__members__:
                return cls[body[1]]
            return cls(nested(body[2]))
        if tag == "dc":
            return self.resolve(body[0])
        if tag == "nd":
            import base64

            import numpy

            data = numpy.frombuffer(base64.b64decode(body[2]), dtype=numpy.dtype(body[0]))
            return data[0] if body[1] is None else data.reshape(body[1]).copy()
        if tag == "tdc":
            return self.dataclass_mirror(body, nested)
        if tag == "ns":
            import argparse

            return argparse.Namespace(**{str(name): nested(item) for name, item in body})
        if tag == "pk":  # a test's numpy/pandas object, pickled by the trusted side (never the other way)
            import base64
            import pickle

            return pickle.loads(base64.b64decode(body))
        raise WireError(f"unknown tag {tag!r}")

    def dataclass_mirror(self, body, nested):
        """A test's dataclass instance as a dataclass of this process (one per instance; its public fields as the
        test had them when it last crossed; any other attribute, a method, is asked of the test's object)."""
        handle, cls_handle, name, fields, flags = body
        trusted = self.resolve(handle)
        names = tuple(pair[0] for pair in fields)
        if not all(type(n) is str and n.isidentifier() and not keyword.iskeyword(n) for n in names) \
                or len(set(names)) != len(names):
            return trusted
        key = handle["rh"]
        mirror = self.dataclass_mirrors.get(key)
        if mirror is None:
            class_key = (cls_handle.get("rh"), names)
            cls = self.dataclass_classes.get(class_key)
            if cls is None:
                server = self

                def __getattr__(obj, attribute):
                    own = server.dataclass_keys.get(id(obj))
                    if own is None or attribute.startswith("__"):
                        raise AttributeError(attribute)
                    return getattr(server.dataclass_trusted[own], attribute)

                eq, order, frozen = (bool(flag) for flag in flags[:3])
                cls = dataclasses.make_dataclass(
                    "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(name)[:100]) or "TestValue",
                    list(names), namespace={"__getattr__": __getattr__}, eq=eq, order=order and eq, frozen=frozen)
                self.dataclass_classes[class_key] = cls
            mirror = object.__new__(cls)
            self.dataclass_mirrors[key] = mirror
            self.dataclass_keys[id(mirror)] = key
            self.dataclass_trusted[key] = trusted
        for field_name, data in fields:
            object.__setattr__(mirror, field_name, nested(data))
        return mirror

    def resolve(self, data):
        if "rh" in data:
            return self.trusted_proxy(data)
        try:
            return self.objects[data["h"]]
        except (KeyError, TypeError):
            raise WireError(f"unknown handle {data!r}") from None

    def trusted_proxy(self, data):
        key = data["rh"]
        if data.get("k") == "class" and type(data.get("exc")) is str and key not in self.trusted:
            self.trusted[key] = self.trusted_exception(key, data)
        described = data.get("fn") if type(data.get("fn")) is dict else None
        if key not in self.trusted:
            made = _mirror_function(self, key, described) if described is not None else None
            if made is not None:
                self.mirrors[id(made)] = key
                self.mirror_annotations[id(made.__annotations__)] = (key, made.__annotations__,
                                                                     dict(made.__annotations__))
                if type(described.get("repr")) is str:
                    self.mirror_reprs[key] = described["repr"][:1000]
            elif data.get("k") == "class" and type(data.get("sc")) is dict:
                made = self.test_class(key, data["sc"])
            stand_in = self.resolve(data["cls"]) if made is None and type(data.get("cls")) is dict \
                and "rh" in data["cls"] and data.get("k") in ("object", "callable") else None
            if isinstance(stand_in, _TestClassMeta) and type(vars(stand_in).get("_factory_rkey")) is int:
                made = object.__new__(stand_in)  # an object of the test's class: of its stand-in here
                TrustedObject.__init__(made, self, key, data.get("k"), data.get("name"))
                if data.get("eq") is True:
                    _CUSTOM_EQ.add(key)
            if made is None:
                kind = TrustedFunction if data.get("k") == "function" else TrustedObject
                if data.get("selfiter") is True and kind is TrustedObject:
                    kind = _SelfIterating  # a test's builtin iterator: iter() returns it, as there
                if data.get("await") in ("coro", "obj") and data.get("k") == "object":
                    kind = _TrustedCoroutine if data["await"] == "coro" else _TrustedAwaitable
                std = data.get("std")
                if type(std) is list and std:
                    kind = _trusted_class(kind, tuple(str(name) for name in std[:8]))
                lacks = data.get("lacks")
                if type(lacks) is list and lacks:
                    kind = _lacking_class(kind, tuple(n for n in _PROTOCOLS if n in lacks))
                made = kind(self, key, data.get("k"), data.get("name"))
                if data.get("eq") is True:
                    _CUSTOM_EQ.add(key)
            self.trusted[key] = made
            module = vars(made).get("__module__") if isinstance(made, _TestClassMeta) else \
                made.__module__ if type(made) is types.FunctionType else None
            if type(module) is str and len(self.test_modules) < 256 and all(
                    part.isidentifier() for part in module.split(".")):
                parts = module.split(".")  # (and the packages holding it: importing it imports them)
                self.test_modules.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        made = self.trusted[key]
        if type(data.get("cls")) is dict and "rh" in data["cls"] and isinstance(type(made), _TestClassMeta):
            self.resolve(data["cls"])  # (its class's registrations, as they are now)
        if isinstance(made, _TestClassMeta) and type(data.get("sc")) is dict \
                and type(data["sc"].get("abcs")) is list:  # the ABCs the test registered its class with since
            for name in data["sc"]["abcs"][:64]:
                if name in collections.abc.__all__ and not issubclass(made, getattr(collections.abc, name)):
                    getattr(collections.abc, name).register(made)
        if described is not None and id(made) in self.mirrors:
            self.refresh_mirror(key, made, described.get("attrs"))
            self.refresh_signature(key, made, described)
        return made

    def shown(self, text):
        """A repr or str the test asked for, with each mirror's own repr in it read as the test's function's
        (``Compose(<function f at 0x...>)`` shows the address of the function the test holds, not its mirror's)."""
        if type(text) is not str or " at 0x" not in text:
            return text
        for key, trusted in self.mirror_reprs.items():
            own = repr(self.trusted[key])
            if own in text:
                text = text.replace(own, trusted)
        return text

    def test_class(self, key, described):
        """A stand-in for a class of the test's (None where the description does not make one): a real class
        whose bases are the stand-ins of the test's bases and ``collections.abc``'s, registered with the
        standard ABCs the test's class is a subclass of, so that ``issubclass``, ``mro()``, ``type(obj)`` of the
        test's objects and dispatch on them work here as there. It holds no method of the test's: its objects
        are handles (:class:`TrustedObject`'s members, less the protocols the test's objects lack)."""
        try:
            bases = []
            for base in described["bases"][:32]:
                if type(base) is dict and base.get("abc") in collections.abc.__all__:
                    bases.append(getattr(collections.abc, base["abc"]))
                    continue
                parent = self.resolve(base) if type(base) is dict and "rh" in base else None
                if not (isinstance(parent, _TestClassMeta) and type(vars(parent).get("_factory_rkey")) is int):
                    return None
                bases.append(parent)
            lacks = [name for name in _PROTOCOLS if name in described["lacks"]]
            namespace = _handle_namespace(lacks)  # (no slots: its MRO is the test's, with no root of ours)
            namespace.update({"_factory_rkey": key, "_factory_server": self, "__doc__": _TEST_DOC,
                              "__module__": str(described["module"])[:200],
                              "__qualname__": str(described["qualname"])[:200]})
            cls = _TestClassMeta(str(described["name"])[:200], tuple(bases), namespace)
            cls.__abstractmethods__ = frozenset()  # (its objects are made as handles, never abstract)
            for name in described["abcs"][:64]:
                if name in collections.abc.__all__:
                    getattr(collections.abc, name).register(cls)
            for name in described["std"][:16]:
                if name in _STANDARD_ABCS:
                    _STANDARD_ABCS[name].register(cls)
            return cls
        except (KeyError, TypeError, ValueError, AttributeError, WireError):
            return None

    def refresh_signature(self, key, mirror, described):
        """The test function's signature as it is now, where it changed since the mirror was made (the test set
        ``__signature__``): the mirror's ``__signature__``; one that no longer resolves makes
        ``inspect.signature`` raise ``TypeError`` here."""
        now = [described.get("params"), described.get("ret"), described.get("sigerr")]
        if key not in self.mirror_signature:
            self.mirror_signature[key] = now
            return
        if now == self.mirror_signature[key]:
            return
        self.mirror_signature[key] = now
        if now[2] is not None:
            mirror.__signature__ = _NO_SIGNATURE
            return
        try:
            mirror.__signature__ = _signature_of(now[:2], self.value)
        except ValueError:
            mirror.__signature__ = _NO_SIGNATURE

    def trusted_exception(self, key, data):
        """A stand-in class for an exception class of the test (raised and caught here as that class)."""
        base = getattr(builtins, data["exc"], None)
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = Exception
        bases = []
        for handle in data.get("bases") or []:
            parent = self.resolve(handle) if type(handle) is dict and "rh" in handle else None
            if isinstance(parent, type) and issubclass(parent, Exception) and "_factory_rkey" in vars(parent):
                bases.append(parent)
        if not any(issubclass(parent, base) for parent in bases):
            bases.append(base)
        name = str(data.get("cname") or "TestError")
        try:
            return type(name, tuple(bases), {"_factory_rkey": key, "__module__": "tests"})
        except TypeError:  # (bases whose layouts conflict)
            return type(name, (base,), {"_factory_rkey": key, "__module__": "tests"})

    def refresh_mirror(self, key, mirror, attrs):
        """The test function's public attributes, as the test last set them, into its mirror.

        The solution's own writes (``func.pattern = ...`` by a decorator) stay
        in the mirror, never on the test's function; an attribute the test set
        or changed since the function last crossed wins over them (the later
        write, as in one process), and one the test deleted goes.
        """
        if type(attrs) is not list:
            return
        seen = self.mirror_seen.get(key, {})
        current = {}
        for pair in attrs[:100]:
            if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or not pair[0].isidentifier():
                continue
            name, data = pair
            current[name] = data
            if name not in seen or seen[name] != data:
                try:
                    mirror.__dict__[name] = self.value(data)
                except WireError:
                    current.pop(name)
        for name in seen:
            if name not in current:
                mirror.__dict__.pop(name, None)
        self.mirror_seen[key] = current

    def value(self, data, refs=None):
        return decode_value(data, self.resolve, refs=refs, objects=self.objects_from, shared=self.shared)

    def encode(self, value, refs=None, record=False):
        return encode_value(value, self.handle_of, refs=refs, record=record, objects=self.objects_of,
                            shared=self.shared)

    def encode_exception(self, exc, depth=0):
        cls = type(exc)
        builtin = getattr(builtins, cls.__name__, None) is cls
        try:
            message = str(exc)
        except Exception:
            message = f"<unprintable {cls.__name__}>"
        rkey = vars(cls).get("_factory_rkey")  # the stand-in of a test's class: that class, there
        info = {"type": cls.__name__ if builtin else _builtin_exception_name(cls), "builtin": builtin,
                "cls": None if builtin else {"rh": rkey} if type(rkey) is int else self.handle_of(cls),
                "message": message[:2000]}
        token = getattr(exc, "_factory_token", None)
        if type(token) is int:
            info["token"] = token
        if exc.__suppress_context__ is True:
            info["suppress"] = True
        module = getattr(cls, "__module__", None)
        if not builtin and type(module) is str and module.split(".")[0] in sys.stdlib_module_names:
            info["std"] = [module, cls.__qualname__]  # the trusted side raises its own class of that name
        if isinstance(exc, SystemExit):  # (a CLI's main() calling sys.exit: the test may catch it, code and all)
            code = exc.code
            info["exit"] = [code if code is None or type(code) in (bool, int, str) else str(code)]
        try:
            info["args"] = [self.encode(a) for a in exc.args[:20]]
        except Exception:  # args that cannot cross: the message stands for them
            pass
        attrs = []
        for name, value in list(getattr(exc, "__dict__", {}).items())[:50]:  # (``exc.errors``, ``exc.line_number``)
            if type(name) is str and not name.startswith("_"):
                try:
                    attrs.append([name, self.encode(value)])
                except Exception:
                    continue
        if attrs:
            info["attrs"] = attrs
        cause = exc.__cause__
        if cause is not None and depth < _CAUSE_DEPTH:  # ``raise ... from exc``: its cause, as an exception too
            try:
                info["cause"] = self.encode_exception(cause, depth + 1)
            except Exception:  # (a cause that cannot be described: the exception crosses without it)
                pass
        return info

    # ------------------------------------------------------------ requests to the trusted side

    def request(self, op, **fields):
        """Ask the trusted side (an operation on one of its objects); raise what it raised."""
        reply = self.exchange({"op": op, **fields})
        return self.result(reply, None)

    def call_trusted(self, key, args, kwargs):
        refs = Refs()
        reply = self.exchange({"op": "call", "rh": key,
                               "a": [self.encode(a, refs, True) for a in args],
                               "k": [[str(k), self.encode(v, refs, True)] for k, v in kwargs.items()]})
        return self.result(reply, refs)

    def result(self, reply, refs):
        if refs is not None and reply.get("wb"):
            from_wire = self.value

            write_back(refs, reply["wb"], lambda data: from_wire(data, refs))
        if "exc" in reply:
            raise self.exception_from(reply["exc"])
        return self.value(reply.get("ok"), refs)

    def exception_from(self, info):
        """An exception of the test's, as the trusted side describes it (see ``SolutionClient.exception_info``):
        a builtin or standard class by name, a stand-in for a test's class, the class itself for one of ours."""
        info = info if type(info) is dict else {}
        message = str(info.get("message", ""))
        base = getattr(builtins, str(info.get("type")), None)
        if not (isinstance(base, type) and issubclass(base, BaseException)):
            base = Exception
        args = (message,)
        if type(info.get("args")) is list:
            args = tuple(self.value(a) for a in info["args"][:20])
        try:
            exc = (_standard_error(info.get("std")) or base)(*args)
        except TypeError:  # (a class wanting other arguments: json.JSONDecodeError)
            exc = base(message)
        cls = info.get("cls")
        if type(cls) is dict and ("rh" in cls or "h" in cls):  # the test's own class (its stand-in here), or ours
            own = self.resolve(cls)
            if isinstance(own, type) and issubclass(own, Exception):
                try:
                    exc = own(*args)
                except Exception:  # noqa: BLE001 -- a constructor wanting other arguments: its args only
                    exc = BaseException.__new__(own, *args)
        if type(info.get("token")) is int:
            exc._factory_token = info["token"]
        return exc

    # ------------------------------------------------------------ requests from the trusted side

    def dispatch(self, request, refs):
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
            args = [self.value(a, refs) for a in request["a"]]
            kwargs = {name: self.value(v, refs) for name, v in request["k"]}
            refs.before = container_states(refs, self.nested_encoder(refs))
            return target(*args, **kwargs)
        if op == "callmethod":
            args = [self.value(a, refs) for a in request["a"]]
            refs.before = container_states(refs, self.nested_encoder(refs))
            return getattr(target, request["name"])(*args)
        if op == "snapshot":
            if type(target) not in _LIVE:
                raise TypeError("not a container")
            return target
        if op == "members":
            return self.enum_members(target)
        if op == "len":
            return len(target)
        if op == "bool":
            return bool(target)
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "get":  # a descriptor's own __get__, with the arguments the trusted side's lookup gave it
            values = request.get("a")
            if type(values) is not list or not 1 <= len(values) <= 2:
                raise WireError("malformed __get__")
            return type(target).__get__(target, *[self.value(value) for value in values])
        if op == "str":
            return self.shown(str(target))
        if op == "repr":
            return self.shown(repr(target))
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
        if op == "issubclass":
            return isinstance(target, type) and issubclass(target, self.resolve(request["cls"]))
        if op == "binop":  # arithmetic the solution's objects define (+, -, *, ...): their own semantics
            import operator

            function = getattr(operator, request["name"])
            other = self.value(request["v"])
            return function(other, target) if request.get("reflected") else function(target, other)
        if op == "compare":  # a comparison the trusted side lets this object's own class decide: one side only
            name = request.get("name")
            if name not in ("eq", "ne", "lt", "le", "gt", "ge"):
                raise WireError(f"unknown comparison {str(name)[:20]!r}")
            result = getattr(type(target), f"__{name}__")(target, self.value(request["v"]))
            return [] if result is NotImplemented else [result]
        if op == "hash":
            return hash(target)
        if op == "await":  # the test awaits an awaitable of ours: run here to its end, in our event loop
            return _run_to_end(target, self)
        if op == "exit":  # the test's exception raised in a ``with`` block of ours: __exit__ sees it, and may
            exc = self.exception_from(request.get("exc"))  # suppress it (True) or raise another (or this one)
            return bool(type(target).__exit__(target, type(exc), exc, None))
        if op == "bvalue":  # the builtin value inside an object that crosses as one, as it is now
            found = _value_base(type(target))
            if found is None:
                raise TypeError("not a builtin value")
            return _builtin_contents(target, found[0])
        if op == "unop":
            import operator

            return getattr(operator, request["name"])(target)
        if op == "subclass":
            return self.subclass(request)
        if op == "superattr":  # super().name past a test's override: the MRO from the given class on
            cls, name = self.resolve(request["cls"]), str(request["name"])
            owner = target if isinstance(target, type) else type(target)
            mro = owner.__mro__
            if cls not in mro:
                raise TypeError(f"super(): {type(target).__name__} is not a {getattr(cls, '__name__', cls)!r}")
            for klass in mro[mro.index(cls):]:
                if name in vars(klass):
                    attr = vars(klass)[name]
                    get = getattr(type(attr), "__get__", None)
                    if get is None:
                        return attr
                    return get(attr, None, target) if target is owner else get(attr, target, owner)
            raise AttributeError(f"'super' object has no attribute {name!r}")
        if op == "pickle":
            return _pickle(target, int(request.get("protocol", 4)))
        if op == "unpickle":
            import pickle

            data = self.value(request["data"])
            if type(data) is not bytes:
                raise TypeError("unpickle needs bytes")
            return pickle.loads(data)
        if op == "copy":
            import copy

            return copy.deepcopy(target) if request.get("deep") else copy.copy(target)
        if op == "dir":
            return sorted(str(name) for name in dir(target))
        if op == "code":  # what inspect reads of a function's code object, as plain data
            code = target.__code__
            return [code.co_flags & 0x3A0, str(code.co_filename)[:500], str(code.co_name)[:200],
                    int(code.co_firstlineno), [str(name)[:200] for name in code.co_varnames[:255]],
                    [code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags & 0x0C]]
        if op == "signature":  # inspect.signature of a callable of the solution, as plain data
            import inspect

            signature = inspect.signature(target)
            return [[[p.name, int(p.kind), p.default is not p.empty, None if p.default is p.empty else p.default,
                      annotation_text(p.annotation)] for p in signature.parameters.values()],
                    annotation_text(signature.return_annotation)]
        if op == "owndict":  # a module's or class's own namespace: one entry, or its names
            namespace = vars(target)
            if request.get("name") is None:
                return sorted(str(name) for name in namespace)
            return namespace[request["name"]]
        raise WireError(f"unknown operation {op!r}")

    def subclass(self, request):
        """This process's half of a test's class deriving from solution classes; returns its handle's key.

        Each member the test's class defines is a forwarder to the test's own
        (run on the trusted side); everything else is inherited from the
        solution's classes, whose metaclass and ``__init_subclass__`` run here.
        """
        bases = tuple(self.value(b) for b in request["bases"])
        if not bases or not all(isinstance(b, type) for b in bases):
            raise TypeError("a test's class can only derive from classes of the solution")
        members = {}
        for name, kind, parts in request["members"]:
            values = [self.value(part) for part in parts]
            if kind == "static":
                members[name] = staticmethod(values[0])
            elif kind == "class":
                members[name] = classmethod(values[0])
            elif kind == "property":
                members[name] = property(*values)
            else:
                members[name] = values[0]
        if "slots" in request:
            members["__slots__"] = tuple(self.value(request["slots"]))
        members["__module__"] = str(request["module"])
        members["__qualname__"] = str(request["qualname"])
        keywords = {str(k): self.value(v) for k, v in request["kw"]}
        cls = types.new_class(str(request["name"]), bases, keywords, lambda namespace: namespace.update(members))
        key = self.handle_of(cls)["h"]
        _MIXED_KEYS[id(cls)] = key
        _MIXED_CLASSES[key] = cls
        return key

    def serve_one(self, request):
        self.catch_up(request)
        self.apply_context(request)
        refs, made = Refs(), None
        try:
            if "sha" in request:  # (a request the serving loop took: incoming() did not see it)
                self.adopt(request.pop("sha"))
            if "shs" in request:
                self.shared.apply(request.pop("shs"), self.value)
            result = made = self.dispatch(request, refs)
            op = request.get("op")
            test_owned = id(result) in self.shared.keys  # the test's own container: it crosses back as itself
            annotations = self.mirror_annotations.get(id(result)) if type(result) is dict else None
            if annotations is not None and annotations[1] is result and result == annotations[2]:
                # A mirror's __annotations__ as made (``functools.wraps``, ``decorator`` copy the dict itself):
                # the test's function's own dict there (``wrapper.__annotations__ is f.__annotations__``)
                value = {"ann": annotations[0]}
            elif type(result) in _LIVE and not test_owned and (op in ("getattr", "getitem") or (
                    op == "callmethod" and (result is self.resolve(request["h"]) or request.get("name") in (
                        "__getitem__", "get", "setdefault")))):
                # module state, an object's items (``config["a"].append(x)``): a live handle, not a copy
                value = self.handle_of(result, live=True)
            else:
                value = self.encode(result, refs)
            reply = {"ok": value}
        except WireError as exc:
            reply = {"exc": {"type": "TypeError", "builtin": True, "cls": None, "message": str(exc)}}
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: they cross as errors
            try:
                reply = {"exc": self.encode_exception(exc)}
            except BaseException:
                reply = {"exc": {"type": "Exception", "builtin": True, "cls": None,
                                 "message": "the solution raised an exception that could not be described"}}
        if request.get("op") == "getattr" and type(reply.get("ok")) is dict and reply["ok"].get("k") in (
                "callable", "class") and len(self.cached_attrs) < _CACHED_ATTRS:
            # A module's function or class: the trusted side may reuse the handle until the name is rebound
            # (outgoing() says so with the next message; nothing runs here between messages).
            module, name = self.resolve(request["h"]), request.get("name")
            if type(module) is types.ModuleType and type(name) is str and name in vars(module):
                self.cached_attrs[request["h"].get("h"), name] = (module, vars(module)[name])
                reply["cache"] = True
        whole = request.get("whole")
        if request.get("op") == "next" and "ok" in reply and type(whole) is int:
            reply["rest"] = self.run_whole(self.resolve(request["h"]), min(whole, _AHEAD_ITEMS) - 1, reply["ok"])
        elif request.get("op") == "call" and type(whole) is int and type(reply.get("ok")) is dict \
                and "h" in reply["ok"] and _builtin_iterator(made):
            reply["rest"] = self.run_whole(made, min(whole, _AHEAD_ITEMS), None)  # (its first items, with it)
        ahead = request.get("ahead")
        if request.get("op") == "next" and "ok" in reply and type(ahead) is int \
                and request.get("h") not in self.ahead_refused:
            try:
                reply["more"] = self.run_ahead(self.resolve(request["h"]), min(ahead, _AHEAD_ITEMS) - 1)
            except Exception:  # noqa: BLE001 -- no items ahead; the one asked for is answered
                reply["more"] = []
            if not reply["more"]:  # its steps are not to be run ahead (or its copy hung): never forked again
                self.ahead_refused.append(request.get("h"))
        if refs.objects:
            try:
                reply["wb"] = states_of(refs, getattr(refs, "before", []), self.nested_encoder(refs))
            except BaseException:
                pass
            result = None  # (what the call returned holds no argument now: only what the code keeps does)
            for index in retained(refs):  # the arguments the code kept (a cache dict): shared from now on
                if id(refs.objects[index]) not in self.shared.keys and self.shared.room(refs.objects[index]):
                    reply.setdefault("keep", []).append(index)  # (under the next keys, on both sides)
                    self.kept.add(self.shared.add(refs.objects[index]))
        return reply

    # ------------------------------------------------------------ run-ahead of iterators

    def trusted_next(self, key):
        """``next()`` of a test's iterator: an item the trusted side produced ahead (from a copy of a builtin
        iterator the test no longer holds), or a request; see ``SolutionClient.clone_ahead``."""
        queue = self.trusted_ahead.get(key)
        if queue:
            entry = queue.popleft()
            if self.trusted_taken and self.trusted_taken[-1][0] == key:
                self.trusted_taken[-1][1] += 1
            else:
                self.trusted_taken.append([key, 1])
            if "end" in entry:
                raise StopIteration
            return decode_item(entry, self.value)
        streak = self.trusted_streak[1] if self.trusted_streak[0] == key else 0
        ask = min(64 * 4 ** (streak - 1), 4096) if streak >= 1 else 0
        value = self.request("next", rh=key, **({"ahead": ask} if ask else {}))
        more = self.last_reply.get("more") if ask and type(self.last_reply) is dict else None
        if type(more) is list and more:
            self.trusted_ahead[key] = collections.deque(more)
        return value

    def incoming(self, message):
        if type(message) is dict and "took" in message:
            self.catch_up(message)
        if type(message) is dict and "files" in message:
            self.workspace_files.apply(message.pop("files"))
        if type(message) is dict and "sha" in message:  # (before the states, which may name them)
            self.adopt(message.pop("sha"))
        if type(message) is dict and "shs" in message:  # what the test changed in its containers held here
            self.shared.apply(message.pop("shs"), self.value)
        return message

    def adopt(self, keys):
        """This process's module containers the test now holds as real ones (the trusted side's
        ``SolutionClient.adopt``): shared under ``-handle``, so changes either side makes are synced."""
        if type(keys) is not list:
            raise WireError("malformed adoptions")
        for key in keys[:64]:
            target = self.objects.get(key) if type(key) is int and key > 0 else None
            if type(target) in _LIVE and id(target) not in self.shared.keys and -key not in self.shared.objects:
                self.shared.add(target, -key)

    def catch_up(self, message):
        """Advance this process's iterators by the items the test took from their runs ahead, in its order.

        Called before anything else a message asks or answers: what the test can observe of this process
        (module state, an iterator's position, a generator's ``close()``) is then exactly where in-process
        consumption would have left it; the values were computed by a copy (:meth:`run_ahead`).
        """
        took = message.pop("took", None)
        if type(took) is not list:
            return
        for entry in took[:100_000]:
            if type(entry) is not list or len(entry) != 2 or type(entry[1]) is not int:
                continue
            target = self.objects.get(entry[0])
            for _ in range(min(entry[1], _AHEAD_ITEMS)):
                try:
                    next(target)
                except BaseException:  # the copy's items ended here too, unless the iterator is not deterministic
                    break

    def run_whole(self, target, count, first):
        """Up to ``count`` further items of ``target``, produced by this process's own iterator, for a builtin of
        the test's that consumes it to its end running no test code between items (``list(gen(n))``: see
        ``_whole_consumer`` on the trusted side). Its steps run here, in order, as in-process: what they print,
        log or ask the test happens as it would. The batch ends after an item that is not plain data (what the
        consumer does with it may ask this process), after the exception that ends the iterator (an ``end``
        entry), or when it is long enough.
        """
        import time

        entries = []
        if count < 1 or (first is not None and not _plain_data(first)):
            return entries
        started, size = time.thread_time(), 0
        while len(entries) < count and size < _AHEAD_BYTES and time.thread_time() - started < _AHEAD_SECONDS:
            try:
                entry = encode_item(next(target), self.encode)
            except WireError as exc:  # the item cannot cross: that next() fails, as when asked alone
                entries.append({"end": {"type": "TypeError", "builtin": True, "cls": None, "message": str(exc)}})
                break
            except BaseException as exc:  # StopIteration, or the iterator's own error: the consumer gets it
                try:
                    entries.append({"end": self.encode_exception(exc)})
                except BaseException:
                    entries.append({"end": {"type": "Exception", "builtin": True, "cls": None,
                                            "message": "the solution raised an exception that could not be described"}})
                break
            entries.append(entry)
            if not _plain_data(entry):
                break
            size += 16 if "i" not in entry else 64
        return entries

    def run_ahead(self, target, count):
        """Up to ``count`` further items of ``target``, produced by a forked copy of this process.

        This process does not advance: the trusted side hands the items to the test one ``next()`` at a time
        and reports how many it took with its next message (:meth:`catch_up`). The copy stops before the
        first item whose step would make a request to the trusted side (a test's object), print, log or
        warn, touch the world outside the process (audit events: files, processes, sockets, sleeping) or read
        it (files, clocks, streams: C calls seen by a profile function), return an object that would need a
        new handle, or raise anything but ``StopIteration`` (which ends the run, as an ``end`` entry). Output
        of the copy goes nowhere: its descriptors are closed but the result pipe.

        Returns:
            The entries (``{"i": value}`` or ``{"end": exception}``), possibly none.
        """
        if count < 1 or self.ahead_failures >= 3:
            return []
        import select
        import time

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        random = sys.modules.get("random")  # it reseeds itself in a forked child: the copy gets this state back
        rng = random.getstate() if random is not None else None
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            self.ahead_failures += 1
            os.close(read_end)
            os.close(write_end)
            return []
        if pid == 0:
            try:
                os.close(read_end)
                if rng is not None:
                    random.setstate(rng)
                self.produce_ahead(target, count, write_end)
            finally:
                with contextlib.suppress(OSError):
                    os.write(write_end, _AHEAD_DONE)  # (read as the end: no wait for this process's exit)
                os._exit(0)
        os.close(write_end)
        data = bytearray()
        deadline = time.monotonic() + _AHEAD_KILL_SECONDS
        try:
            while len(data) <= 2 * _AHEAD_BYTES and not data.endswith(_AHEAD_DONE):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([read_end], [], [], left)[0]:
                    break
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(read_end)
            try:
                os.kill(pid, 9)
            except OSError:
                pass
            self.copies.append(pid)
            self.reap_copies()
        import json

        entries = []
        for line in bytes(data).split(b"\n")[:-1]:  # complete chunks only: a killed copy's last may be cut
            if line != _AHEAD_DONE[:-1]:
                entries.extend(json.loads(line))
        return entries[:count]

    def reap_copies(self):
        """Collect the copies of :meth:`run_ahead` that have exited (killed; waited for only once gone, so a
        run ahead does not also wait for its copy's exit)."""
        for pid in list(self.copies):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0] != 0
            except ChildProcessError:
                done = True
            if done:
                self.copies.remove(pid)

    def produce_ahead(self, target, count, out):
        """In the forked copy: write the entries of :meth:`run_ahead`, one JSON line each, to ``out``."""
        import json
        import time

        sink = os.open(os.devnull, os.O_RDONLY)
        try:
            detect = os.memfd_create("ahead")  # the copy's output, only to see that there was some
        except (AttributeError, OSError):
            detect = os.dup(tempfile.TemporaryFile().fileno())  # noqa: SIM115
        os.dup2(detect, 1)
        os.dup2(detect, 2)
        os.dup2(sink, 0)
        try:  # the descriptors open (closing each possible one is 65536 system calls)
            open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
        except (OSError, ValueError):
            open_fds = range(3, 1 << 16)
        for fd in open_fds:
            if fd > 2 and fd != out:
                with contextlib.suppress(OSError):
                    os.close(fd)
        state = {"active": False, "tainted": False}
        audit, profile = _ahead_watch(state)
        sys.addaudithook(audit)
        self.speculating = state
        started, written, chunk = time.thread_time(), 0, []  # its own CPU time: a loaded machine still gets items

        def send(entries):
            view = memoryview(json.dumps(entries, separators=(",", ":")).encode() + b"\n")
            while view:
                view = view[os.write(out, view):]

        logs, warns = len(self.logs), len(self.warns)
        for _ in range(count):
            end = None
            sys.setprofile(profile)  # only around the step: the copy's own work is not watched
            state["active"] = True
            try:
                item = next(target)
            except StopIteration as exc:
                end = exc
            except BaseException:
                break
            finally:
                state["active"] = False
                sys.setprofile(None)
            if state["tainted"]:
                break
            try:
                entry = {"end": self.encode_exception(end)} if end is not None else encode_item(item, self.encode)
            except BaseException:  # a new handle, or a value that cannot cross
                break
            chunk.append(entry)
            written += 16 if type(entry.get("i")) is not dict else 64
            last = end is not None or written > _AHEAD_BYTES or time.thread_time() - started > _AHEAD_SECONDS
            if last or len(chunk) >= _AHEAD_CHUNK:
                # Output, logs and warnings are looked for once per chunk: a chunk with any is dropped whole.
                if not self.quiet_since(logs, warns):
                    return
                send(chunk)
                chunk = []
            if last:
                return
        if chunk and self.quiet_since(logs, warns):
            send(chunk)

    def quiet_since(self, logs, warns):
        """In the copy: whether its steps so far printed, logged and warned nothing."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                return False
        return len(self.logs) == logs and len(self.warns) == warns and not os.fstat(1).st_size \
            and not os.fstat(2).st_size

    def nested_encoder(self, refs):
        return lambda item: self.encode(item, refs)

    def serve(self):
        try:
            while True:
                try:
                    request = self.channel.receive()  # (no request is in progress: no other thread reads)
                except EOFError:
                    return
                self.serve_request(request, nested=False)
        finally:
            self.close()  # the solution's threads waiting to call the test give up


def serve_connection(channel, paths):
    """Serve the one trusted peer on ``channel``: output capture first, then agent code becomes importable.

    The workspace ``paths`` go on ``sys.path`` only now, after the peer is
    connected, and last: nothing in the workspace shadows the standard
    library or an installed package. :mod:`._program_server` calls this in
    the child it forks for each connection.
    """
    server = SolutionServer(channel)
    server.capture()
    sys.path.extend(os.path.abspath(root) for root in paths)
    sys.meta_path.append(_TestModuleFinder())  # (last: a module of the solution's own is found first)
    server.serve()
