"""`hf-vit-plus export onnx CHECKPOINT OUT_DIR`: a saved model as ONNX graphs for onnxruntime.

The files depend on the family (see `hf_vit_plus.export`): `model.onnx` for the ViT classifier and the Sparse
Transformer LM (one graph with its key/value cache), `encoder_model.onnx` + `decoder_model.onnx` for the
encoder-decoder (the encoder with the cross-attention keys/values, and one decoding step with its cache). The model's
config, generation config and tokenizer or image processor are saved next to them.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .cli_utils import HelpFormatter
from .errors import UsageError, load_config
from .families import FAMILIES, family_of_config

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a saved model to ONNX (for onnxruntime)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    formats = parser.add_subparsers(dest="export_format", required=True, metavar="{onnx}")
    onnx = formats.add_parser(
        "onnx",
        help="ONNX graphs through torch's dynamo exporter (needs onnx and onnxscript)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    onnx.add_argument("checkpoint", help="a saved hf_vit_plus model folder or Hub id")
    onnx.add_argument("output_dir", type=Path, help="folder the .onnx files (and config, tokenizer) are written to")
    onnx.set_defaults(func=run_onnx)


def export_checkpoint(checkpoint: str, output_dir: str | Path) -> list[Path]:
    """Load `checkpoint` (its family's head model), export it with `export_onnx` into `output_dir` and save its
    tokenizer or image processor there too. Bad arguments raise `UsageError`."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(f"OUT_DIR {str(output_dir)!r} is a file; expected a folder (created if missing).")
    config = load_config(checkpoint, "CHECKPOINT")
    family = family_of_config(config)
    if family is None or family.export is None:
        exported = sorted({f.model_type for f in FAMILIES.values() if f.export is not None})
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is a {config.model_type!r} model; `export onnx` exports the hf_vit_plus "
            f"families: {', '.join(exported)}."
        )
    for name in ("onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            raise UsageError(
                f"ONNX export needs the {name!r} package: `pip install onnx onnxscript` "
                "(or `pip install hf_vit_plus[inference]`)."
            ) from None
    import transformers

    from . import export

    model = family.auto_head_class.from_pretrained(checkpoint).eval()
    paths = export.export_onnx(model, output_dir)
    processor_class = family.processor_auto_class  # None: the family has no processor (the image model)
    if processor_class is None:
        return paths
    try:
        getattr(transformers, processor_class).from_pretrained(checkpoint).save_pretrained(output_dir)
    except (OSError, ValueError) as error:  # a checkpoint saved without its processor: the graphs are still usable
        logger.warning("no %s saved with the ONNX files: %s", processor_class, str(error).splitlines()[0])
    return paths


def run_onnx(args: argparse.Namespace) -> int:
    paths = export_checkpoint(args.checkpoint, args.output_dir)
    print(f"ONNX graphs written to {args.output_dir}: {', '.join(path.name for path in paths)}")
    return 0
