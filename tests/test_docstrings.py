"""Every public name has a docstring a reference can be generated from (Google style, as docs/reference/api.md renders
with mkdocstrings).

Public: the names in the `__all__` of `hf_vit_plus` and of each of its packages that defines one (lazy names are read
with `getattr`), the public methods those classes define (or inherit from a class of hf_vit_plus), and the command
line's entry points: `hf_vit_plus.cli.main` and the `func` that each sub-command's parser sets.

- Every function, method and class has a docstring of its own (not one inherited from transformers or torch).
- A function or method that takes parameters (besides self / cls) names each in an `Args:` section; `*args` and
  `**kwargs` may be named (as `*args` / `**kwargs`) or left out.
- A function that returns something (an annotation other than `None`, or a `return` with a value) has a `Returns:`
  section; a generator may have `Yields:` instead (a context manager, `Iterator[None]`, needs neither).
- A class's docstring (or its `__init__`'s) names the constructor's parameters in `Args:` (a dataclass may use
  `Attributes:`, or the field's `help` metadata as transformers' `HfArgumentParser` reads it). A configuration
  (`PretrainedConfig`) may name related fields on one line (`encoder_layers / decoder_layers: ...`). A property is an
  attribute: it needs a docstring, no sections.
- The `forward` of a model (`nn.Module`) follows transformers' conventions, which document its arguments once for all
  models: it needs a docstring, not an `Args:` entry per argument.

Not checked: data (`__version__`, `FAMILIES`, `DIGIT_NAMES`, paths...), which cannot carry a docstring of its own; the
module docstring or the reference page describes it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import pkgutil
import re
import textwrap

import pytest

import hf_vit_plus

SECTION = re.compile(r"^(?P<name>[A-Z][A-Za-z ]*):\s*$")
KNOWN_SECTIONS = {
    "Args", "Arguments", "Parameters", "Returns", "Return", "Yields", "Raises", "Example", "Examples", "Note", "Notes",
    "Attributes", "Warning", "Warnings", "See Also", "References",
}  # fmt: skip
ARG_SECTIONS = {"Args", "Arguments", "Parameters"}
# `name:`, `name (type):`, `a / b:` (related fields of a config), `*args:`, `**kwargs:`
ENTRY = re.compile(r"^(?P<names>\*{0,2}\w+(?:\s*[/,]\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?\s*:(?:\s|$)")


def _sections(doc: str) -> dict[str, list[str]]:
    """Section name -> the names of its entries (for every section; entries only matter for the argument sections)."""
    sections: dict[str, list[str]] = {}
    lines = inspect.cleandoc(doc).splitlines()
    current = None
    entry_indent = None
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        header = SECTION.match(line)
        if indent == 0 and header and header["name"] in KNOWN_SECTIONS:
            current = header["name"]
            sections.setdefault(current, [])
            entry_indent = None
            continue
        if indent == 0:
            current = None
            continue
        if current is None:
            continue
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            entry = ENTRY.match(line.strip())
            if entry:
                sections[current].extend(n.strip().lstrip("*") for n in re.split(r"[/,]", entry["names"]))
    return sections


def _documented_args(sections: dict[str, list[str]], also: tuple[str, ...] = ()) -> set[str]:
    return {name for section in (*ARG_SECTIONS, *also) for name in sections.get(section, [])}


def _parameters(func, skip_first: bool = False) -> list[inspect.Parameter]:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return []
    if skip_first and params:
        params = params[1:]
    return [p for p in params if p.name not in ("self", "cls")]


def _returns_value(func) -> bool:
    annotation = inspect.signature(func).return_annotation
    if annotation is not inspect.Signature.empty:
        # a context manager (`Iterator[None]`) yields nothing to document
        context_manager = re.fullmatch(r"(Iterator|Generator)\[None.*\]", str(annotation))
        return annotation not in (None, "None") and not context_manager
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return False
    node = tree.body[0]

    def walk(n):  # the function's own returns, not those of nested functions or classes
        for child in ast.iter_child_nodes(n):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Return) and child.value is not None:
                if not (isinstance(child.value, ast.Constant) and child.value.value is None):
                    return True
            if walk(child):
                return True
        return False

    return walk(node)


def _function_problems(func, *, args_only_docstring: bool = False) -> list[str]:
    doc = func.__doc__
    if not doc or not doc.strip():
        return ["no docstring"]
    if args_only_docstring:
        return []
    problems = []
    sections = _sections(doc)
    documented = _documented_args(sections)
    missing = [
        p.name
        for p in _parameters(func)
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in documented
    ]
    if missing:
        problems.append(f"Args: lacks {', '.join(missing)}")
    if _returns_value(func) and not ({"Returns", "Return", "Yields"} & sections.keys()):
        problems.append("no Returns:")
    return problems


def _is_pretrained_config(cls) -> bool:
    try:
        from transformers import PretrainedConfig
    except ImportError:
        return False
    return issubclass(cls, PretrainedConfig)


def _is_module(cls) -> bool:
    try:
        import torch.nn as nn
    except ImportError:
        return False
    return issubclass(cls, nn.Module)


def _class_problems(cls) -> list[str]:
    own_doc = cls.__doc__ if "__doc__" in vars(cls) else None
    if dataclasses.is_dataclass(cls) and own_doc and own_doc.startswith(f"{cls.__name__}("):
        own_doc = None  # the signature dataclasses writes in place of a missing docstring
    init = vars(cls).get("__init__")
    init_doc = getattr(init, "__doc__", None) if init is not None else None
    docs = [d for d in (own_doc, init_doc) if d and d.strip()]
    if not docs:
        return ["no docstring"]
    sections: dict[str, list[str]] = {}
    for doc in docs:
        for name, entries in _sections(doc).items():
            sections.setdefault(name, []).extend(entries)
    also = ("Attributes",) if dataclasses.is_dataclass(cls) else ()
    documented = _documented_args(sections, also)
    if dataclasses.is_dataclass(cls):  # a field's `help` (HfArgumentParser's convention) documents it too
        documented |= {f.name for f in dataclasses.fields(cls) if f.metadata.get("help")}
    missing = [
        p.name
        for p in _parameters(cls)
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in documented
    ]
    return [f"Args: lacks {', '.join(missing)}"] if missing else []


def _own_methods(cls) -> dict[str, object]:
    """The public methods and properties `cls` defines or inherits from a class of hf_vit_plus."""
    methods: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("hf_vit_plus"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                methods[name] = value  # documented as an attribute: a docstring, no sections
            elif inspect.isfunction(value):
                methods[name] = value
    return methods


def _public_packages() -> list[str]:
    packages = ["hf_vit_plus"]
    for info in pkgutil.walk_packages(hf_vit_plus.__path__, "hf_vit_plus."):
        if info.ispkg:
            module = importlib.import_module(info.name)
            if hasattr(module, "__all__"):
                packages.append(info.name)
    return packages


def _cli_entry_points() -> dict[str, object]:
    from hf_vit_plus import cli

    entry_points = {"hf_vit_plus.cli.main": cli.main}

    def walk(parser: argparse.ArgumentParser, prog: str) -> None:
        func = parser._defaults.get("func")
        if func is not None:
            entry_points.setdefault(f"{func.__module__}.{func.__qualname__}", func)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prog} {name}")

    walk(cli.build_parser(), "hf-vit-plus")
    return entry_points


def public_objects() -> dict[str, tuple[object, str]]:
    """Qualified name -> (object, kind): kind is "function", "class", "method", "property" or "forward"."""
    objects: dict[str, tuple[object, str]] = {}
    seen: set[int] = set()

    def add(name: str, obj, kind: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        objects[name] = (obj, kind)

    for package in _public_packages():
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                add(f"{package}.{name}", obj, "class")
                is_model = _is_module(obj)
                for method_name, method in _own_methods(obj).items():
                    kind = "forward" if is_model and method_name == "forward" else "method"
                    if isinstance(method, property):
                        method, kind = method.fget, "property"
                    add(f"{package}.{name}.{method_name}", method, kind)
            elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
                add(f"{package}.{name}", obj, "function")
            # data (a str, a dict, a path) has no docstring of its own: not checked
    for name, func in _cli_entry_points().items():
        add(name, func, "function")
    return objects


def test_public_names_are_found():
    objects = public_objects()
    assert "hf_vit_plus.ViTPlusModel" in objects
    assert "hf_vit_plus.cli.main" in objects
    assert any(kind == "forward" for _, kind in objects.values())
    assert len(objects) > 100


def test_docstring_sections_are_parsed():
    doc = """Summary.

    Args:
        a: first.
        b (int): second,
            continued: not an entry.
        c / d: related fields.
        **kwargs: the rest.

    Returns:
        something.
    """
    sections = _sections(doc)
    assert sections["Args"] == ["a", "b", "c", "d", "kwargs"]
    assert "Returns" in sections


def _offenders() -> dict[str, list[str]]:
    offenders = {}
    for name, (obj, kind) in public_objects().items():
        if kind == "class":
            problems = _class_problems(obj)
        else:
            problems = _function_problems(obj, args_only_docstring=kind in ("forward", "property"))
        if problems:
            offenders[name] = problems
    return offenders


def test_public_docstrings():
    offenders = _offenders()
    lines = [f"{name}: {'; '.join(problems)}" for name, problems in offenders.items()]
    assert not offenders, f"{len(offenders)} public names lack docstring sections:\n" + "\n".join(lines)


@pytest.mark.parametrize("name", ["hf_vit_plus.Seq2SeqTransformerConfig", "hf_vit_plus.SparseTransformerConfig"])
def test_config_fields_are_documented(name):
    obj, _ = public_objects()[name]
    assert _is_pretrained_config(obj)
    assert not _class_problems(obj)
