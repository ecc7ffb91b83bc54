"""`hf-vit-plus convert`: turn a saved timm or transformers ViT checkpoint into a ViTPlus checkpoint folder."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import UsageError, check_exists, load_config

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    from ..cli import HelpFormatter

    parser = subparsers.add_parser(
        "convert",
        help="convert a timm or transformers ViT checkpoint to a ViTPlus checkpoint folder",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("source", choices=["timm", "transformers"], help="where the checkpoint comes from")
    parser.add_argument(
        "checkpoint",
        help="timm: a .safetensors state dict (or 'pretrained' to let timm download the named weights); "
        "transformers: a folder or Hub id of a ViTForImageClassification",
    )
    parser.add_argument("output_dir", type=Path, help="folder the ViTPlus checkpoint (model + processor) is saved to")
    parser.add_argument("--timm_name", default="vit_base_patch16_224", help="timm architecture name")
    parser.add_argument("--num_classes", type=int, default=None, help="timm: number of classes of the checkpoint")
    parser.add_argument("--image_size", type=int, default=None, help="timm: input resolution of the checkpoint")
    parser.set_defaults(func=run)


def convert_checkpoint(
    source: str,
    checkpoint: str,
    output_dir: str | Path,
    timm_name: str = "vit_base_patch16_224",
    num_classes: int | None = None,
    image_size: int | None = None,
) -> Path:
    """Convert and save model + image processor (with the model code, for trust_remote_code).

    A checkpoint that does not exist, is not a safetensors file (timm) or not a ViT (transformers), or that does not
    fit the timm architecture, raises a `UsageError` (a `ValueError`)."""
    from ..models.hub_mixin import naming_corrupt_safetensors
    from ..models.image_processing_vit_plus import ViTPlusImageProcessor
    from .vit import vit_plus_from_timm, vit_plus_from_transformers

    if source == "timm":
        if checkpoint != "pretrained":
            check_exists(checkpoint, "CHECKPOINT", "file")
        import timm
        from safetensors.torch import load_file

        kwargs = {}
        if num_classes is not None:
            kwargs["num_classes"] = num_classes
        if image_size is not None:
            kwargs["img_size"] = image_size
        if checkpoint == "pretrained":
            timm_model = timm.create_model(timm_name, pretrained=True, **kwargs)
        else:
            path = Path(checkpoint)
            if path.suffix != ".safetensors":
                raise UsageError(
                    f"{checkpoint!r}: only .safetensors state dicts are read (pickled checkpoints can run code); "
                    "convert it with safetensors.torch.save_file first."
                )
            timm_model = timm.create_model(timm_name, pretrained=False, **kwargs)
            with naming_corrupt_safetensors(path):  # a corrupt or truncated file is named
                state = load_file(path)
            missing, unexpected = timm_model.load_state_dict(state, strict=False)
            if missing or unexpected:
                raise UsageError(
                    f"{checkpoint!r} does not fit timm's {timm_name!r}: missing {missing[:5]}, unexpected "
                    f"{unexpected[:5]}. Pass the right --timm_name / --num_classes / --image_size."
                )
        model = vit_plus_from_timm(timm_model.eval())
        mean, std = timm_model.pretrained_cfg.get("mean"), timm_model.pretrained_cfg.get("std")
        processor = ViTPlusImageProcessor.from_model_config(
            model.config, **({"image_mean": list(mean), "image_std": list(std)} if mean and std else {})
        )
    elif source == "transformers":
        from transformers import ViTForImageClassification

        config = load_config(checkpoint, "CHECKPOINT")
        if config.model_type != "vit":
            raise UsageError(
                f"{checkpoint!r} is a {config.model_type!r} model; the 'transformers' source converts transformers' "
                "ViT (model_type 'vit')."
            )
        with naming_corrupt_safetensors(checkpoint):  # a corrupt or truncated weights file is named
            hf_model = ViTForImageClassification.from_pretrained(checkpoint)
        model = vit_plus_from_transformers(hf_model)
        processor = ViTPlusImageProcessor.from_model_config(model.config)
    else:
        raise UsageError(f"Unknown source {source!r}: expected 'timm' or 'transformers'.")
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    logger.info("wrote %s", output_dir)
    return output_dir


def run(args: argparse.Namespace) -> int:
    out = convert_checkpoint(
        args.source, args.checkpoint, args.output_dir, args.timm_name, args.num_classes, args.image_size
    )
    print(f"ViTPlus checkpoint written to {out}")
    return 0
