"""What `import hf_vit_plus` changes outside its own classes, in one place, and how to switch each part off.

1. The Auto classes (`hf_vit_plus.registration`): `AutoConfig`, `AutoModel*`, `AutoImageProcessor` know the three
   families. This is the package's job, through transformers' own `register` APIs.
2. The models' `push_to_hub` uploads the family's model card (`push_with_family_card`, set as the hook of
   `hf_vit_plus.models.hub_mixin`): only this package's models have the hook, and the card code is imported at the
   first push.
3. transformers' `Trainer`, for this package's models only (every other model is handled exactly as before):
   - `Trainer.create_model_card` (called by `Trainer.push_to_hub`) writes the family's card with the Trainer's
     evaluation results (`hf_vit_plus.hub.trainer_card`);
   - `Trainer.prediction_step` reports the loss of the self-supervised heads on batches without `labels`
     (`hf_vit_plus.training.trainer_hooks`).
   transformers offers no hook for either (`Trainer.push_to_hub` writes its own card after saving the model and
   before uploading, and no callback runs between the two; `prediction_step` decides that a batch has a loss from
   the label names alone), so the two methods are wrapped. Nothing is wrapped at import: the wrap is made when
   `transformers.trainer` is imported (at once if it already is), so `import hf_vit_plus` does not import the
   Trainer. `disable_trainer_integration()` removes both wrappers, as does setting `HF_VIT_PLUS_TRAINER_INTEGRATION=0`
   before the import.

4. The package's loggers ("hf_vit_plus.*") hang under transformers' library logger, so they follow its verbosity and
   handler (`hf_vit_plus.utils.logging`).

Nothing else: importing the package sets no log filter, changes no other logger and no global torch or transformers
setting.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable

from .models.hub_mixin import set_push_to_hub_hook
from .registration import register_auto_classes
from .utils import logging as package_logging

# "0" (or "false", "off", "no") before `import hf_vit_plus`: the Trainer is left as transformers wrote it.
TRAINER_INTEGRATION_ENV = "HF_VIT_PLUS_TRAINER_INTEGRATION"
TRAINER_MODULE = "transformers.trainer"
# the methods of transformers' Trainer that the integration wraps (each wrapper is marked `__wrapped_by_hf_vit_plus__`)
WRAPPED_TRAINER_METHODS = ("create_model_card", "prediction_step")
_OFF = {"0", "false", "off", "no"}


def push_with_family_card(model, repo_id: str, **options):
    """The models' `push_to_hub(repo_id, **options)` with the family's model card (`hf_vit_plus.hub.push.push_model`,
    imported at the first push)."""
    from .hub.push import push_model

    return push_model(model, repo_id, **options)


def _wrap_trainer(trainer_module) -> None:
    from .hub.trainer_card import install_trainer_card
    from .training.trainer_hooks import install_trainer_loss_inputs

    install_trainer_card(trainer_module.Trainer)
    install_trainer_loss_inputs(trainer_module.Trainer)


class _LoaderThenCall(importlib.abc.Loader):
    """A module's own loader, then `callback(module)` once the module has run."""

    def __init__(self, loader, callback: Callable):
        self._loader, self._callback = loader, callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        self._callback(module)

    def __getattr__(self, name):  # get_source, get_code, ...: the module's own loader answers
        return getattr(self._loader, name)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` right after the module `name` is first imported, then leaves `sys.meta_path`. It finds
    nothing itself: the module is found and loaded by the finders after it, as without it."""

    def __init__(self, name: str, callback: Callable):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        self.remove()
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _LoaderThenCall(spec.loader, self.callback)
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


_pending: _WhenImported | None = None


def enable_trainer_integration() -> None:
    """Wrap `Trainer.create_model_card` and `Trainer.prediction_step` for this package's models (see the module
    docstring): now if `transformers.trainer` is imported, else when it is. Idempotent."""
    global _pending
    if TRAINER_MODULE in sys.modules:
        _wrap_trainer(sys.modules[TRAINER_MODULE])
    elif _pending is None:
        _pending = _WhenImported(TRAINER_MODULE, _wrap_trainer)
        sys.meta_path.insert(0, _pending)


def disable_trainer_integration() -> None:
    """Leave transformers' `Trainer` as transformers wrote it: the wrappers are removed (or never made)."""
    global _pending
    if _pending is not None:
        _pending.remove()
        _pending = None
    trainer_module = sys.modules.get(TRAINER_MODULE)
    if trainer_module is not None:
        for name in WRAPPED_TRAINER_METHODS:
            method = vars(trainer_module.Trainer).get(name)
            if getattr(method, "__wrapped_by_hf_vit_plus__", False):
                setattr(trainer_module.Trainer, name, method.__wrapped__)  # functools.wraps kept the original


def trainer_integration_enabled() -> bool:
    """Whether the Trainer is (or will be, once imported) wrapped for this package's models."""
    if _pending is not None:
        return True
    trainer_module = sys.modules.get(TRAINER_MODULE)
    if trainer_module is None:
        return False
    methods = [getattr(trainer_module.Trainer, name) for name in WRAPPED_TRAINER_METHODS]
    return any(getattr(method, "__wrapped_by_hf_vit_plus__", False) for method in methods)


_integrated = False


def integrate() -> None:
    """Everything `import hf_vit_plus` does (idempotent): the package's loggers, the Auto classes, the models' push
    hook and, unless `HF_VIT_PLUS_TRAINER_INTEGRATION=0`, the Trainer integration."""
    global _integrated
    if _integrated:
        return
    package_logging.configure()
    register_auto_classes()
    set_push_to_hub_hook(push_with_family_card)
    if os.environ.get(TRAINER_INTEGRATION_ENV, "1").strip().lower() not in _OFF:
        enable_trainer_integration()
    _integrated = True


__all__ = [
    "TRAINER_INTEGRATION_ENV",
    "disable_trainer_integration",
    "enable_trainer_integration",
    "integrate",
    "push_with_family_card",
    "trainer_integration_enabled",
]
