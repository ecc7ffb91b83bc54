"""The one place that registers hf_vit_plus's classes with transformers' Auto classes, from the family records
(`hf_vit_plus.families`).

Two registrations per class:
- `AutoX.register(Config, Cls)` so that `AutoX.from_pretrained(dir)` works when the package is installed;
- `Cls.register_for_auto_class(...)` so that `save_pretrained` copies the model folder's modules next to the
  weights; each family's models also write their whole `auto_map` (`remote_code_auto_map`, see HubMixin),
  so `trust_remote_code=True` works where the package is not installed.
"""

from __future__ import annotations

import transformers
from transformers import AutoConfig, AutoImageProcessor, AutoVideoProcessor

from .families import FAMILIES
from .models.compat import register_video_processor

_REGISTERED = False


def register_auto_classes() -> None:
    """Register every family's config, model classes and image processor with transformers' Auto classes.

    `import hf_vit_plus` calls it; calling it again does nothing. After it, `AutoConfig`, the `AutoModel...` classes
    and `AutoImageProcessor` load the project's checkpoints without `trust_remote_code`; each class is also recorded
    for its Auto class (`register_for_auto_class`), so a saved checkpoint names its code in `auto_map`.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    # (config class, Auto class name) -> model classes, in family order
    heads: dict[tuple[type, str], list[type]] = {}
    for family in FAMILIES.values():
        config_class = family.config_class
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class("AutoConfig")
        for auto_name, model_class in family.model_classes.items():
            classes = heads.setdefault((config_class, auto_name), [])
            if model_class not in classes:
                classes.append(model_class)
            model_class.register_for_auto_class(auto_name)
        if family.image_processor_class is not None:
            processor = family.image_processor_class
            AutoImageProcessor.register(
                config_class, image_processor_classes={"torchvision": processor}, exist_ok=True
            )
            processor.register_for_auto_class("AutoImageProcessor")
            # The pipeline also looks for a video processor: `AutoVideoProcessor` derives one from the image
            # processor's auto_map ("...VideoProcessor") and, finding no local one, asked "Do you wish to run the
            # custom code? [y/N]" even though the package is installed, or answered with its generic "Could not load
            # any video processor class". The family's video processor class (e.g. `ViTPlusVideoProcessor`) says
            # that there is none; the pipeline goes on without one.
            if family.video_processor_class is not None:
                register_video_processor(AutoVideoProcessor, config_class, family.video_processor_class)
    # Families that share a config class (the Sparse Transformer's text and image models) map an Auto class to all
    # their heads: transformers picks the one the saved config's `architectures` names (the first by default).
    for (config_class, auto_name), classes in heads.items():
        models = classes[0] if len(classes) == 1 else tuple(classes)
        getattr(transformers, auto_name).register(config_class, models, exist_ok=True)
    _REGISTERED = True
