"""Copies kept on purpose (transformers' one-file-per-model style) stay equal to their origin.

A function or class under a `# Copied from <module>.<name>[ with A->B, C->D]` comment in hf_vit_plus/models/ must be
the origin's source with the replacements applied, as transformers' `utils/check_copies.py` checks its `# Copied
from` comments. Parallel declarations that cannot be copies (signatures, config fields) are checked by name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[2] / "hf_vit_plus" / "models"
MARKER = re.compile(  # a top-level function or class under its marker
    r"^# Copied from (?P<module>\w+)\.(?P<name>[\w.]+)(?: with (?P<replace>.+))?\n(?:class|def) (?P<target>\w+)", re.M
)


def _marked_copies() -> list[tuple[str, str, str, str, str]]:
    copies = []
    for path in sorted(MODELS.glob("*.py")):
        for m in MARKER.finditer(path.read_text()):
            copies.append((path.stem, m["target"], m["module"], m["name"], m["replace"] or ""))
    return copies


def _object(module: str, dotted: str):
    obj = importlib.import_module(f"hf_vit_plus.models.{module}")
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


COPIES = _marked_copies()


def _bodies(tree) -> list[tuple[str, str]]:
    """(name, normalised source) of every function and class of a module, methods included, with the definition's
    own name and docstring left out, so that a copy under another name is found."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = [
                stmt for stmt in node.body if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
            ]
            if sum(len(ast.unparse(stmt).splitlines()) for stmt in body) >= 4:  # one-liners are not copies
                found.append((node.name, "\n".join(ast.unparse(stmt) for stmt in body)))
    return found


def test_no_unmarked_copy_of_model_code():
    """Code shared by the families lives once (layers.py, attention_reference.py, ...): a function or class whose
    body stands twice in models/ must be a marked copy (`# Copied from`), which the test below keeps equal."""
    marked = {target for _, target, *_ in COPIES}
    seen: dict[str, str] = {}
    copies = []
    for path in sorted(MODELS.glob("*.py")):
        for name, body in _bodies(ast.parse(path.read_text())):
            where = f"{path.stem}.{name}"
            if body in seen and name not in marked:
                copies.append(f"{where} repeats {seen[body]}")
            seen.setdefault(body, where)
    assert copies == []


@pytest.mark.parametrize(("module", "target", "origin_module", "origin", "replace"), COPIES)
def test_a_marked_copy_equals_its_origin(module, target, origin_module, origin, replace):
    expected = inspect.getsource(_object(origin_module, origin))
    for pair in filter(None, (p.strip() for p in replace.split(","))):
        old, new = pair.split("->")
        expected = expected.replace(old.strip(), new.strip())
    assert inspect.getsource(_object(module, target)) == expected, (
        f"{module}.{target} is marked '# Copied from {origin_module}.{origin}' but differs from it: change both, or "
        "drop the marker if the copy is no longer one"
    )


def test_the_seq2seq_head_takes_the_base_model_arguments_plus_labels():
    from hf_vit_plus.models.modeling_seq2seq_transformer import (
        Seq2SeqTransformerForConditionalGeneration,
        Seq2SeqTransformerModel,
    )

    base = list(inspect.signature(Seq2SeqTransformerModel.forward).parameters.values())
    head = list(inspect.signature(Seq2SeqTransformerForConditionalGeneration.forward).parameters.values())
    assert [p for p in head if p.name != "labels"] == base
    # `labels` follows the inputs, before the flags, as in transformers' BART.
    assert [p.name for p in head].index("labels") == [p.name for p in base].index("use_cache")


def test_the_vit_and_lm_configs_share_transformers_field_names_in_one_order():
    from hf_vit_plus import SparseTransformerConfig, ViTPlusConfig

    shared = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
              "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps", "qkv_bias",
              "attention_type", "sparse_stride", "sparse_summary_size", "sparse_num_summary_blocks",
              "sparse_pattern_mode"]  # fmt: skip
    for config_class in (ViTPlusConfig, SparseTransformerConfig):
        names = list(inspect.signature(config_class.__init__).parameters)
        assert [name for name in names if name in shared] == shared, config_class.__name__
