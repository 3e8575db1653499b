"""Named, lazily imported extensions: the registries of gates and triggers.

A :class:`Registry` maps a name to a class. Built-ins are ``"module:Class"`` strings imported on first use (so
``import ragate`` stays fast); a user adds one with the registry's decorator from their own code, or from an
installed package through an entry point of the registry's group (``[project.entry-points."ragate.gates"]``
``my-gate = "my_package.gates:MyGate"``), which ragate finds the first time a name is not a built-in.
Registration only adds: a name, once taken, names the same class for the life of the process (taking it again
with another class is an error), so nothing a user registers can change what a built-in name means.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from ragate.errors import RagateError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to classes of one kind (``what``: "gate", "trigger"), built-in or registered, with "did you mean"."""

    def __init__(self, what: str, group: str, builtins: Mapping[str, str], base: type[T]) -> None:
        self.what, self.group, self.base = what, group, base
        self._builtins = dict(builtins)  # name -> "module:Class", imported on first use
        self._loaded: dict[str, type[T]] = {}
        self._registered: dict[str, type[T]] = {}  # registered from user code or an entry point
        self._entry_points: dict[str, EntryPoint] | None = None
        self._lock = threading.RLock()

    def register(self, name: str, cls: type[T]) -> type[T]:
        """Add ``cls`` under ``name``; returns ``cls`` (so it works as a decorator's body)."""
        if not isinstance(name, str) or not name or name != name.strip() or any(c.isspace() for c in name):
            raise RagateError(f"a {self.what} name must be a non-empty word without spaces, got {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise RagateError(
                f"{self.what} {name!r}: register a subclass of {self.base.__module__}.{self.base.__name__}, "
                f"not {cls!r}"
            )
        with self._lock:
            if name in self._builtins:
                raise RagateError(f"{self.what} name {name!r} is built into ragate: choose another name")
            held = self._registered.get(name)
            if held is not None and held is not cls and _qualname(held) != _qualname(cls):
                raise RagateError(
                    f"{self.what} name {name!r} is already registered by {_qualname(held)}: choose another name"
                )
            self._registered[name] = cls
            self._loaded.pop(name, None)  # the same class re-imported (a test module loaded twice)
        if not getattr(cls, "name", ""):  # a class says its own name in messages and traces
            cls.name = name  # type: ignore[attr-defined]
        return cls

    def decorator(self, name: str) -> Callable[[type[T]], type[T]]:
        def add(cls: type[T]) -> type[T]:
            return self.register(name, cls)

        return add

    def get(self, name: str) -> type[T]:
        """The class named ``name``; an unknown name is a :class:`RagateError` with the closest name."""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            if name in self._builtins:
                module, _, attr = self._builtins[name].partition(":")
                cls = getattr(importlib.import_module(module), attr)
            elif name in self._registered:
                cls = self._registered[name]
            elif name in self._plugins():
                cls = self._load_entry_point(name)
            else:
                close = difflib.get_close_matches(name, self.names(), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise RagateError(f"unknown {self.what} {name!r}.{hint} Choose one of: {', '.join(self.names())}")
            self._loaded[name] = cls
            return cls

    def names(self, *, builtin_only: bool = False) -> tuple[str, ...]:
        """Built-in names in their order, then registered and entry-point names sorted."""
        if builtin_only:
            return tuple(self._builtins)
        with self._lock:
            extra = sorted(set(self._registered) | set(self._plugins()) - set(self._builtins))
        return (*self._builtins, *extra)

    def is_builtin(self, name: str) -> bool:
        return name in self._builtins

    def _plugins(self) -> dict[str, EntryPoint]:
        """The entry points of this registry's group, read once (installed packages do not change while running)."""
        if self._entry_points is None:
            self._entry_points = {ep.name: ep for ep in entry_points(group=self.group)}
        return self._entry_points

    def _load_entry_point(self, name: str) -> type[T]:
        ep = self._plugins()[name]
        try:
            target: Any = ep.load()
        except Exception as err:  # a broken plugin names itself, not a traceback inside importlib
            raise RagateError(
                f"{self.what} {name!r} from entry point {ep.value!r} (group {self.group}) failed to load: "
                f"{type(err).__name__}: {err}"
            ) from err
        if name in self._registered:  # importing it ran its decorator
            return self._registered[name]
        return self.register(name, target)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
