"""hf_vit_plus: the Vision Transformer, the encoder-decoder Transformer and the Sparse Transformer as first-class
Hugging Face models.

Importing the package registers the three families with transformers' Auto classes and loads nothing else: the model
classes (which registering needs) are imported, while training, data, export, fast decoding, interpretability and Hub
code are imported on first use. Every public name below is read from its module when it is first asked for
(`from hf_vit_plus import X`), as transformers' own lazy module does. What else the import changes, and how to switch
it off, is listed in `hf_vit_plus.integrations`.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

from ._lazy import lazy_attributes

__version__ = "0.4.0.dev0"

# public name -> the module (relative to this package) that defines it
_LAZY_NAMES = {
    "ViTPlusConfig": ".models.configuration_vit_plus",
    "ViTPlusForImageClassification": ".models.modeling_vit_plus",
    "ViTPlusForMaskedImageModeling": ".models.modeling_vit_plus",
    "ViTPlusImageProcessor": ".models.image_processing_vit_plus",
    "ViTPlusModel": ".models.modeling_vit_plus",
    "ViTPlusPreTrainedModel": ".models.modeling_vit_plus",
    "corrupt_patches": ".models.modeling_vit_plus",
    "Seq2SeqTransformerConfig": ".models.configuration_seq2seq_transformer",
    "Seq2SeqTransformerForConditionalGeneration": ".models.modeling_seq2seq_transformer",
    "Seq2SeqTransformerModel": ".models.modeling_seq2seq_transformer",
    "Seq2SeqTransformerPreTrainedModel": ".models.modeling_seq2seq_transformer",
    "SparseTransformerConfig": ".models.configuration_sparse_transformer",
    "SparseTransformerForCausalLM": ".models.modeling_sparse_transformer",
    "SparseTransformerForImageGeneration": ".models.modeling_sparse_transformer",
    "SparseTransformerModel": ".models.modeling_sparse_transformer",
    "SparseTransformerPreTrainedModel": ".models.modeling_sparse_transformer",
    "register_auto_classes": ".registration",
    "disable_trainer_integration": ".integrations",
    "enable_trainer_integration": ".integrations",
}

__all__ = [
    "__version__",
    "ViTPlusConfig",
    "ViTPlusForImageClassification",
    "ViTPlusForMaskedImageModeling",
    "ViTPlusImageProcessor",
    "ViTPlusModel",
    "ViTPlusPreTrainedModel",
    "corrupt_patches",
    "Seq2SeqTransformerConfig",
    "Seq2SeqTransformerForConditionalGeneration",
    "Seq2SeqTransformerModel",
    "Seq2SeqTransformerPreTrainedModel",
    "SparseTransformerConfig",
    "SparseTransformerForCausalLM",
    "SparseTransformerForImageGeneration",
    "SparseTransformerModel",
    "SparseTransformerPreTrainedModel",
    "register_auto_classes",
    "disable_trainer_integration",
    "enable_trainer_integration",
]

if TYPE_CHECKING:
    from .integrations import disable_trainer_integration, enable_trainer_integration
    from .models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
    from .models.configuration_sparse_transformer import SparseTransformerConfig
    from .models.configuration_vit_plus import ViTPlusConfig
    from .models.image_processing_vit_plus import ViTPlusImageProcessor
    from .models.modeling_seq2seq_transformer import (
        Seq2SeqTransformerForConditionalGeneration,
        Seq2SeqTransformerModel,
        Seq2SeqTransformerPreTrainedModel,
    )
    from .models.modeling_sparse_transformer import (
        SparseTransformerForCausalLM,
        SparseTransformerForImageGeneration,
        SparseTransformerModel,
        SparseTransformerPreTrainedModel,
    )
    from .models.modeling_vit_plus import (
        ViTPlusForImageClassification,
        ViTPlusForMaskedImageModeling,
        ViTPlusModel,
        ViTPlusPreTrainedModel,
        corrupt_patches,
    )
    from .registration import register_auto_classes


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY_NAMES)


def _imported_by_the_command() -> bool:
    """Whether the `hf-vit-plus` command imports the package: the script installers write for it (pip, uv,
    setuptools: `hf-vit-plus`, `hf-vit-plus.exe` or `hf-vit-plus-script.py` on Windows) is the program, `argv[0]`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return re.sub(r"(-script\.pyw?|\.exe)$", "", name) == "hf-vit-plus"


# The `hf-vit-plus` command registers the classes itself once its arguments are parsed (`hf_vit_plus.cli.main`), so
# that `hf-vit-plus --help` answers without importing torch. Other programs may ask for the same with this variable
# (the docs' command-line reference does); it is removed here, so processes started later register as usual.
_deferred = os.environ.pop("_HF_VIT_PLUS_DEFER_REGISTRATION", None) == "1"
if not (_deferred or _imported_by_the_command()):
    from .integrations import integrate

    integrate()
