"""Lazy package attributes (PEP 562), as transformers' own lazy module reads its names: a package lists which module
defines each public name, and the module is imported when the name is first asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_attributes(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list]]:
    """The `__getattr__` and `__dir__` of a package whose public names are imported on first use.

    Args:
        package: the package's `__name__`.
        names: public name -> the module that defines it, relative to the package (".card").

    Returns:
        `(__getattr__, __dir__)`, to assign at the package's module level.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups find it without calling __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
