"""User-input errors of the command line.

Validation code raises `UsageError` (a `ValueError`, so Python callers see the usual exception) for a bad value
the user typed: an unknown config field, a folder that does not exist, an option out of range. `hf-vit-plus`
prints such an error as one line, `hf-vit-plus <command>: error: <message>`, and exits with status 2, as argparse
does for the errors it finds itself. A `StepFailedError` (a final step failed, its work kept) is one line with
status 1; any other exception keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class UsageError(ValueError):
    """A bad command-line (or config) value; the message names the value and what was expected."""


class StepFailedError(RuntimeError):
    """A step failed after the work it follows was done and kept (a push after training: the model is saved). The
    command line prints the message, which says where the work is and how to redo the step, as one line and exits
    with status 1, without a traceback."""


def check_exists(path: str | Path, option: str, kind: str = "any") -> Path:
    """`path` as a `Path`; a `UsageError` naming `option` if it does not exist or is not a `kind`
    ("file", "dir" or "any")."""
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise UsageError(f"{option} {str(path)!r} does not exist.")
    if kind == "dir" and not resolved.is_dir():
        raise UsageError(f"{option} {str(path)!r} is not a folder.")
    if kind == "file" and not resolved.is_file():
        raise UsageError(f"{option} {str(path)!r} is not a file.")
    return resolved


def check_model_location(location: str | Path, option: str) -> None:
    """A saved-model argument must be an existing folder or a Hub id ('name' or 'namespace/name').

    A value that cannot be a Hub id (an absolute path, '..', more than one '/', ...) and is not a folder is refused
    here, before a download is attempted; a Hub id that does not exist is left to `from_pretrained`."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    path = Path(location).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise UsageError(f"{option} {str(location)!r} is a file; expected a saved model folder or a Hub id.")
    try:
        validate_repo_id(str(location))
    except HFValidationError:
        raise UsageError(
            f"{option} {str(location)!r} does not exist (expected a saved model folder or a Hub id 'namespace/name')."
        ) from None


def load_config(location: str | Path, option: str, **kwargs):
    """`AutoConfig.from_pretrained(location, **kwargs)`, with a `UsageError` naming `option` when `location` is
    neither a folder holding a model config nor a model on the Hub."""
    from transformers import AutoConfig

    check_model_location(location, option)
    try:
        return AutoConfig.from_pretrained(location, **kwargs)
    except (OSError, ValueError) as error:  # no config.json / not found on the Hub / unknown model_type
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UsageError(f"Cannot load a model config from {option} {str(location)!r}: {first_line}") from error


@contextmanager
def user_errors() -> Iterator[None]:
    """Report the `ValueError`s raised by the checks of what the user gave (a run's data, config and sizes, a
    checkpoint that is not the model asked for) as `UsageError`s: the command line prints them as one line with exit
    status 2, Python callers still get a `ValueError`. Wrap only such checks: an error of the computation itself is
    a bug and keeps its traceback."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from error


__all__ = ["UsageError", "check_exists", "check_model_location", "load_config", "user_errors"]
