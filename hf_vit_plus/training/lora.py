"""LoRA adapters (PEFT) on the package's models: the module names to target, wrapping a model for training, and the
adapter folder a run leaves (adapter_model.safetensors, adapter_config.json and the card of
`hf_vit_plus.hub.adapter`, naming the base model).

Every family names its projections as transformers v5 does: `q_proj`, `k_proj`, `v_proj`, `o_proj` in each
attention (ViT's `attention`, the decoders' `self_attn`, the seq2seq decoder's `encoder_attn` too), `fc1`/`fc2` in
each MLP, and the heads `classifier` (ViT), `lm_head` (the LMs, tied to the embeddings). transformers' ViT names
(`query`, `value`), which the image-classification LoRA guide passes, match nothing here.

PEFT picks default target modules for `target_modules=None` from `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`,
a table of transformers' own model types inside peft (`peft.utils.constants`): it is no registration API (each PEFT
method copies it when peft is imported), so this package does not write into it. Pass `target_modules` explicitly:
`LORA_TARGET_MODULES`, or "all-linear" (every linear layer but the output head).
"""

from __future__ import annotations

import copy
import logging
import warnings

from torch import nn

logger = logging.getLogger(__name__)

# The attention projections of every family: what `hf-vit-plus train --lora_r` adapts by default.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# The MLP's two layers, for `--lora_target_modules q_proj k_proj v_proj o_proj fc1 fc2`.
MLP_MODULES = ("fc1", "fc2")
# Heads trained in full next to the adapter (and saved with it): a classifier starts from scratch for new labels.
HEADS_TO_SAVE = {"vit": ("classifier",)}
# PEFT's task type of each family's head, saved in adapter_config.json: PEFT wraps the model in its task's class, and
# `AutoPeftModelFor<Task>.from_pretrained(adapter)` loads the base model through transformers' Auto class of that
# task (our registration, or the checkpoint's remote code). PEFT has no task type of image classification.
PEFT_TASK_TYPES = {"seq2seq": "SEQ_2_SEQ_LM", "sparse-lm": "CAUSAL_LM", "image-lm": "CAUSAL_LM"}


def add_lora(
    model,
    family: str,
    r: int,
    alpha: float | None = None,
    target_modules: list[str] | tuple[str, ...] | str | None = None,
    dropout: float = 0.0,
):
    """`model` wrapped by PEFT with a LoRA adapter of rank `r` (scale `alpha / r`, default alpha = 2r) on
    `target_modules` (default `LORA_TARGET_MODULES`); only the adapter (and the family's freshly initialised head,
    `HEADS_TO_SAVE`) trains. Raises ValueError naming a bad value or the module names that match nothing."""
    try:
        from peft import LoraConfig
    except ImportError as err:
        raise ValueError("--lora_r needs PEFT: pip install peft") from err
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise ValueError(f"--lora_r must be a positive integer (the adapter's rank), got {r!r}.")
    if alpha is not None and not alpha > 0:
        raise ValueError(f"--lora_alpha must be > 0, got {alpha!r}.")
    if not 0 <= dropout < 1:
        raise ValueError(f"--lora_dropout must be in [0, 1), got {dropout!r}.")
    targets = list(LORA_TARGET_MODULES) if target_modules is None else target_modules
    if not isinstance(targets, str) and list(targets) == ["all-linear"]:  # the command line gives a list
        targets = "all-linear"
    if not isinstance(targets, str):
        linear = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
        unknown = [name for name in targets if name not in linear]
        if unknown or not targets:
            raise ValueError(
                f"--lora_target_modules {' '.join(unknown) or '(none)'}: no such linear layer in "
                f"{type(model).__name__}; its linear layers are {', '.join(sorted(linear))} (or pass all-linear)."
            )
    heads = [name for name in HEADS_TO_SAVE.get(family, ()) if hasattr(model, name)]
    config = LoraConfig(
        r=r, lora_alpha=2 * r if alpha is None else alpha, lora_dropout=dropout, target_modules=targets,
        modules_to_save=heads or None, task_type=PEFT_TASK_TYPES.get(family),
    )  # fmt: skip
    return _wrap(model, config)


def _wrap(model, config, adapter_name: str = "default"):
    """`peft.get_peft_model(model, config, adapter_name)`."""
    from peft import get_peft_model

    with warnings.catch_warnings():  # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        return get_peft_model(model, config, adapter_name=adapter_name)


def with_same_adapter(peft_model, base):
    """`base` wrapped by PEFT as `peft_model` wraps its own base: the same (active) adapter's config and name, with
    freshly initialised adapter weights (e.g. to load a gathered state dict into).

    Args:
        peft_model: a PEFT model.
        base: the model to wrap (of the class and config of `peft_model`'s base).

    Returns:
        The new PEFT model.
    """
    adapter = peft_model.active_adapter
    return _wrap(base, copy.deepcopy(peft_model.peft_config[adapter]), adapter_name=adapter)


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)
