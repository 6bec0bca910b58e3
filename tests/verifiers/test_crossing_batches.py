"""Fewer round trips, the same observations: whole-consumer batches and reused module-attribute handles.

Both ends of the boundary run for real on a socket pair (the solution end in a
forked child, no sandbox: a fraction of a second), as ``bench/bench_crossing.py`` does.
"""

from __future__ import annotations

import functools
import operator
import os
import socket
import sys
import traceback

import pytest

from factory.verifiers._solution_server import serve_connection
from factory.verifiers._trusted_runner import SolutionClient, SolutionFinder
from factory.verifiers._wire import Channel

SOLUTION = '''
LOG = []

class _Key(tuple):  # cachetools' _HashedTuple: a tuple subclass whose hash the solution computes and caches
    _cached = None

    def __hash__(self):
        if self._cached is None:
            self._cached = tuple.__hash__(self)
        return self._cached

def key(*args):
    return _Key(args)

def cached(cache):  # cachetools.cached(cache): the test's dict, kept by the solution
    def decorate(function):
        def wrapper(*args):
            k = key(*args)
            if k not in cache:
                cache[k] = function(*args)
            return cache[k]
        return wrapper
    return decorate

def f(x):
    return x + 1

def rebind(factor):
    global f
    f = lambda x: x * factor

def gen(n):
    for i in range(n):
        LOG.append(i)
        yield i

def failing(n):
    yield from range(n)
    raise ValueError("step")

def one(iterable, too_short=None):  # more_itertools.one: the error raised from the StopIteration
    it = iter(iterable)
    try:
        return next(it)
    except StopIteration as exc:
        raise (too_short or ValueError("too few items")) from exc
'''

pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="whole batches read CPython 3.11 bytecode")


class _Counting(Channel):
    def __init__(self, sock):
        super().__init__(sock)
        self.sent = 0

    def send(self, message):
        self.sent += 1
        super().send(message)


@pytest.fixture()
def remote(tmp_path):
    (tmp_path / "crossmod.py").write_text(SOLUTION)
    left, right = socket.socketpair()
    child = os.fork()
    if child == 0:  # the solution end: serve until the trusted end hangs up
        left.close()
        os.chdir(tmp_path)
        try:
            serve_connection(Channel(right), ["."])
        finally:
            os._exit(0)
    right.close()
    channel = _Counting(left)
    finder = SolutionFinder(SolutionClient(channel, 30), ["crossmod"])
    sys.meta_path.insert(0, finder)
    try:
        import crossmod  # noqa: PLC0415 -- served by the child

        yield crossmod, channel
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("crossmod", None)
        left.close()
        os.waitpid(child, 0)


def test_builtin_consumers_take_a_generator_in_one_batch(remote):
    mod, channel = remote
    mod.gen(1)  # (the function's handle: asked once)
    before = channel.sent
    got = list(mod.gen(50))  # (outside an assert, which pytest rewrites into temporaries)
    assert got == list(range(50))
    assert channel.sent - before == 1  # the call, its items with it
    g = mod.gen(40)
    assert list(g) == list(range(40))  # (a variable: the call, then one batch)
    assert sorted(mod.gen(3)) == [0, 1, 2] and set(mod.gen(3)) == {0, 1, 2} and sum(mod.gen(4)) == 6
    assert functools.reduce(operator.add, mod.gen(5), 0) == 10
    with pytest.raises(ValueError, match="step"):
        list(mod.failing(3))


def test_other_consumers_see_each_step_as_bare(remote):
    mod, _ = remote
    del mod.LOG[:]
    # map runs the test's function between steps: it must see the log of the steps so far only
    assert list(map(lambda x: (x, len(mod.LOG)), mod.gen(3))) == [(0, 1), (1, 2), (2, 3)]
    g = mod.gen(3)
    assert next(g) == 0 and len(mod.LOG) == 4
    assert list(g) == [1, 2]


def test_a_rebound_module_function_is_asked_for_again(remote):
    mod, channel = remote
    assert mod.f(1) == 2
    before = channel.sent
    assert mod.f(2) == 3
    assert channel.sent - before == 1  # the call only: the handle is reused
    mod.rebind(10)
    assert mod.f(1) == 10
    mod.f = lambda x: -x
    assert mod.f(1) == -1


def test_a_reply_whose_decoding_asks_the_solution_again_does_not_wait_for_its_own_turn(remote):
    """A test's dict the solution wrote a key into comes back with the call's reply; hashing that key (its
    class's own ``__hash__`` runs in the solution) asks the solution again while the reply is decoded. That
    request used to wait for the turn its own finished request still held, forever (cachetools' cached(cache)
    tests hung until the run's time limit)."""
    import signal

    crossmod, _ = remote

    def stuck(signum, frame):
        raise TimeoutError("the trusted end waited on its own turn")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        cache = {}
        wrapper = crossmod.cached(cache)(lambda x: x * 2)
        assert wrapper(0) == 0 and wrapper(1) == 2 and wrapper(1) == 2
        assert crossmod.key(0) in cache and crossmod.key(2) not in cache and len(cache) == 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_an_error_raised_from_another_crosses_with_its_cause(remote):
    mod, _ = remote
    for too_short, kind in [(None, ValueError), (IndexError, IndexError)]:
        with pytest.raises(kind) as caught:
            mod.one(iter([]), too_short=too_short)
        assert type(caught.value.__cause__) is StopIteration  # (OneTests::test_too_short reads the traceback)
        text = "".join(traceback.format_exception(caught.value))
        assert "StopIteration" in text and "The above exception was the direct cause" in text
    assert mod.one([5]) == 5
