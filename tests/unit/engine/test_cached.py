"""`app.engine.cached.cached_property`: computed once per instance, and by two threads at once for two
instances (``functools.cached_property`` before Python 3.12 serialises every instance on one lock)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from headscope.engine.cached import cached_property


class Counted:
    calls = 0

    def __init__(self, barrier: threading.Barrier | None = None):
        self.barrier = barrier

    @cached_property
    def value(self) -> int:
        """The instance's id."""
        type(self).calls += 1
        if self.barrier is not None:
            self.barrier.wait()
        return id(self)


def test_computed_once_and_kept():
    Counted.calls = 0
    c = Counted()
    assert c.value == c.value == id(c)
    assert Counted.calls == 1
    assert Counted.value.__doc__ == "The instance's id."


def test_two_instances_compute_at_once():
    both = threading.Barrier(2, timeout=10)
    a, b = Counted(both), Counted(both)
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda o: o.value, [a, b])) == [id(a), id(b)]
