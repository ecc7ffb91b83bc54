"""The package's imports go one way. Every module of hf_vit_plus is parsed with `ast` (no import is run), and every
import it states is an arrow: at module level and inside functions (deferred imports count), absolute and relative.

- `models/` is what a checkpoint ships as remote code: it imports nothing of hf_vit_plus outside `models/`.
- No module imports one of a layer above its own (`LAYERS`, lowest first).
- The import graph has no cycle, deferred imports included (`KNOWN_CYCLES` would list a known one with its owner;
  none is left).

Not arrows here: a package's `__init__` that Python runs before a module of the package (else every module would
import the root package, and through it everything), and names imported by string (`importlib.import_module`, such
as a family record's `task`, which names the training task above it as data, the way transformers' Auto
mappings name model classes).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.utils import REPO_ROOT

PACKAGE = "hf_vit_plus"
PACKAGE_DIR = REPO_ROOT / PACKAGE

# Lowest first. A module belongs to the layer of the longest prefix that names it (a package names its modules).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("models: what a checkpoint ships as remote code", ("hf_vit_plus.models",)),
    (
        "foundations: data sets, converters, metrics, tokenizer, errors, argparse types",
        (
            "hf_vit_plus._lazy",
            "hf_vit_plus.utils",
            "hf_vit_plus.errors",
            "hf_vit_plus.cli_utils",
            "hf_vit_plus.cpu_precision",
            "hf_vit_plus.quantization",
            "hf_vit_plus.generation",
            "hf_vit_plus.tokenization",
            "hf_vit_plus.data",
            "hf_vit_plus.metrics",
            "hf_vit_plus.conversion",
        ),
    ),
    ("the family records and the Auto-class registration", ("hf_vit_plus.families", "hf_vit_plus.registration")),
    (
        "what is done with a model: training, cards and pushing, figures, export, serving, sampling",
        (
            "hf_vit_plus.training",
            "hf_vit_plus.hub",
            "hf_vit_plus.interpret",
            "hf_vit_plus.export",
            "hf_vit_plus.serving",
            "hf_vit_plus.image_generation",
        ),
    ),
    (
        "the package's public API (importing it registers the classes, the card hook, the Trainer integration)",
        ("hf_vit_plus", "hf_vit_plus.integrations"),
    ),
    (
        "the sub-commands of hf-vit-plus",
        (
            "hf_vit_plus.conversion.cli",
            "hf_vit_plus.interpret.cli",
            "hf_vit_plus.training.cli",
            "hf_vit_plus.hub.cli",
            "hf_vit_plus.export_cli",
            "hf_vit_plus.sample_cli",
            "hf_vit_plus.env_cli",
        ),
    ),
    ("the command line's root", ("hf_vit_plus.cli",)),
]

# Import cycles that are known and have an owner; each is a set of modules.
KNOWN_CYCLES: list[set[str]] = []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# Python files the package writes out for its users (a generated Space's app.py), not modules the package imports:
# they import the public API as any user's code does.
TEMPLATES = ("hf_vit_plus.hub.space_templates",)


def _modules() -> dict[str, Path]:
    modules = {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}
    return {name: path for name, path in modules.items() if not name.startswith(TEMPLATES)}


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of the package that `name` imports anywhere in its source (resolved: `from . import x` names the
    module x where there is one, else the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names]
            targets = [target if target in MODULES else module for target in targets]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                # `import hf_vit_plus.a.b` may name a module below one of ours; the innermost module it names
                while target not in MODULES:
                    target = target.rpartition(".")[0]
                found.add(target)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to tests/test_layout.py's LAYERS"
    return best


def test_the_parser_sees_deferred_and_relative_imports():
    """The graph holds what the tests below rely on: an import inside a function, `from . import x` of a module, and
    a relative import two levels up."""
    assert "hf_vit_plus.models.sparse_attention" in GRAPH["hf_vit_plus.models.attention"]  # inside a function
    assert "hf_vit_plus.training.cli" in GRAPH["hf_vit_plus.cli"]  # `from hf_vit_plus.training import cli`
    assert "hf_vit_plus.data.images" in GRAPH["hf_vit_plus.families.record"]  # `from ..data.images import ...`
    assert {"hf_vit_plus.errors", "hf_vit_plus.families"} <= GRAPH["hf_vit_plus.training.tasks.base"]  # `...`


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_models_import_nothing_of_the_package_outside_models():
    """`models/` is copied next to the weights and run as remote code, where the package may not exist."""
    offending = {
        module: sorted(target for target in targets if not target.startswith("hf_vit_plus.models"))
        for module, targets in GRAPH.items()
        if module.startswith("hf_vit_plus.models")
    }
    assert {module: targets for module, targets in offending.items() if targets} == {}


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def test_the_import_graph_has_no_cycle():
    unknown = [sorted(cycle) for cycle in _cycles(GRAPH) if cycle not in KNOWN_CYCLES]
    assert unknown == [], "import cycles (deferred imports included)"


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [{"a", "b", "c"}]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [{"a", "b"}, {"c", "d"}]),
    ],
)
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert sorted(map(sorted, _cycles(graph))) == sorted(map(sorted, expected))
