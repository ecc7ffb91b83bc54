"""Logging and progress bars for hf_vit_plus, as transformers does them, under transformers' own settings.

The package's loggers ("hf_vit_plus" and its children: every module logs with `logging.getLogger(__name__)`) follow
transformers' verbosity (`transformers.logging.set_verbosity_info()`, the `TRANSFORMERS_VERBOSITY` variable): the
package's root logger hangs under transformers' library logger, whose level it inherits. As transformers does for its
own, the package's root logger has a handler of its own (stderr, each record's message as it is) and does not
propagate to the root logger (`enable_propagation()` lets records through, e.g. to pytest's `caplog`).
`set_verbosity` sets the package's own level instead (the `-q` / `-v` / `--log_level` flags of `hf-vit-plus` do), and
`HF_VIT_PLUS_VERBOSITY` ("debug", "info", "warning", "error", "critical") sets it from the environment. Progress
bars are transformers' (`tqdm` below): `disable_progress_bar()` here or in `transformers.utils.logging` switches off
both packages' bars.

    from hf_vit_plus.utils import logging

    logging.set_verbosity_info()  # the package's INFO lines, transformers' stay at its own level
    logging.disable_progress_bar()
"""

from __future__ import annotations

import errno
import logging
import os
import sys

ROOT_LOGGER = "hf_vit_plus"
VERBOSITY_ENV = "HF_VIT_PLUS_VERBOSITY"
# The names of `--log_level` (transformers' `TrainingArguments.log_level`) and of the environment variables.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

_configured = False


class _StderrHandler(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a record comes (pytest, notebooks and `contextlib.redirect_stderr` replace
    it), not as it was when the handler was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it: the property decides
        pass


def _package_logger() -> logging.Logger:
    """The package's root logger, set up the first time it is asked for: under transformers' library logger (whose
    level it inherits: `getEffectiveLevel` walks up the parents), with a handler of its own, not propagating."""
    global _configured
    logger = logging.getLogger(ROOT_LOGGER)
    if not _configured:
        from transformers.utils import logging as transformers_logging

        # get_logger configures transformers' library logger (its handler, its verbosity) before it is returned
        logger.parent = transformers_logging.get_logger("transformers")
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        level = os.environ.get(VERBOSITY_ENV)
        if level:
            if level.lower() not in LOG_LEVELS:
                raise ValueError(f"{VERBOSITY_ENV}={level!r}: expected one of {', '.join(LOG_LEVELS)}.")
            logger.setLevel(LOG_LEVELS[level.lower()])
        _configured = True
    return logger


def enable_propagation() -> None:
    """Let the package's records reach the root logger's handlers too (its own handler still prints them)."""
    _package_logger().propagate = True


def disable_propagation() -> None:
    """Keep the package's records to its own handler (the default)."""
    _package_logger().propagate = False


def configure() -> None:
    """Hang the package's loggers under transformers' (what `import hf_vit_plus` does; idempotent)."""
    _package_logger()


def get_logger(name: str | None = None) -> logging.Logger:
    """The logger `name` (a module's `__name__`), by default the package's root logger.

    Args:
        name: a logger name, "hf_vit_plus" or below it.

    Returns:
        The `logging.Logger`.
    """
    _package_logger()
    return logging.getLogger(name or ROOT_LOGGER)


def get_verbosity() -> int:
    """The level the package logs at: its own where one was set, else transformers' verbosity."""
    return _package_logger().getEffectiveLevel()


def set_verbosity(level: int | str) -> None:
    """Log the package's records from `level` up, whatever transformers' verbosity.

    Args:
        level: a `logging` level (`logging.INFO`) or its name ("info", as `--log_level` takes it).

    Raises:
        ValueError: for a name that is not a level.
    """
    if isinstance(level, str):
        if level.lower() not in LOG_LEVELS:
            raise ValueError(f"Unknown log level {level!r}: expected one of {', '.join(LOG_LEVELS)}.")
        level = LOG_LEVELS[level.lower()]
    _package_logger().setLevel(level)


def reset_verbosity() -> None:
    """Follow transformers' verbosity again (undo `set_verbosity`)."""
    _package_logger().setLevel(logging.NOTSET)


def set_verbosity_debug() -> None:
    set_verbosity(logging.DEBUG)


def set_verbosity_info() -> None:
    set_verbosity(logging.INFO)


def set_verbosity_warning() -> None:
    set_verbosity(logging.WARNING)


def set_verbosity_error() -> None:
    set_verbosity(logging.ERROR)


def disable_progress_bar() -> None:
    """Switch off the progress bars of hf_vit_plus and transformers (one setting, transformers')."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def enable_progress_bar() -> None:
    """Switch the progress bars of hf_vit_plus and transformers back on."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.enable_progress_bar()


def is_progress_bar_enabled() -> bool:
    from transformers.utils import logging as transformers_logging

    return transformers_logging.is_progress_bar_enabled()


# Errors of a write to a full disk or past a file-size limit (stderr redirected to a log file there).
_FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})


class _BarStream:
    """stderr for a progress bar: a write that fails because the disk is full or a file-size limit is reached (stderr
    redirected to a log file on that disk) is dropped, with the bar's later writes, instead of raising from the bar
    and hiding the error the run reports about that disk."""

    def __init__(self, stream):
        self._stream = stream
        self._broken = False

    def write(self, text: str) -> int:
        if not self._broken:
            try:
                return self._stream.write(text)
            except OSError as error:
                if error.errno not in _FULL_DISK_ERRNOS:
                    raise
                self._broken = True
        return len(text)

    def flush(self) -> None:
        if not self._broken:
            try:
                self._stream.flush()
            except OSError as error:
                if error.errno not in _FULL_DISK_ERRNOS:
                    raise
                self._broken = True

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def tqdm(*args, **kwargs):
    """A progress bar (`tqdm.auto.tqdm`'s arguments), or one that shows nothing where progress bars are switched off
    (`disable_progress_bar`): transformers' own. By default a bar shows only once its work has taken a second
    (`delay=1.0`), so that quick work, and an error found before any, prints no bar; it writes to stderr, and stops
    writing where stderr is a file on a full disk (the run's own error about the disk is what the user sees)."""
    from transformers.utils import logging as transformers_logging

    kwargs.setdefault("delay", 1.0)
    kwargs.setdefault("file", _BarStream(sys.stderr))
    return transformers_logging.tqdm(*args, **kwargs)


__all__ = [
    "LOG_LEVELS",
    "ROOT_LOGGER",
    "VERBOSITY_ENV",
    "configure",
    "disable_progress_bar",
    "disable_propagation",
    "enable_progress_bar",
    "enable_propagation",
    "get_logger",
    "get_verbosity",
    "is_progress_bar_enabled",
    "reset_verbosity",
    "set_verbosity",
    "set_verbosity_debug",
    "set_verbosity_error",
    "set_verbosity_info",
    "set_verbosity_warning",
    "tqdm",
]
