"""Reading pickles from files torchrig did not necessarily write, without running their code.

A pickle names the callables that rebuild its objects (``module.name``) and unpickling calls them, so a
plain ``pickle.load`` of a crafted file runs anything (``os.system``). :class:`Restricted` resolves only the
names its ``admit`` policy allows and refuses every other one with :class:`RefusedPickle`, before importing
or calling anything. Two policies use it: a flight record admits nothing (plain data only,
``torchrig.launch.flightrec``), a DCP checkpoint's ``.metadata`` admits DCP's own metadata records
(``torchrig.train.checkpoint``).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import IO, Any

Admit = Callable[[str, str, Callable[[], Any]], bool]
"""``admit(module, name, resolve)``: True to allow ``module.name``; ``resolve()`` imports and returns it
(call it only for a module already known to be safe to import)."""


class RefusedPickle(pickle.UnpicklingError):
    """The pickle names a callable its policy does not admit; nothing was called."""


def nothing(module: str, name: str, resolve: Callable[[], Any]) -> bool:
    """The plain-data policy: dicts, lists, tuples, strings, numbers, bytes, booleans and None only."""
    return False


class Restricted(pickle.Unpickler):
    """An unpickler that resolves only what ``admit`` allows (``what`` says what the data may hold)."""

    def __init__(self, file: IO[bytes], admit: Admit, what: str) -> None:
        super().__init__(file)
        self.admit, self.what = admit, what

    def find_class(self, module: str, name: str) -> Any:
        cache: list[Any] = []

        def resolve() -> Any:
            if not cache:
                cache.append(super(Restricted, self).find_class(module, name))
            return cache[0]

        if not self.admit(module, name, resolve):
            raise RefusedPickle(f"{self.what}, not {module}.{name}")
        return resolve()


def loads(data: bytes, admit: Admit, what: str) -> Any:
    """Unpickle ``data`` under ``admit``; raises :class:`RefusedPickle` or another ``UnpicklingError``."""
    return Restricted(io.BytesIO(data), admit, what).load()
