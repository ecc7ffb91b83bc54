"""hf_vit_plus: the Vision Transformer, the encoder-decoder Transformer and the Sparse Transformer as
first-class Hugging Face models. Importing the package registers every class with the Auto classes, and makes the
models' `push_to_hub` (and `save_pretrained(..., push_to_hub=True)`) upload their family's model card (a hook of
`models/hub_mixin.py`, which ships as remote code and imports nothing of the package outside `models/`), as does
transformers' `Trainer.push_to_hub` for them, with the Trainer's evaluation results (`hub/trainer_card.py`), and makes
`Trainer.evaluate()` report the loss of the self-supervised heads on batches without `labels`
(`training/trainer_hooks.py`)."""

from . import _noise  # noqa: F401  (first: it filters a log record that importing transformers emits)
from .hub.push import push_model
from .hub.trainer_card import install_trainer_card
from .models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
from .models.configuration_sparse_transformer import SparseTransformerConfig
from .models.configuration_vit_plus import ViTPlusConfig
from .models.hub_mixin import set_push_to_hub_hook
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
from .training.trainer_hooks import install_trainer_loss_inputs

register_auto_classes()
set_push_to_hub_hook(push_model)
install_trainer_card()
install_trainer_loss_inputs()

__version__ = "0.1.0"

__all__ = [
    "ViTPlusConfig",
    "ViTPlusForImageClassification",
    "ViTPlusForMaskedImageModeling",
    "ViTPlusImageProcessor",
    "ViTPlusModel",
    "ViTPlusPreTrainedModel",
    "Seq2SeqTransformerConfig",
    "Seq2SeqTransformerForConditionalGeneration",
    "Seq2SeqTransformerModel",
    "Seq2SeqTransformerPreTrainedModel",
    "SparseTransformerConfig",
    "SparseTransformerForCausalLM",
    "SparseTransformerForImageGeneration",
    "SparseTransformerModel",
    "SparseTransformerPreTrainedModel",
    "corrupt_patches",
    "register_auto_classes",
]
