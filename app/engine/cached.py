"""``cached_property`` without a lock, as ``functools.cached_property`` is from Python 3.12 on.

Before 3.12 ``functools.cached_property`` holds one lock per property for *every* instance of
the class while it computes: the pictures of one call, whose ids the preparation threads hash
at once, were hashed one after another (64 ids of 640 x 480 pictures on 2 threads: 31 ms with
that lock, 16 ms without). Two threads that read the same property at once may both compute
it; every property cached here is a pure function of its instance, so either value is the
same.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or sys.version_info >= (3, 12):
    from functools import cached_property
else:

    class cached_property:  # noqa: N801  # the name functools gives it
        """The value of ``func(instance)``, kept in the instance's ``__dict__`` when first read."""

        def __init__(self, func: Callable[[Any], Any]):
            self.func = func
            self.attrname: str | None = None
            self.__doc__ = func.__doc__

        def __set_name__(self, owner: type, name: str) -> None:
            self.attrname = name

        def __get__(self, instance: Any, owner: type | None = None) -> Any:
            if instance is None:
                return self
            value = self.func(instance)
            instance.__dict__[self.attrname] = value
            return value


__all__ = ["cached_property"]
