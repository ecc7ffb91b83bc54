"""Drops one known, harmless log record that would otherwise print before every command's output.

torchao (imported by transformers when it is installed) registers its enums with torch's pytree, and torch 2.14
logs a deprecation warning per enum on stderr at import. Only those records are dropped; the logger keeps its level.
"""

from __future__ import annotations

import logging


class _DropTorchaoEnumNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "register_constant() on Enum subclasses is deprecated" not in record.getMessage()


logging.getLogger("torch.utils._pytree").addFilter(_DropTorchaoEnumNotice())
