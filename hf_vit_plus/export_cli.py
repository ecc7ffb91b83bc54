"""`hf-vit-plus export onnx|ctranslate2 CHECKPOINT OUT_DIR` and `hf-vit-plus translate MODEL [TEXT ...]`: a saved
model for other runtimes, and translation on the engine of one's choice.

`export onnx` writes ONNX graphs for onnxruntime; the files depend on the family (see `hf_vit_plus.export`):
`model.onnx` for the ViT classifier and the Sparse Transformer LM (one graph with its key/value cache),
`encoder_model.onnx` + `decoder_model.onnx` for the encoder-decoder (the encoder with the cross-attention
keys/values, and one decoding step with its cache). The model's config, generation config and tokenizer or image
processor are saved next to them.

`export ctranslate2` writes a CTranslate2 model of a seq2seq checkpoint with a dense encoder (CTranslate2 has no
sparse attention: sparse encoders are refused), with its tokenizer files and generation config; `--quantization`
stores int8, int8_float32 or bfloat16 weights (float32 without it). `translate` runs a checkpoint with
`--engine generate` (transformers), `fast` (one compiled graph per token, `--precision`), or `ctranslate2` (an
exported folder, or a checkpoint converted on the fly, `--compute_type`).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from pathlib import Path

from .cli_utils import HelpFormatter, non_negative_int, positive_int
from .errors import UsageError, check_model_location, load_config
from .families import FAMILIES, family_of_config
from .utils.extras import require

logger = logging.getLogger(__name__)

CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "bfloat16")  # = hf_vit_plus.export's (not imported: torch)
TRANSLATION_ENGINES = ("generate", "fast", "ctranslate2")
# = hf_vit_plus.models.fast_kernels.PRECISIONS (not imported: torch; a test keeps them equal)
FAST_PRECISIONS = ("float32", "bfloat16", "int8", "int8-weight-only", "int8-dynamic", "int8-fbgemm")
CTRANSLATE2_COMPUTE_TYPES = ("default", "float32", "int8", "int8_float32", "bfloat16", "int8_bfloat16")
TRANSLATE_DESCRIPTION = (
    "Translate TEXT (or the lines of standard input) with a saved seq2seq checkpoint, on one of three engines: "
    "generate (transformers' generate), fast (FastDecoding: one compiled graph per token; --precision float32 gives "
    "generate's tokens, bfloat16 / int8 are faster), ctranslate2 (a folder written by `hf-vit-plus export "
    "ctranslate2`, or the checkpoint converted on the fly; --compute_type). Beam size and length default to the "
    "model's generation config; the maximum length to the source length + 50."
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a saved model to ONNX (onnxruntime) or CTranslate2",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    formats = parser.add_subparsers(dest="export_format", required=True, metavar="{onnx,ctranslate2}")

    def export_format(name: str, run, help_text: str, checkpoint: str, output: str) -> argparse.ArgumentParser:
        """`export NAME CHECKPOINT OUTPUT_DIR`: what every format takes, `checkpoint` and `output` their help."""
        sub = formats.add_parser(name, help=help_text, description=__doc__, formatter_class=HelpFormatter)
        sub.add_argument("checkpoint", help=checkpoint)
        sub.add_argument("output_dir", type=Path, help=output)
        sub.set_defaults(func=run)
        return sub

    export_format(
        "onnx", run_onnx, "ONNX graphs through torch's dynamo exporter (needs onnx and onnxscript)",
        "a saved hf_vit_plus model folder or Hub id", "folder the .onnx files (and config, tokenizer) are written to",
    )  # fmt: skip
    ct2 = export_format(
        "ctranslate2", run_ctranslate2,
        "a CTranslate2 model of a seq2seq checkpoint with a dense encoder (needs ctranslate2)",
        "a saved hf_vit_plus seq2seq model folder or Hub id",
        "folder the CTranslate2 model (and tokenizer) is written to",
    )  # fmt: skip
    ct2.add_argument(
        "--quantization",
        choices=CTRANSLATE2_QUANTIZATIONS,
        default=None,
        help="weight type stored in the model (default: float32)",
    )
    add_translate_parser(subparsers)


def add_translate_parser(subparsers) -> None:
    """`hf-vit-plus translate`: added by this module's `add_parser`, next to `export`, whose folders it serves."""
    parser = subparsers.add_parser(
        "translate",
        help="translate text with a seq2seq checkpoint or its CTranslate2 export (generate, fast or ctranslate2)",
        description=TRANSLATE_DESCRIPTION,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model", help="a saved seq2seq model folder or Hub id, or an `export ctranslate2` folder")
    parser.add_argument("text", nargs="*", help="texts to translate (default: one per line from standard input)")
    parser.add_argument(
        "--engine",
        choices=TRANSLATION_ENGINES,
        default=None,
        help="generate (default), fast, or ctranslate2 (the default for a CTranslate2 folder)",
    )
    parser.add_argument("--precision", choices=FAST_PRECISIONS, default="float32", help="weights of --engine fast")
    parser.add_argument(
        "--compute_type",
        choices=CTRANSLATE2_COMPUTE_TYPES,
        default="default",
        help="CTranslate2's compute type (default: the folder's own)",
    )
    parser.add_argument("--num_beams", type=positive_int, default=None, help="beam size (default: the model's)")
    parser.add_argument(
        "--max_new_tokens", type=positive_int, default=None, help="maximum new tokens (default: source length + 50)"
    )
    parser.add_argument("--batch_size", type=positive_int, default=16, help="sentences decoded together")
    parser.add_argument(
        "--buffer_size",
        type=positive_int,
        default=None,
        help="sentences read ahead and sorted by length into batches, at least --batch_size (default: 16 x "
        "--batch_size, as CTranslate2 reads ahead); the translations are printed in input order",
    )
    parser.add_argument("--threads", type=non_negative_int, default=0, help="CTranslate2 threads (0: its default)")
    parser.set_defaults(func=run_translate)


def export_checkpoint(checkpoint: str, output_dir: str | Path) -> list[Path]:
    """Load `checkpoint` (its family's head model), export it with `export_onnx` into `output_dir` and save its
    tokenizer or image processor there too. Bad arguments raise `UsageError`."""
    output_dir = _check_output_dir(output_dir)
    config = load_config(checkpoint, "CHECKPOINT")
    family = family_of_config(config)
    if family is not None and family.export is None:  # e.g. a masked patch prediction encoder
        heads = ", ".join(f.head_class.__name__ for f in FAMILIES.values() if f.export is not None)
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is a {family.head_class.__name__} ({family.id}), which has no ONNX layout; "
            f"`export onnx` exports {heads}"
            + (
                " (fine-tune it first: `hf-vit-plus train vit --model_name_or_path`)."
                if family.id == "vit-mpp"
                else "."
            )
        )
    if family is None:
        exported = sorted({f.model_type for f in FAMILIES.values() if f.export is not None})
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is a {config.model_type!r} model; `export onnx` exports the hf_vit_plus "
            f"families: {', '.join(exported)}."
        )
    require("export", "ONNX export", ("onnx", "onnxscript"))
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


def _check_output_dir(output_dir: str | Path) -> Path:
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(f"OUT_DIR {str(output_dir)!r} is a file; expected a folder (created if missing).")
    return output_dir


def export_ctranslate2_checkpoint(checkpoint: str, output_dir: str | Path, quantization: str | None = None) -> Path:
    """Load the seq2seq `checkpoint` and its tokenizer and write them as a CTranslate2 model with
    `hf_vit_plus.export.export_ctranslate2`. Bad arguments (another family, a sparse encoder, no ctranslate2)
    raise `UsageError`."""
    output_dir = _check_output_dir(output_dir)
    config = load_config(checkpoint, "CHECKPOINT")
    family = family_of_config(config)
    if family is None or family.id != "seq2seq":
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is a {config.model_type!r} model; `export ctranslate2` exports the "
            "encoder-decoder Transformer (seq2seq_transformer)."
        )
    if getattr(config, "encoder_attention_type", "dense") != "dense":
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} has a sparse encoder (encoder_attention_type="
            f"{config.encoder_attention_type!r}): CTranslate2 has no sparse attention, so it cannot run this model. "
            "Serve it with `hf-vit-plus translate --engine fast` instead."
        )
    require("export", "CTranslate2 export", ("ctranslate2",))
    from transformers import AutoTokenizer

    from . import export

    model = family.auto_head_class.from_pretrained(checkpoint).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    except (OSError, ValueError) as error:  # without a tokenizer the model translates token ids (<id:N> strings)
        logger.warning("no tokenizer with CHECKPOINT, tokens written as <id:N>: %s", str(error).splitlines()[0])
        tokenizer = None
    try:
        return export.export_ctranslate2(model, output_dir, tokenizer=tokenizer, quantization=quantization)
    except ValueError as error:
        raise UsageError(str(error)) from error


def run_onnx(args: argparse.Namespace) -> int:
    """Export a checkpoint's ONNX graphs (`hf-vit-plus export onnx`) and print the files written.

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0.
    """
    paths = export_checkpoint(args.checkpoint, args.output_dir)
    print(f"ONNX graphs written to {args.output_dir}: {', '.join(path.name for path in paths)}")
    return 0


def run_ctranslate2(args: argparse.Namespace) -> int:
    """Export a seq2seq checkpoint for CTranslate2 (`hf-vit-plus export ctranslate2`) and print the folder written.

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0.
    """
    folder = export_ctranslate2_checkpoint(args.checkpoint, args.output_dir, args.quantization)
    print(
        f"CTranslate2 model ({args.quantization or 'float32'}) written to {folder}; translate with "
        f"`hf-vit-plus translate {folder}` or ctranslate2.Translator({str(folder)!r})"
    )
    return 0


def run_translate(args: argparse.Namespace) -> int:
    """Translate the TEXT arguments, or the lines of standard input, with a seq2seq model (`hf-vit-plus translate`).

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0; the translations are printed one a line.

    Raises:
        UsageError: a model that is not a seq2seq translator, a CTranslate2 folder with another engine, or no text.
    """
    from .models.pipeline_text2text_generation import is_ctranslate2_folder

    check_model_location(args.model, "MODEL")
    ctranslate2_folder = is_ctranslate2_folder(args.model)
    engine = args.engine or ("ctranslate2" if ctranslate2_folder else "generate")
    if ctranslate2_folder and engine != "ctranslate2":
        raise UsageError(f"MODEL {args.model!r} is a CTranslate2 export: it runs with --engine ctranslate2.")
    if not ctranslate2_folder:
        config = load_config(args.model, "MODEL")
        family = family_of_config(config)
        if family is None or family.id != "seq2seq":
            raise UsageError(f"MODEL {args.model!r} is a {config.model_type!r} model, not a seq2seq translator.")
    if args.buffer_size is not None and args.buffer_size < args.batch_size:
        raise UsageError(f"--buffer_size must be at least --batch_size ({args.batch_size}), got {args.buffer_size}.")
    # standard input is read as it is translated, a buffer at a time
    texts = iter(args.text) if args.text else (line.rstrip("\n") for line in sys.stdin if line.strip())
    first = next(texts, None)
    if first is None:
        raise UsageError("no text to translate: pass TEXT arguments or lines on standard input.")
    from .serving import Translator

    translator = Translator(
        args.model, engine=engine, precision=args.precision, compute_type=args.compute_type, threads=args.threads
    )
    settings = {}
    if args.num_beams is not None:
        settings["num_beams"] = args.num_beams
    if args.max_new_tokens is not None:
        settings["max_new_tokens"] = args.max_new_tokens
    lines = itertools.chain([first], texts)
    for translation in translator.translate_iterable(lines, args.batch_size, args.buffer_size, **settings):
        print(translation, flush=True)
    return 0
