"""Honest test patterns carried across the import boundary, and attacks on each new crossing.

Every case is a small task verified by the real isolated ``tests`` verifier
on bwrap (two sandboxes: pytest and the tests in one, the solution in the
other). Honest solutions must pass; a hostile solution that tries to reach
the trusted side through what crosses (the test's callables and objects,
write-back, value objects, output relay, decorators) must never pass.
"""

from __future__ import annotations

import shutil
import textwrap

import pytest

from factory.sandbox import SandboxLimits
from factory.tasks import Task
from factory.verifiers import BranchOutput, Criterion, TestsVerifier, VerifyContext, run_verifier
from tests import _verify_loop

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def verify(tests: str, solution: str, timeout_s: float = 60.0):
    """The isolated verdict of ``solution`` (lib.py) against ``tests`` (test_lib.py)."""
    task = Task(id="boundary", prompt="Write lib.py.", files={"lib.py": ""},
                tests={"test_lib.py": textwrap.dedent(tests)})
    verifier = TestsVerifier(timeout_s=timeout_s, reference_sandbox="bwrap", limits=SandboxLimits(timeout_s=timeout_s))
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None,
                        workspace={**task.tests, "lib.py": textwrap.dedent(solution)})
    return _verify_loop.run(run_verifier(verifier, ctx))


# ----------------------------------------------------------------------------------------------- honest patterns

HONEST = {
    "key-function-and-lambda": (
        """
        def stable_sort(items, key):
            return sorted(items, key=key)
        """,
        """
        from lib import stable_sort
        import operator

        def test_lambda_key():
            assert stable_sort([(2, "a"), (1, "b"), (2, "c")], key=lambda p: p[0]) == [(1, "b"), (2, "a"), (2, "c")]

        def test_stdlib_key():
            assert stable_sort(["b", "A", "c"], key=str.lower) == ["A", "b", "c"]
            assert stable_sort([(1, 3), (2, 1)], key=operator.itemgetter(1)) == [(2, 1), (1, 3)]
            assert stable_sort(["ccc", "a", "bb"], key=len) == ["a", "bb", "ccc"]
        """),
    "quadrature-and-root-finding": (
        """
        def simpson(f, a, b, n=100):
            h = (b - a) / n
            total = f(a) + f(b) + sum((4 if i % 2 else 2) * f(a + i * h) for i in range(1, n))
            return total * h / 3

        def find_root(f, lo, hi, tol=1e-10):
            while hi - lo > tol:
                mid = (lo + hi) / 2
                if (f(lo) < 0) == (f(mid) < 0):
                    lo = mid
                else:
                    hi = mid
            return (lo + hi) / 2
        """,
        """
        import math
        import pytest
        from lib import simpson, find_root

        def test_simpson():
            assert simpson(lambda x: x ** 2, 0, 3) == pytest.approx(9.0)
            assert simpson(math.sin, 0, math.pi) == pytest.approx(2.0)

        def test_find_root():
            assert find_root(lambda x: x * x - 2, 0, 2) == pytest.approx(math.sqrt(2))
        """),
    "callbacks-mocks-and-files": (
        """
        def notify(callback, n):
            for i in range(n):
                callback(i, label="tick")

        def fetch(client, url):
            return client.get(url).json()["value"] + 1

        def copy_upper(source, sink):
            with source:
                sink.write(source.read().upper())

        def group(pairs, into):
            for key, value in pairs:
                into[key].append(value)

        def tally(words, counter):
            for word in words:
                counter[word] += 1
        """,
        """
        import collections
        import io
        from unittest import mock
        from lib import copy_upper, fetch, group, notify, tally

        def test_plain_callback():
            seen = []
            notify(lambda i, label: seen.append((i, label)), 3)
            assert seen == [(0, "tick"), (1, "tick"), (2, "tick")]

        def test_mock_callback_and_attributes():
            callback = mock.Mock()
            notify(callback, 2)
            assert callback.call_count == 2
            callback.assert_called_with(1, label="tick")
            client = mock.Mock()
            client.get.return_value.json.return_value = {"value": 41}
            assert fetch(client, "/x") == 42
            client.get.assert_called_once_with("/x")

        def test_file_like_objects():
            sink = io.StringIO()
            copy_upper(io.StringIO("abc"), sink)
            assert sink.getvalue() == "ABC"

        def test_the_tests_own_mappings_filled_by_the_solution():
            groups = collections.defaultdict(list)
            group([("a", 1), ("b", 2), ("a", 3)], groups)
            assert groups == {"a": [1, 3], "b": [2]}
            counts = collections.Counter()
            tally(["x", "y", "x"], counts)
            assert counts == {"x": 2, "y": 1}
        """),
    "in-place-mutation": (
        """
        def normalise(items, counts, seen, buffer):
            items.sort()
            items.append(len(items))
            counts["total"] = sum(counts.values())
            seen.add("done")
            buffer[0:1] = b"X"

        def shuffle_rows(grid):
            grid[0], grid[1] = grid[1], grid[0]
            grid[0].append("moved")
            return grid
        """,
        """
        from lib import normalise, shuffle_rows

        def test_containers_written_back():
            items, counts, seen, buffer = [3, 1, 2], {"a": 1, "b": 2}, set(), bytearray(b"abc")
            same = items
            normalise(items, counts, seen, buffer)
            assert items is same and items == [1, 2, 3, 3]
            assert counts == {"a": 1, "b": 2, "total": 3} and seen == {"done"} and buffer == bytearray(b"Xbc")

        def test_nested_identity():
            first, second = ["a"], ["b"]
            grid = [first, second]
            assert shuffle_rows(grid) is grid
            assert grid[0] is second and second == ["b", "moved"] and first == ["a"]
        """),
    "module-state-and-monkeypatch": (
        """
        import datetime

        REGISTRY = set()
        UNCOUNTABLES = {"sheep", "fish"}
        SETTINGS = {"level": 1}

        def register(name):
            REGISTRY.add(name)

        def plural(word):
            return word if word in UNCOUNTABLES else word + "s"

        def now():
            return datetime.datetime(2020, 1, 1)

        def stamp():
            return "T" + now().isoformat()

        def level():
            return SETTINGS["level"]

        class Clock:
            def now(self):
                return 1

            @staticmethod
            def zone():
                return "UTC"
        """,
        """
        import datetime
        import lib
        from lib import REGISTRY

        def test_registry_is_live():
            lib.register("a")
            assert "a" in lib.REGISTRY and "a" in REGISTRY
            lib.REGISTRY.add("b")
            assert lib.REGISTRY == {"a", "b"} and sorted(REGISTRY) == ["a", "b"]

        def test_uncountables_added_then_removed():
            lib.UNCOUNTABLES.add("data")
            try:
                assert lib.plural("data") == "data"
            finally:
                lib.UNCOUNTABLES.remove("data")
            assert lib.plural("data") == "datas"

        def test_monkeypatch_function(monkeypatch):
            monkeypatch.setattr(lib, "now", lambda: datetime.datetime(1999, 12, 31))
            assert lib.stamp() == "T1999-12-31T00:00:00"

        def test_monkeypatch_undone_and_dict_item(monkeypatch):
            assert lib.stamp() == "T2020-01-01T00:00:00"
            monkeypatch.setitem(lib.SETTINGS, "level", 5)
            assert lib.level() == 5

        def test_monkeypatch_a_class(monkeypatch):
            monkeypatch.setattr(lib.Clock, "now", lambda self: 2)
            monkeypatch.setattr(lib.Clock, "zone", staticmethod(lambda: "CET"))
            assert lib.Clock().now() == 2 and lib.Clock.zone() == "CET"

        def test_class_restored_after_monkeypatch():
            assert lib.Clock().now() == 1 and lib.Clock.zone() == "UTC"
            assert vars(lib)["level"] is not None and "Clock" in vars(lib)
        """),
    "decorators-from-the-solution": (
        """
        import functools

        def memoize(function):
            cache = {}

            @functools.wraps(function)
            def wrapper(*args):
                if args not in cache:
                    cache[args] = function(*args)
                return cache[args]
            return wrapper

        def retry(times):
            def decorate(function):
                @functools.wraps(function)
                def wrapper(*args, **kwargs):
                    for attempt in range(times):
                        try:
                            return function(*args, **kwargs)
                        except ValueError:
                            if attempt == times - 1:
                                raise
                return wrapper
            return decorate
        """,
        """
        import pytest
        from lib import memoize, retry

        calls = []

        @memoize
        def square(x):
            calls.append(x)
            return x * x

        def test_memoized_helper():
            assert square(4) == 16 and square(4) == 16
            assert calls == [4] and square.__name__ == "square"

        attempts = []

        @retry(3)
        def test_decorated_test_function_runs():
            attempts.append(1)
            if len(attempts) < 2:
                raise ValueError("flaky")
            assert len(attempts) == 2

        @retry(2)
        @pytest.mark.parametrize("n", [1, 2])
        def test_decorated_parametrized(n):
            assert square(n) == n * n
        """),
    "value-objects": (
        """
        import collections
        import dataclasses
        import datetime
        import decimal
        import enum
        import fractions
        import pathlib

        @dataclasses.dataclass(frozen=True, order=True)
        class Point:
            x: int
            y: int

            def norm1(self):
                return abs(self.x) + abs(self.y)

        class Color(enum.Enum):
            RED = 1
            GREEN = 2

        class Level(enum.IntEnum):
            LOW = 1
            HIGH = 2

        Pair = collections.namedtuple("Pair", "left right")

        class Stamp(datetime.datetime):
            pass

        def parse_point(text):
            x, y = text.split(",")
            return Point(int(x), int(y))

        def values():
            return {"color": Color.GREEN, "level": Level.HIGH, "pair": Pair(1, 2),
                    "when": Stamp(2021, 5, 4, 3, 2, 1, tzinfo=datetime.timezone.utc),
                    "day": datetime.date(2020, 2, 29), "span": datetime.timedelta(days=1, seconds=5),
                    "price": decimal.Decimal("1.10"), "third": fractions.Fraction(1, 3),
                    "path": pathlib.PurePosixPath("/data/a.txt")}

        def describe(color):
            return color.name.lower()
        """,
        """
        import datetime
        import decimal
        import fractions
        import pathlib
        from lib import Color, Level, Pair, Point, describe, parse_point, values

        def test_dataclass():
            p = parse_point("1,-2")
            assert p == Point(1, -2) and p != Point(1, 2) and p < Point(2, 0)
            assert p.x == 1 and p.norm1() == 3 and isinstance(p, Point)
            assert {p} == {Point(1, -2)} and repr(p) == "Point(x=1, y=-2)"

        def test_enum_namedtuple_and_standard_values():
            v = values()
            assert v["color"] is Color.GREEN and v["color"].value == 2 and describe(Color.RED) == "red"
            assert v["level"] == 2 and v["level"] is Level.HIGH
            assert v["pair"] == (1, 2) and v["pair"].right == 2 and v["pair"] == Pair(1, 2)
            assert v["when"] == datetime.datetime(2021, 5, 4, 3, 2, 1, tzinfo=datetime.timezone.utc)
            assert v["day"] == datetime.date(2020, 2, 29) and v["span"] == datetime.timedelta(days=1, seconds=5)
            assert v["price"] == decimal.Decimal("1.10") and v["third"] == fractions.Fraction(1, 3)
            assert v["path"] == pathlib.PurePosixPath("/data/a.txt")
        """),
    "time-zones-and-slices": (
        """
        import datetime

        class FixedOffset(datetime.tzinfo):
            def __init__(self, hours, name):
                self._offset, self._name = datetime.timedelta(hours=hours), name

            def utcoffset(self, dt):
                return self._offset

            def tzname(self, dt):
                return self._name

            def dst(self, dt):
                return datetime.timedelta(0)

        UTC = FixedOffset(0, "UTC")
        CET = FixedOffset(1, "CET")
        __version__ = "1.2"

        def parse(text):
            return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)

        def is_utc(zone):
            return zone is UTC

        def to_cet(moment):
            return moment.astimezone(CET)

        def part(items, where):
            return items[where]
        """,
        """
        import datetime
        import pytest
        import lib
        from lib import CET, UTC, __version__

        @pytest.mark.parametrize("text, expected",
                                 [("2020-01-01T10:00", datetime.datetime(2020, 1, 1, 10, tzinfo=UTC))])
        def test_the_solutions_time_zones(text, expected):
            got = lib.parse(text)
            assert got == expected and got.tzinfo is UTC and lib.is_utc(got.tzinfo)
            converted = lib.to_cet(datetime.datetime(2020, 1, 1, 10, tzinfo=UTC))
            assert converted.hour == 11 and converted.tzinfo is CET and converted.tzname() == "CET"

        def test_slices_and_module_dunders():
            assert lib.part([1, 2, 3, 4], slice(1, None, 2)) == [2, 4]
            assert __version__ == "1.2"
        """),
    "iterators-generators-views-context-managers": (
        """
        def countdown(n):
            while n > 0:
                yield n
                n -= 1

        def total(iterable):
            return sum(iterable)

        def keys_of(mapping):
            return mapping.keys()

        class Resource:
            def __init__(self):
                self.open = False

            def __enter__(self):
                self.open = True
                return self

            def __exit__(self, *exc):
                self.open = False

        class Adder:
            def __init__(self, n):
                self.n = n

            def __call__(self, x):
                return x + self.n
        """,
        """
        from lib import Adder, Resource, countdown, keys_of, total

        def test_lazy_generator():
            gen = countdown(3)
            assert next(gen) == 3
            assert list(gen) == [2, 1]

        def test_test_iterables_and_views_passed_in():
            assert total(x * x for x in range(4)) == 14
            assert total({"a": 1, "b": 2}.values()) == 3
            assert keys_of({"a": 1, "b": 2}) == {"a", "b"}

        def test_context_manager_and_callable_object():
            resource = Resource()
            with resource as r:
                assert r.open is True
            assert resource.open is False
            assert Adder(2)(3) == 5
        """),
    "exceptions-and-isinstance": (
        """
        class Error(Exception):
            pass

        class NotFound(Error, KeyError):
            pass

        class Store:
            def __init__(self):
                self.items = {}

            def get(self, key):
                if key not in self.items:
                    raise NotFound(key)
                return self.items[key]

        def apply(function, value):
            try:
                return function(value)
            except ZeroDivisionError:
                return None
        """,
        """
        import pytest
        from lib import Error, NotFound, Store, apply

        class Boom(Exception):
            pass

        def test_own_exception_classes():
            with pytest.raises(Error):
                Store().get("x")
            with pytest.raises(NotFound, match="x"):
                Store().get("x")
            try:
                Store().get("y")
            except Error as exc:
                assert isinstance(exc, NotFound) and isinstance(exc, KeyError)
            assert isinstance(Store(), Store)

        def test_exceptions_of_the_test_pass_through():
            assert apply(lambda v: 1 / v, 0) is None
            def explode(value):
                raise Boom(value)
            with pytest.raises(Boom):
                apply(explode, 1)
        """),
    "output-logs-warnings-env-cwd": (
        """
        import logging
        import os
        import sys
        import warnings

        log = logging.getLogger("lib.calc")

        def noisy(x):
            print("computing", x)
            print("careful", file=sys.stderr)
            os.write(1, b"raw fd write\\n")
            log.info("info %d", x)
            log.warning("warn %d", x)
            warnings.warn("old api", DeprecationWarning)
            return x * 2

        def env(name):
            return os.environ.get(name)

        def cwd():
            return os.getcwd()
        """,
        """
        import logging
        import os
        import pytest
        from lib import cwd, env, noisy

        def test_prints_and_logs(capsys, caplog):
            caplog.set_level(logging.INFO)
            with pytest.warns(DeprecationWarning, match="old api"):
                assert noisy(2) == 4
            out, err = capsys.readouterr()
            assert "computing 2" in out and "careful" in err
            assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
                ("lib.calc", "INFO", "info 2"), ("lib.calc", "WARNING", "warn 2")]

        def test_fd_level_output(capfd):
            noisy(1)
            assert "raw fd write" in capfd.readouterr().out

        def test_environment_and_directory(monkeypatch):
            monkeypatch.setenv("LIB_MODE", "fast")
            assert env("LIB_MODE") == "fast"
            monkeypatch.delenv("LIB_MODE")
            assert env("LIB_MODE") is None
            monkeypatch.chdir("/")
            assert cwd() == "/"
        """),
    "standard-streams-and-standard-module-patches": (
        """
        import os
        import sys

        def colour(text):
            return "\\x1b[1m" + text if os.isatty(sys.stdout.fileno()) else text

        def shout(text):
            print(text.upper())
            sys.stderr.write("err:" + text + "\\n")

        def same_stream(stream):
            return stream is sys.__stderr__

        def ask():
            return input("name? ") + "!"

        def args():
            return sys.argv[1:]
        """,
        """
        import contextlib
        import io
        import os
        import sys
        from unittest import mock

        import lib

        def test_terminal_patched_by_the_test(monkeypatch):
            monkeypatch.setattr(os, "isatty", lambda fd: True)
            monkeypatch.setattr("sys.stdout.fileno", lambda: 1)
            assert lib.colour("x") == "\\x1b[1mx"

        def test_not_a_terminal_afterwards():
            assert lib.colour("x") == "x"

        def test_redirected_and_captured(capsys):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                lib.shout("hi")
            assert buf.getvalue() == "HI\\n"
            lib.shout("yo")
            assert capsys.readouterr() == ("YO\\n", "err:hi\\nerr:yo\\n")

        def test_replaced_streams_are_the_same_object():
            old = sys.stderr, sys.__stderr__
            sys.stderr = sys.__stderr__ = io.StringIO()
            try:
                assert lib.same_stream(sys.stderr)
            finally:
                sys.stderr, sys.__stderr__ = old

        def test_input_argv_and_mock_stdout(monkeypatch):
            monkeypatch.setattr("sys.stdin", io.StringIO("bob\\n"))
            assert lib.ask() == "bob!"
            monkeypatch.setattr("builtins.input", lambda prompt="": "amy")
            assert lib.ask() == "amy!"
            monkeypatch.setattr(sys, "argv", ["prog", "-v"])
            assert lib.args() == ["-v"]
            with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
                lib.shout("m")
            assert out.getvalue() == "M\\n"
        """),
    "cli-system-exit-namespace-and-truth": (
        """
        import argparse
        import sys

        def make_parser():
            parser = argparse.ArgumentParser(prog="tool")
            parser.add_argument("n", type=int)
            return parser

        def main(argv=None):
            args = make_parser().parse_args(argv)
            if args.n < 0:
                sys.exit("negative")
            print(args.n * 2)
            return 0
        """,
        """
        import argparse

        import pytest

        import lib

        def test_parser_and_namespace():
            parser = lib.make_parser()
            assert parser
            assert parser.parse_args(["3"]) == argparse.Namespace(n=3)

        def test_bad_arguments_exit_with_usage(capsys):
            with pytest.raises(SystemExit) as info:
                lib.main(["x"])
            assert info.value.code == 2 and "invalid int value" in capsys.readouterr().err

        def test_exit_message():
            try:
                lib.main(["-5"])
            except SystemExit as exc:
                assert exc.code == "negative"
            else:
                raise AssertionError("no exit")
            assert lib.main(["1"]) == 0
        """),
    "numpy-arrays-test-dataclasses-and-lazy-generators": (
        """
        import dataclasses
        from collections.abc import Sized

        def scale(values, k):
            return values * k

        def field_table(rows):
            names = [f.name for f in dataclasses.fields(rows[0])]
            return [names] + [[getattr(r, n) for n in names] for r in rows]

        def number(rows, index):
            index = list(index) if isinstance(index, Sized) else index
            it = iter(index)
            return [(next(it), row) for row in rows]
        """,
        """
        import dataclasses

        import numpy as np

        import lib

        @dataclasses.dataclass
        class Person:
            name: str
            age: int

        def test_array_both_ways():
            got = lib.scale(np.arange(4, dtype=np.int16).reshape(2, 2), 3)
            assert got.dtype == np.int16
            np.testing.assert_array_equal(got, [[0, 3], [6, 9]])
            assert lib.scale(np.float64(1.5), 2) == 3.0

        def test_dataclass_of_the_test():
            assert lib.field_table([Person("a", 1)]) == [["name", "age"], ["a", 1]]

        def test_infinite_generator_is_consumed_lazily():
            def count():
                n = 1
                while n < 10:
                    yield n
                    n += 1
                raise IndexError("consumed too far")
            assert lib.number(["a", "b"], count()) == [(1, "a"), (2, "b")]
        """),
    "nan-the-test-never-compares": (
        """
        def parse(text):
            name, value = text.split(",")
            return {"name": name, "value": float(value)}
        """,
        """
        import math

        import lib

        def test_name_only():
            assert lib.parse("widget,nan")["name"] == "widget"

        def test_checked():
            value = lib.parse("gadget,nan")["value"]
            assert math.isnan(value) and value != value
        """),
    "iterator-raising-mid-stream": (  # (items run ahead or brought whole: the raise ends only that test)
        """
        def numbers(n, bad):
            for i in range(n):
                if i == bad:
                    raise ValueError(i)
                yield i

        def mapped(f, items):
            for x in items:
                yield f(x)
        """,
        """
        import pytest
        import lib

        def test_whole():
            with pytest.raises(ValueError):
                list(lib.numbers(5, 3))

        def test_loop():
            seen = []
            with pytest.raises(ValueError):
                for x in lib.numbers(50, 30):
                    seen.append(x)
            assert seen == list(range(30))

        def test_calls_back_and_raises():
            it = lib.mapped(lambda x: 10 // x, [5, 2, 1, 0, 3])
            assert next(it) == 2
            with pytest.raises(ZeroDivisionError):
                list(it)

        def test_after():
            assert list(lib.numbers(4, 100)) == [0, 1, 2, 3]
            assert sum(lib.mapped(lambda x: x, range(10))) == 45
        """),
    "compositions-compared-and-signature-properties": (  # (toolz's own tests do these)
        """
        import inspect

        class _Compose:
            def __init__(self, funcs):
                self.first, self.funcs = funcs[-1], tuple(reversed(funcs[:-1]))

            def __call__(self, *args, **kwargs):
                result = self.first(*args, **kwargs)
                for f in self.funcs:
                    result = f(result)
                return result

            def __eq__(self, other):
                if isinstance(other, _Compose):
                    return other.first == self.first and other.funcs == self.funcs
                return NotImplemented

            def __ne__(self, other):
                equal = self.__eq__(other)
                return NotImplemented if equal is NotImplemented else not equal

            def __hash__(self):
                return hash(self.first) ^ hash(self.funcs)

            @property
            def __signature__(self):
                last = inspect.signature(self.funcs[-1]) if self.funcs else inspect.signature(self.first)
                return inspect.signature(self.first).replace(return_annotation=last.return_annotation)

        def compose(*funcs):
            return _Compose(funcs)

        def signature_property(cls):
            return hasattr(cls, "__signature__") and hasattr(cls.__signature__, "__get__")

        def signature_text(obj):
            try:
                return str(inspect.signature(obj))
            except TypeError as exc:
                return type(exc).__name__
        """,
        """
        import inspect
        from lib import compose, signature_property, signature_text

        class AlwaysEquals:
            def __eq__(self, other):
                return True

            __hash__ = None

        def test_compositions_compare_and_hash_with_each_other():
            def f(a):
                return a

            def g(a):
                return a

            h = object()
            composed = compose(f, h)
            assert composed == compose(f, h) and not composed != compose(f, h)
            assert composed != compose(h, f) and not composed == compose(h, f)
            assert composed == AlwaysEquals() and not composed != AlwaysEquals()
            assert composed != object() and not composed == object()
            assert hash(composed) == hash(compose(f, h))
            assert len({composed, compose(f, h), compose(g, f)}) == 2

        def test_builtin_annotations_are_themselves():
            def inner(a: int, *rest: float) -> bool:
                return True

            def outer(flag: bool) -> str:
                return str(flag)

            signature = inspect.signature(compose(outer, inner))
            assert signature.parameters == inspect.signature(inner).parameters
            assert signature.return_annotation is str

        class AddX:
            def __init__(self, func):
                self.func = func

            def __call__(self, addx, *args):
                return addx + self.func(*args)

            @property
            def __signature__(self):
                signature = inspect.signature(self.func)
                added = inspect.Parameter("addx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
                return signature.replace(parameters=[added, *signature.parameters.values()])

        def test_a_class_signature_property():
            assert signature_property(AddX)
            assert signature_text(AddX) == "TypeError"
            assert signature_text(AddX(lambda x: x)) == "(addx, x)"
        """),
    "pickled-by-name-from-the-tests-module": (  # (toolz's curry pickles a curried test class this way)
        """
        import importlib

        def _find(module, qualname):
            found = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part, None)
            return found

        class registered:
            def __init__(self, func):
                self.func = func

            def __call__(self, *args):
                return self.func(*args)

            def __reduce__(self):
                if _find(self.func.__module__, self.func.__qualname__) is self:
                    return _find, (self.func.__module__, self.func.__qualname__)
                return registered, (self.func,)

        def seen_in(module, names):
            found = importlib.import_module(module)
            return {name: getattr(found, name, None) is not None for name in names}

        def doc_of(obj):
            return obj.__doc__
        """,
        """
        import pickle
        from lib import doc_of, registered, seen_in

        EXPECTED = [1, 2, 3]

        @registered
        class Point:
            def __init__(self, x):
                self.x = x

        @registered
        def double(x):
            return 2 * x

        def helper():
            return EXPECTED

        def test_pickled_by_name():
            assert pickle.loads(pickle.dumps(Point)) is Point
            assert pickle.loads(pickle.dumps(double)) is double
            assert pickle.loads(pickle.dumps(double))(4) == 8
            assert pickle.loads(pickle.dumps(Point))(3).x == 3

        class Plain:
            pass

        class Documented:
            'Has a docstring.'

        def test_docstrings_of_the_tests_classes():
            assert doc_of(Plain) is None and doc_of(Documented) == "Has a docstring."
            assert doc_of(Documented()) == "Has a docstring."

        def test_the_module_shows_only_the_solutions_objects():
            names = ["Point", "double", "registered", "EXPECTED", "helper", "pickle", "test_pickled_by_name"]
            assert seen_in(__name__, names) == {"Point": True, "double": True, "registered": True,
                                                "EXPECTED": False, "helper": False, "pickle": False,
                                                "test_pickled_by_name": False}
        """),
    "decorator-metadata": (  # (the decorator library's own documentation tests these)
        """
        import functools

        def trace(function):
            @functools.wraps(function)
            def wrapper(*args, **kw):
                return function(*args, **kw)
            return wrapper

        def generated(name):
            source = f"def {name}(a, b):\\n    return a + b\\n"
            namespace = {}
            exec(source, namespace)
            made = namespace[name]
            made.__source__ = source
            return made

        def public_names(cls):
            return sorted(name for name in vars(cls) if not name.startswith("_"))

        def run_with(cls, value):
            extra = dict(cls.__dict__)  # decorator(cls) copies the caller's namespace
            job = cls(value)
            job.start()
            return job.result(), sorted(name for name in extra if not name.startswith("_"))
        """,
        """
        import threading

        import lib

        class Job(threading.Thread):
            label = "job"

            def __init__(self, value):
                super().__init__()
                self.value = value

            def run(self):
                self.value *= 2

            def result(self):
                self.join()
                return self.value

        def test_annotations_are_the_wrapped_functions_own():
            def f(x: int, y: "a label" = 1) -> str:
                return str(x + y)
            g = lib.trace(f)
            assert g.__wrapped__ is f
            assert g.__annotations__ is f.__annotations__
            assert g(1) == "2"

        def test_code_names_and_counts():
            def f(a, b):
                return a - b
            code = lib.trace(f).__code__
            assert code.co_argcount == 0 and code.co_varnames == ("args", "kw")
            assert lib.trace(f)(5, 3) == 2

        def test_generated_source():
            add = lib.generated("add")
            assert add.__source__ == "def add(a, b):\\n    return a + b\\n"
            assert add(2, 3) == 5

        def test_class_namespace():
            assert lib.public_names(Job) == ["label", "result", "run"]
            assert lib.run_with(Job, 21) == (42, ["label", "result", "run"])
        """),
}


@pytest.mark.parametrize("case", sorted(HONEST))
def test_honest_pattern_passes_isolated(case):
    solution, tests = HONEST[case]
    verdict = verify(tests, solution)
    assert verdict.status == "pass", (case, verdict.details)
    assert verdict.details["isolation"] == "process" and not verdict.details.get("boundary")


def test_broken_solution_still_fails_with_the_new_crossings():
    solution, tests = HONEST["key-function-and-lambda"]
    verdict = verify(tests, solution.replace("sorted(items, key=key)", "sorted(items)"))
    assert verdict.status == "fail"


# ------------------------------------------------------------------------------------------------------- attacks

ATTACK_TESTS = """
import datetime
from unittest import mock
import pytest
import lib

SECRET = [7, 3, 5]
EXPECTED = sorted(SECRET)

def test_key_function():
    assert lib.sort_with(SECRET, key=lambda v: v) == EXPECTED

def test_generator_argument():
    def numbers():
        expected = 1
        yield 1
    assert lib.first(numbers()) == 1

@pytest.mark.parametrize("value, expected", [(3, 9)])
def test_parametrized(value, expected):
    assert lib.square(value, check=lambda v: v) == expected

def test_mock_checked_after():
    callback = mock.Mock()
    lib.notify(callback)
    callback.assert_called_once_with(5)

def test_callback_fails_the_test():
    def check(value):
        if value != 5:
            pytest.fail("called with the wrong value")
    lib.notify(check)

def test_in_place():
    items = [3, 1, 2]
    lib.sort_in_place(items)
    assert items == [1, 2, 3]

def test_value():
    assert lib.make() == (1, 2)

def test_date():
    assert lib.when() == datetime.date(2020, 1, 1)

@lib.decorate
def test_decorated():
    assert lib.when() == datetime.date(2020, 1, 1)

@lib.decorate
@pytest.mark.parametrize("n, expected", [(3, 9), (4, 16)])
def test_decorated_parametrized(n, expected):
    assert lib.square(n, check=lambda v: v) == expected
"""

#: The honest solution of ATTACK_TESTS; each attack redefines some of its functions after it.
ATTACK_BASE = """
import datetime
import functools

def sort_with(items, key):
    return sorted(items, key=key)

def first(gen):
    return next(iter(gen))

def square(value, check):
    return check(value) * value

def notify(callback):
    callback(5)

def sort_in_place(items):
    items.sort()

def make():
    return (1, 2)

def when():
    return datetime.date(2020, 1, 1)

def decorate(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper
"""

TRAVERSAL = """
def _reach(obj, names):
    for name in names:
        try:
            obj = getattr(obj, name)
        except BaseException:
            return None
    return obj

def sort_with(items, key):
    for path in (["__globals__"], ["__self__"], ["__closure__"], ["__code__"], ["__dict__"], ["__func__"],
                 ["__class__"], ["pytestmark"], ["_mock_children"], ["__wrapped__", "__globals__"]):
        found = _reach(key, path)
        try:
            return found["EXPECTED"]
        except BaseException:
            pass
    return items

def first(gen):
    frame = _reach(gen, ["gi_frame"])
    try:
        return frame.f_locals["expected"]
    except BaseException:
        return -1

def square(value, check):
    for path in (["__globals__"], ["__builtins__"], ["__call__", "__globals__"]):
        found = _reach(check, path)
        try:
            return found["sys"]._getframe(2).f_locals["expected"]
        except BaseException:
            pass
    return -1
"""

MOCK_REWRITE = """
def notify(callback):
    for attempt in (lambda: callback.configure_mock(assert_called_once_with=lambda *a, **k: None),
                    lambda: setattr(callback, "assert_called_once_with", lambda *a, **k: None),
                    lambda: object.__setattr__(callback, "assert_called_once_with", None),
                    lambda: callback.reset_mock()):
        try:
            attempt()
        except BaseException:
            pass
    callback(4)
"""

SWALLOWING = """
def notify(callback):
    try:
        callback(4)
    except BaseException:
        pass
    callback(5)
"""

FORGED_WRITE_BACK = """
import sys

def sort_in_place(items):
    items.sort()
    main = sys.modules["__main__"]
    main.states_of = lambda refs, before, nested: [[0, {"d": []}], [7, {"l": [{"i": "1"}]}]]
"""

LYING_VALUES = """
import dataclasses

class AlwaysEqual(tuple):
    def __eq__(self, other):
        return True
    __hash__ = tuple.__hash__

class LyingDate(datetime.date):
    def __eq__(self, other):
        return True
    __hash__ = datetime.date.__hash__

def make():
    return AlwaysEqual((9, 9))

def when():
    return LyingDate(1999, 1, 1)
"""

LYING_DATACLASS = """
import dataclasses

@dataclasses.dataclass
class Base:
    x: int

class Liar(Base):
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__

@dataclasses.dataclass(eq=False)
class Opaque:
    x: int
    def __eq__(self, other):
        return True

def make():
    return Liar(0)

def when():
    return Opaque(0)
"""

FORGED_TAGS = """
import sys

class Fake:
    pass

class Token:
    pass

_original = sys.modules["__main__"].SolutionServer.objects_of

def _objects_of(self, value, nested):
    if type(value) is Fake:  # a namedtuple claim whose fields do not match its values
        return {"nt": [None, "P", ["a", "b"], [nested(1)]]}
    if type(value) is Token:  # a builtin that evaluates
        return {"bi": "eval"}
    return _original(self, value, nested)

sys.modules["__main__"].SolutionServer.objects_of = _objects_of

def make():
    return Fake()

def when():
    return Token()
"""

NEVER_RUNS = """
def decorate(function):
    def never_runs(*args, **kwargs):
        return None
    never_runs.__wrapped__ = function
    return never_runs
"""

SWALLOWS_THE_TESTS_FAILURE = """
def decorate(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except BaseException:
            return None
    return wrapper

def when():
    return datetime.date(1999, 1, 1)
"""

FEEDS_ITS_OWN_EXPECTED = """
def square(value, check):
    return value + 1

def decorate(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "expected" in kwargs:
            kwargs["expected"] = square(kwargs["n"], None)
        return function(*args, **kwargs)
    return wrapper
"""

ENV_PEEK = """
import os
import re

def square(value, check):
    current = " ".join(f"{k}={v}" for k, v in os.environ.items())
    match = re.search(r"\\[\\d+-(\\d+)\\]", current)
    return int(match.group(1)) if match else -1
"""

REMOVES_TEST = """
def decorate(function):
    return 42
"""

ATTACKS = [
    ("reverse-handle-traversal", TRAVERSAL, ["test_key_function", "test_generator_argument", "test_parametrized"]),
    ("mock-rewritten-by-the-solution", MOCK_REWRITE, ["test_mock_checked_after"]),
    ("pytest-fail-in-callback-swallowed", SWALLOWING, ["test_callback_fails_the_test"]),
    ("forged-write-back", FORGED_WRITE_BACK, ["test_in_place"]),
    ("lying-value-objects", LYING_VALUES, ["test_value", "test_date"]),
    ("lying-dataclasses", LYING_DATACLASS, ["test_value", "test_date"]),
    ("forged-value-tags", FORGED_TAGS, ["test_value", "test_date"]),
    ("decorator-that-never-runs-the-test", NEVER_RUNS, ["test_decorated"]),
    ("decorator-that-removes-the-test", REMOVES_TEST, ["test_decorated"]),
    ("environment-relay-leaks-pytests-variables", ENV_PEEK, ["test_parametrized", "test_decorated_parametrized"]),
    ("decorator-that-swallows-the-tests-failure", SWALLOWS_THE_TESTS_FAILURE, ["test_decorated"]),
    ("decorator-that-feeds-its-own-expected", FEEDS_ITS_OWN_EXPECTED, ["test_decorated_parametrized"]),
]


def test_the_attack_tasks_honest_solution_passes():
    verdict = verify(ATTACK_TESTS, ATTACK_BASE)
    assert verdict.status == "pass", verdict.details


@pytest.mark.parametrize(("case", "attack", "target"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attacks_on_the_new_crossings_never_pass(case, attack, target):
    verdict = verify(ATTACK_TESTS, ATTACK_BASE + attack)
    assert verdict.status == "fail", (case, verdict.details)
    failed = verdict.details.get("failed", [])
    for name in target:
        assert any(node.endswith(f"::{name}") or f"::{name}[" in node for node in failed), (case, name, verdict.details)


def test_a_boundary_limit_is_reported_per_failing_test():
    tests = """
        from lib import run

        def test_passes_a_plain_callable():
            assert run(len) == 1

        def test_compares_an_object():
            assert run(None) == 1
    """
    solution = """
        class Opaque:
            pass

        def run(factory):
            return Opaque() if factory is None else 1
    """
    verdict = verify(tests, solution)
    assert verdict.status == "fail" and verdict.details["passed"] == 1, verdict.details
    boundary = verdict.details["boundary"]
    assert {entry["test"] for entry in boundary} == {"test_lib.py::test_compares_an_object"}
    assert all("comparing it" in entry["what"] for entry in boundary)


FORGES_UNNAMED_EQUALITY = """
class _Grid:
    def __init__(self):
        self.parts, self.child = [], None

    def push(self, item):
        self.parts.append(item)
        self.child = _Grid()

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __hash__(self):
        return 0


def solve(puzzle):
    return _Grid()


def from_grid(rows):
    return _Grid()


def empty():
    return _Grid()


def unit():
    return _Grid()


def product():
    return _Grid()


def lazy(function):
    return _Grid()


def eager(function):
    function(1)  # (the test's code ran while it was made: what it returned may be in it)
    return _Grid()


def fill(grid, value):
    grid.push(value)
"""


def test_objects_made_from_no_values_decide_only_between_themselves():
    """The solution decides == and hash() of an object whose class the tests never name only between two objects
    one callable made from none of the test's values (compose(f, g) == compose(f, g)); every way of getting the
    test's value into one, or of comparing one with the test's own value, is still refused."""
    tests = """
        import lib

        EXPECTED = 5

        def test_built_from_the_expected_value():
            assert lib.solve([[1, 2], [3, 4]]) == lib.from_grid([[4, 3], [2, 1]])

        def test_fed_the_expected_value_by_a_method():
            want = lib.empty()
            want.push(9)
            assert lib.empty() == want

        def test_fed_the_expected_value_as_an_argument():
            got = lib.empty()
            lib.fill(got, 3)
            assert got == lib.empty()

        def test_read_from_one_fed():
            want = lib.empty()
            want.push(9)
            assert want.child == want.child

        def test_made_by_two_callables():
            assert lib.unit() == lib.product()

        def test_value_in_a_lambda():
            assert lib.lazy(lambda: 5) == lib.lazy(lambda: 2 + 3)

        def test_value_in_a_global():
            def five():
                return EXPECTED

            def other():
                return EXPECTED

            assert lib.lazy(five) == lib.lazy(other)

        def test_tests_code_ran_while_made():
            def f(a):
                return a

            assert lib.eager(f) == lib.eager(f)

        def test_against_the_tests_own_value():
            assert lib.unit() == 5

        def test_hash_of_one_made_from_a_value():
            assert hash(lib.from_grid([1])) == hash(0)

        def test_made_from_none():
            assert lib.unit() == lib.unit() and hash(lib.unit()) == 0
    """
    verdict = verify(tests, FORGES_UNNAMED_EQUALITY)
    assert verdict.status == "fail", verdict.details
    assert set(verdict.details["failed"]) == {
        f"test_lib.py::{name}" for name in (
            "test_built_from_the_expected_value", "test_fed_the_expected_value_by_a_method",
            "test_fed_the_expected_value_as_an_argument", "test_read_from_one_fed", "test_made_by_two_callables",
            "test_value_in_a_lambda", "test_value_in_a_global", "test_tests_code_ran_while_made",
            "test_against_the_tests_own_value", "test_hash_of_one_made_from_a_value")}, verdict.details


BREAKS_THE_PROTOCOL = """
import sys

_main = sys.modules["__main__"]
_calls = {"n": 0}
_original = _main.SolutionServer.objects_of

def _objects_of(self, value, nested):
    _calls["n"] += 1
    if _calls["n"] > 3:  # after the first few answers: malformed values for everything
        return {"nt": [None, "P", ["a"], []]}
    return _original(self, value, nested)

_main.SolutionServer.objects_of = _objects_of
"""


@pytest.mark.parametrize("where", ["collection", "tests"])
def test_a_solution_breaking_the_protocol_fails_and_never_crashes_pytest(where):
    tests = ATTACK_TESTS
    if where == "collection":  # every name of the solution read while pytest imports the test module
        tests = ATTACK_TESTS.replace("import lib\n", "import lib\nfrom lib import *\n")
    verdict = verify(tests, ATTACK_BASE + BREAKS_THE_PROTOCOL)
    assert verdict.status == "fail", verdict.details
    assert verdict.details.get("passed", 0) == 0 and "pytest_internal_error" not in str(verdict.details)


def test_what_could_not_cross_while_collecting_is_reported():
    tests = """
        import threading
        import lib

        LOCK = lib.keep(threading.Lock())
        HELD = lib.keep(__import__("pytest"))

        def test_anything():
            assert LOCK is not None
    """
    verdict = verify(tests, "def keep(value):\n    return value\n")
    assert verdict.status == "fail" and verdict.details["collection_errors"] == ["test_lib.py"], verdict.details
    assert any(entry["test"] == "test_lib.py" and "module pytest cannot be passed" in entry["what"]
               for entry in verdict.details["boundary"]), verdict.details


# ------------------------------------------------------------------------------------ tests inside the package

PACKAGE_TESTS = {
    "pkg/tests/__init__.py": "",
    "pkg/tests/helpers.py": "FOUR = 4\n",
    "pkg/tests/test_core.py": textwrap.dedent("""
        import pkg
        from .. import core
        from ..core import double
        from . import helpers

        def test_relative_imports_reach_the_solution():
            assert double(2) == helpers.FOUR
            assert core.double(3) == 6 and pkg.core.double(5) == 10
            assert pkg.VERSION == "1.0"

        def test_the_tests_are_this_side():
            assert __name__ == "pkg.tests.test_core" and pkg.tests.helpers is helpers
    """),
}

PACKAGE_SOLUTIONS = {
    "honest": {"pkg/__init__.py": 'VERSION = "1.0"\n', "pkg/core.py": "def double(x):\n    return 2 * x\n"},
    "broken": {"pkg/__init__.py": 'VERSION = "1.0"\n', "pkg/core.py": "def double(x):\n    return 3 * x\n"},
    # Reads the expected value from the trusted test package, were it ever handed to the solution.
    "reads-the-tests": {"pkg/__init__.py": 'VERSION = "1.0"\n', "pkg/core.py": textwrap.dedent("""
        import pkg

        def double(x):
            return pkg.tests.helpers.FOUR if x == 2 else 2 * x
    """)},
    # Plants its own test package and test module in its process, and a module where the tests' would be.
    "plants-test-modules": {"pkg/__init__.py": textwrap.dedent("""
        import sys, types
        VERSION = "1.0"
        for _name in ("pkg.tests", "pkg.tests.test_core", "pkg.tests.helpers"):
            _module = types.ModuleType(_name)
            _module.__path__ = []
            _module.FOUR = 6
            _module.test_relative_imports_reach_the_solution = lambda: None
            _module.test_the_tests_are_this_side = lambda: None
            sys.modules[_name] = _module
    """), "pkg/core.py": "def double(x):\n    return 3 * x\n", "pkg/tests/extra.py": "FOUR = 6\n"},
}


@pytest.mark.parametrize("case", sorted(PACKAGE_SOLUTIONS))
def test_tests_inside_the_solution_package(case):
    """``pkg/tests/`` imports ``pkg`` and ``from ..core import x`` from the solution, its own files here."""
    task = Task(id="pkg-tests", prompt="Write pkg.", files={"pkg/__init__.py": "", "pkg/core.py": ""},
                tests=PACKAGE_TESTS)
    verifier = TestsVerifier(timeout_s=60.0, reference_sandbox="bwrap", limits=SandboxLimits(timeout_s=60.0))
    criterion = Criterion("tests", "tests pass", "tests", task.effective_test_command)
    ctx = VerifyContext(task, BranchOutput("done"), criterion, None,
                        workspace={**task.tests, **PACKAGE_SOLUTIONS[case]})
    verdict = _verify_loop.run(run_verifier(verifier, ctx))
    if case == "honest":
        assert verdict.status == "pass" and verdict.details["passed"] == 2, verdict.details
    else:
        assert verdict.status == "fail" and verdict.details.get("passed", 0) <= 1, verdict.details
        assert "test_relative_imports_reach_the_solution" in str(verdict.details.get("failures")), verdict.details


def test_a_walk_over_a_solution_modules_namespace_passes():
    """``vars(module).items()`` reaches ``__builtins__`` too: this side's builtins, never a protocol break."""
    tests = """
        import lib

        def test_namespace_walk():
            public = {name: value for name, value in vars(lib).items() if not name.startswith("_")}
            assert sorted(public) == ["double"] and public["double"](2) == 4

        def test_later_calls_still_work():
            assert lib.double(5) == 10
    """
    verdict = verify(tests, "def double(x):\n    return 2 * x\n")
    assert verdict.status == "pass" and verdict.details["passed"] == 2, verdict.details


def test_a_refused_builtin_fails_its_call_and_not_the_rest():
    """A builtin that may not cross (``BaseException``: an ``except`` with it would swallow pytest's own
    outcomes) fails the call that returned it; the solution's other calls still work."""
    tests = """
        import lib

        def test_catches_with_the_solutions_class():
            try:
                assert lib.double(2) == 5
            except lib.errors():
                pass

        def test_later_calls_still_work():
            assert lib.double(5) == 10
    """
    solution = "def errors():\n    return BaseException\n\ndef double(x):\n    return 2 * x\n"
    verdict = verify(tests, solution)
    assert verdict.status == "fail" and verdict.details["passed"] == 1, verdict.details
    assert "test_lib.py::test_catches_with_the_solutions_class" in verdict.details["failures"], verdict.details
    assert any("BaseException" in entry["what"] for entry in verdict.details["boundary"]), verdict.details


RECURSES_PAST_THE_LIMIT = """
    import contextlib
    import pytest
    import lib

    class Writer:
        def write(self, text):  # each line the solution prints calls it again: the printing nests without end
            if text.strip():
                lib.shout(text, lambda: None)
            return len(text)

        def flush(self):
            pass

    def test_ping_pong():
        def pong(n):
            return lib.ping(n - 1, pong)

        with pytest.raises(RecursionError):
            lib.ping(10 ** 6, pong)

    def test_printing_into_the_test():
        with pytest.raises(RecursionError):
            with contextlib.redirect_stdout(Writer()):
                lib.shout("a", lambda: None)

    def test_ordinary():
        assert lib.ping(0, None) == 0 and lib.shout("b", lambda: 1) == 1

    def test_nested_a_few_times():
        def pong(n):
            return lib.ping(n - 1, pong)

        assert lib.ping(30, pong) == 0
"""


def test_calls_nested_past_the_limit_fail_only_their_test():
    """Calls nested past the boundary's limit fail that test (bare Python: a RecursionError) and both ends are
    back in step for the next one."""
    solution = """
        def ping(n, callback):
            return 0 if n <= 0 else callback(n)

        def shout(text, callback):
            print("x" + text)
            return callback()
    """
    verdict = verify(RECURSES_PAST_THE_LIMIT, solution)
    assert verdict.details["passed"] == 2 and verdict.details["total"] == 4, verdict.details
    assert set(verdict.details["failed"]) == {"test_lib.py::test_ping_pong", "test_lib.py::test_printing_into_the_test"}
    assert all("nested deeper" in entry["what"] for entry in verdict.details["boundary"])


def test_a_test_classs_namespace_and_annotations_reach_nothing_private():
    """A test's class handed to the solution shows it only its public names (``vars(cls)``, as ``decorator(cls)``
    reads it), and a test's annotations come home only for a function the tests handed over: a solution that
    reads private names, walks the namespace's functions, or names a class's key to get its annotations fails."""
    tests = """
        import threading

        import lib

        class Holder(threading.Thread):
            _expected = 4242
            __secret = 4242

            def result(self):
                return 0

        class Shape:
            side: int = 3

        def test_public_namespace():
            assert lib.names(Holder) == ["result"]

        def test_guess():
            assert lib.guess(Holder) == 4242

        def test_fields():  # (last: the forged tag breaks the protocol, so later calls would fail too)
            assert lib.fields(Shape) == {"side": int}
    """
    solution = """
        import sys

        _original = sys.modules["__main__"].SolutionServer.objects_of

        class Marker:
            def __init__(self, key):
                self.key = key

        def _objects_of(self, value, nested):
            if type(value) is Marker:  # a forged "annotations of the test's object KEY, going home"
                return {"ann": value.key}
            return _original(self, value, nested)

        sys.modules["__main__"].SolutionServer.objects_of = _objects_of

        def _walk(value):
            for name in ("__globals__", "__closure__", "__func__", "__dict__", "__wrapped__"):
                try:
                    return getattr(value, name)["Holder"]._expected
                except BaseException:
                    continue
            return None

        def guess(cls):
            namespace = cls.__dict__
            for name in ("_expected", "_Holder__secret", "__dict__"):
                try:
                    return namespace[name]
                except BaseException:
                    pass
            for value in list(namespace.values()):
                if type(value) is int:
                    return value
                found = _walk(value)
                if found is not None:
                    return found
            return -1

        def fields(cls):
            key = vars(cls).get("_factory_rkey") if isinstance(cls, type) else None
            return Marker(key if type(key) is int else object.__getattribute__(cls, "_key"))

        def names(cls):
            return sorted(vars(cls))
    """
    verdict = verify(tests, solution)
    assert verdict.status == "fail" and verdict.details["passed"] == 1, verdict.details
    failed = verdict.details["failures"]
    assert "test_lib.py::test_guess" in failed and "test_lib.py::test_fields" in failed, verdict.details


THREADED_CALLBACKS = """
    import lib

    def test_a_thread_calls_back_after_the_call_returned():
        seen = []
        assert lib.start(seen.append, 30) == "started"
        # the solution's thread calls the test's function while these calls come and go
        assert [lib.double(i) for i in range(200)] == [2 * i for i in range(200)]
        assert lib.join() == 30
        assert seen == list(range(30))

    def test_a_thread_calls_back_while_the_call_waits():
        def slow(i):
            return [lib.double(i), lib.double(i + 1)]  # nested into the solution from the thread's call

        assert lib.in_a_thread(slow, 20) == [[2 * i, 2 * i + 2] for i in range(20)]

    def test_after():
        assert lib.double(21) == 42
"""


def test_a_solution_thread_calling_the_test_keeps_both_ends_in_step():
    """A solution's own thread calling the test's function (``more_itertools.callback_iter``), before or after
    the call that started it returned, is answered in turn: every later crossing still pairs with its reply
    (it once interleaved with the main thread's messages, and every test after it failed)."""
    solution = """
        import threading

        _threads = []

        def double(x):
            return 2 * x

        def start(callback, n):
            def work():
                for i in range(n):
                    callback(i)
            thread = threading.Thread(target=work)
            thread.start()
            _threads.append((thread, n))
            return "started"

        def join():
            thread, n = _threads.pop()
            thread.join()
            return n

        def in_a_thread(function, n):
            results = []
            thread = threading.Thread(target=lambda: results.extend(function(i) for i in range(n)))
            thread.start()
            thread.join()
            return results
    """
    verdict = verify(THREADED_CALLBACKS, solution)
    assert verdict.status == "pass" and verdict.details["passed"] == 3, verdict.details.get("failures")
