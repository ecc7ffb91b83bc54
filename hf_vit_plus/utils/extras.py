"""The optional dependencies: which extra of `pip install "hf_vit_plus[...]"` brings what, and the one-line stop of
a feature whose extra is missing.

The core package loads, runs, fine-tunes (transformers' `Trainer`) and shares the three families. The rest is an
extra, named as users expect:

- `train`: `hf-vit-plus train` / `demo` (TensorBoard logs, the digits data set from scikit-learn, BLEU / chrF with
  sacrebleu, the card's figures with matplotlib);
- `fast`: fast decoding's C++ kernels (ninja; a C++ compiler too) and int8 quantization (torchao);
- `export`: ONNX export and onnxruntime, CTranslate2 conversion and decoding;
- `interpret`: interpretability figures (matplotlib);
- `space`: the demo Space `hf-vit-plus space` writes (Gradio);
- `all`: every extra.

`require` is called where a feature starts, before any work: a missing module stops it with `MissingExtraError`, one
line naming the `pip install` command (the command line prints it as its error).
"""

from __future__ import annotations

import importlib.util

# extra -> the modules (import names) it brings; pyproject.toml's optional dependencies, as imported
# (tests/test_packaging.py checks that the two agree).
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("tensorboard", "sklearn", "sacrebleu", "matplotlib"),
    "fast": ("ninja", "torchao"),
    "export": ("onnx", "onnxscript", "onnxruntime", "ctranslate2"),
    "interpret": ("matplotlib",),
    "space": ("gradio",),
}
# import name -> distribution name, where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn"}


class MissingExtraError(ImportError):
    """A feature needs an optional dependency that is not installed; the message is one line with the command that
    installs it."""


def missing_modules(*modules: str) -> list[str]:
    """The modules among `modules` that cannot be imported (without importing any)."""
    return [module for module in modules if importlib.util.find_spec(module) is None]


def install_hint(extra: str) -> str:
    """The command that installs `extra`."""
    return f'pip install "hf_vit_plus[{extra}]"'


def require(extra: str, feature: str, modules: tuple[str, ...] | list[str] | None = None) -> None:
    """Stop `feature` before it starts when a module of `extra` is not installed.

    Args:
        extra: a key of `EXTRAS` ("train", "fast", "export", "interpret").
        feature: what the user asked for, for the message ("hf-vit-plus train", "ONNX export").
        modules: the modules the feature needs (default: every module of the extra).

    Raises:
        MissingExtraError: one line naming the missing modules and `pip install "hf_vit_plus[extra]"`.
    """
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}: expected one of {', '.join(EXTRAS)}.")
    missing = missing_modules(*(EXTRAS[extra] if modules is None else modules))
    if missing:
        names = ", ".join(DISTRIBUTIONS.get(module, module) for module in missing)
        raise MissingExtraError(f"{feature} needs {names} (not installed): {install_hint(extra)}")


__all__ = ["DISTRIBUTIONS", "EXTRAS", "MissingExtraError", "install_hint", "missing_modules", "require"]
