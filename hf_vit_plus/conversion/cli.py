"""`hf-vit-plus convert`: turn a saved timm or transformers ViT checkpoint into a ViTPlus checkpoint folder, or a
saved transformers Marian translation model (opus-mt) into a Seq2seq Transformer checkpoint folder with its
tokenizer. The folder gets a model card (README.md) saying what it was converted from, under which licence, and how
close the converted model's logits are to the source's on a seeded random input."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import logging
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_utils import HelpFormatter
from ..errors import UsageError, check_exists, load_config
from ..utils.logging import tqdm

if TYPE_CHECKING:
    from ..hub.conversion_card import ConversionSource

logger = logging.getLogger(__name__)

# A Marian tokenizer's files (transformers' `MarianTokenizer.vocab_files_names` and the special-token files), copied
# as they are so that `AutoTokenizer.from_pretrained(OUT_DIR)` loads the same `MarianTokenizer` (sentencepiece).
MARIAN_TOKENIZER_FILES = (
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
_MARIAN_TOKENIZER_REQUIRED = ("source.spm", "target.spm", "vocab.json")
_SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
# A conversion copies the weights, so in float32 the logits differ only by the order of floating-point operations; a
# difference above this says that the conversion is wrong.
LOGITS_TOLERANCE = 1e-3


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a timm or transformers ViT (to ViTPlus) or a Marian translation model (to Seq2seq Transformer)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("source", choices=["timm", "transformers", "marian"], help="where the checkpoint comes from")
    parser.add_argument(
        "checkpoint",
        help="timm: a .safetensors state dict (or 'pretrained' to let timm download the named weights); "
        "transformers: a folder or Hub id of a ViTForImageClassification; marian: a local folder of a MarianMTModel "
        "saved with safetensors weights (e.g. `hf download Helsinki-NLP/opus-mt-en-de --local-dir DIR`)",
    )
    parser.add_argument(
        "output_dir",
        type=Path,
        help="folder the checkpoint is saved to (ViTPlus: model + processor; marian: model + the Marian tokenizer)",
    )
    parser.add_argument("--timm_name", default="vit_base_patch16_224", help="timm architecture name")
    parser.add_argument("--num_classes", type=int, default=None, help="timm: number of classes of the checkpoint")
    parser.add_argument("--image_size", type=int, default=None, help="timm: input resolution of the checkpoint")
    parser.add_argument(
        "--license",
        default=None,
        help="the model card's licence, a Hub licence id (e.g. 'cc-by-4.0'); default: the source's, from its model "
        "card (README.md) or timm's pretrained config, else 'unknown' with a note that the source's licence was not "
        "found and must be checked",
    )
    parser.add_argument(
        "--base_model",
        default=None,
        help="the Hub id of the source model, for the card's base_model; default: the transformers source's Hub id, "
        "or the Hub id its config.json names (_name_or_path); none for timm",
    )
    parser.add_argument("--no_card", action="store_true", help="write no model card (README.md)")
    parser.set_defaults(func=run)


def check_card_options(license: str | None, base_model: str | None) -> None:
    """A `UsageError` for a `--license` that is not a Hub licence id (or is "other", which needs a name the command
    does not take) or a `--base_model` that is not a Hub model id: checked before any work."""
    from ..hub.card import check_license, hub_base_model

    if license is not None:
        try:
            check_license(license)
        except ValueError as error:
            raise UsageError(f"--license: {error}") from error
        if license == "other":
            raise UsageError(
                "--license 'other' needs a licence name, which `convert` does not take: give a Hub licence id, or "
                "edit the card's license_name and license_link after converting."
            )
    if base_model is not None and hub_base_model(base_model) is None:
        raise UsageError(
            f"--base_model {base_model!r} is not a Hub model id ('namespace/name'): the card's base_model links to a "
            "model on the Hub, never to a local folder."
        )


def convert_checkpoint(
    source: str,
    checkpoint: str,
    output_dir: str | Path,
    timm_name: str = "vit_base_patch16_224",
    num_classes: int | None = None,
    image_size: int | None = None,
    *,
    license: str | None = None,
    base_model: str | None = None,
    card: bool = True,
) -> Path:
    """Convert and save model + image processor (with the model code, for trust_remote_code) and, with `card`, the
    model card (README.md; see `hf_vit_plus.hub.conversion_card`). The converted model's logits are compared with the
    source's on a seeded random input; the max |difference| is logged (and written into the card).

    `license` / `base_model` override the card's licence and base model (a Hub licence id, a Hub model id); a bad one
    raises a `UsageError` before any work. A checkpoint that does not exist, is not a safetensors file (timm) or not
    a ViT (transformers), or that does not fit the timm architecture, raises a `UsageError` (a `ValueError`).
    `source="marian"`: see `convert_marian`."""
    check_card_options(license, base_model)
    if source == "marian":
        return convert_marian(checkpoint, output_dir, license=license, base_model=base_model, card=card)
    if source not in ("timm", "transformers"):
        raise UsageError(f"Unknown source {source!r}: expected 'timm', 'transformers' or 'marian'.")
    from .parity import image_logits_difference

    with tqdm(total=4, desc=f"converting a {source} ViT", unit="step") as bar:  # read, convert, save, compare
        original, model, processor, record = _convert_vit(source, checkpoint, timm_name, num_classes, image_size, bar)
        output_dir = Path(output_dir)
        model.save_pretrained(output_dir)
        processor.save_pretrained(output_dir)
        bar.update(1)
        difference = _logits_difference(image_logits_difference, original, model)
        bar.update(1)
    if card:
        _write_card(output_dir, model.config, record, difference, license, base_model)
    logger.info("wrote %s", output_dir)
    return output_dir


def _logits_difference(measure, original, converted) -> float:
    """`measure(original, converted)` (a function of `parity`), logged; a warning when it is above
    `LOGITS_TOLERANCE` or not finite."""
    difference = measure(original, converted)
    logger.info("max |difference| of the logits on a seeded random input: %.2g", difference)
    if not math.isfinite(difference) or difference > LOGITS_TOLERANCE:
        logger.warning(
            "The converted model's logits differ from the source's by %.2g (more than %g): the conversion may be "
            "wrong.",
            difference,
            LOGITS_TOLERANCE,
        )
    return difference


def _write_card(output_dir: Path, config, record, difference: float, license, base_model) -> None:
    from ..hub.conversion_card import write_conversion_card

    path = write_conversion_card(
        output_dir,
        model_config=config,
        source=record,
        max_logit_difference=difference,
        license=license,
        base_model=base_model,
    )
    logger.info("wrote the model card %s", path)


def _convert_vit(source, checkpoint, timm_name, num_classes, image_size, bar) -> tuple:
    """(the source model, the converted model, its image processor, the source's `ConversionSource`)."""
    from ..hub.conversion_card import transformers_source
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
        if not timm.is_model(timm_name):
            close = difflib.get_close_matches(timm_name, timm.list_models("vit_*"), n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else " See `timm.list_models('vit_*')`."
            raise UsageError(f"--timm_name {timm_name!r} is not a timm model.{hint}")
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
        bar.update(1)
        model = vit_plus_from_timm(timm_model.eval())
        pretrained_cfg = timm_model.pretrained_cfg
        mean, std = pretrained_cfg.get("mean"), pretrained_cfg.get("std")
        processor = ViTPlusImageProcessor.from_model_config(
            model.config, **({"image_mean": list(mean), "image_std": list(std)} if mean and std else {})
        )
        record = _timm_source(checkpoint, timm_name, pretrained_cfg)
        original = timm_model
    else:
        from transformers import ViTForImageClassification

        config = load_config(checkpoint, "CHECKPOINT")
        if config.model_type != "vit":
            raise UsageError(
                f"{checkpoint!r} is a {config.model_type!r} model; the 'transformers' source converts transformers' "
                "ViT (model_type 'vit')."
            )
        with naming_corrupt_safetensors(checkpoint):  # a corrupt or truncated weights file is named
            original = ViTForImageClassification.from_pretrained(checkpoint)
        bar.update(1)
        model = vit_plus_from_transformers(original)
        processor = ViTPlusImageProcessor.from_model_config(model.config)
        record = transformers_source(checkpoint, "transformers' `ViTForImageClassification`")
    bar.update(1)
    return original, model, processor, record


def _timm_source(checkpoint: str, timm_name: str, pretrained_cfg: dict) -> ConversionSource:
    """The `ConversionSource` of a timm model: its name, and where its weights come from. timm's pretrained config
    states the licence of timm's own weights (`checkpoint="pretrained"`), not of a file the user gives."""
    from ..hub.conversion_card import ConversionSource, licence_fields

    if checkpoint == "pretrained":
        weights = pretrained_cfg.get("hf_hub_id") or pretrained_cfg.get("tag")
        origin = f" with timm's pretrained weights (`{weights}`)" if weights else " with timm's pretrained weights"
        licence = licence_fields(pretrained_cfg, "timm's pretrained config of these weights")
    else:
        origin, licence = f" with the weights of the file `{Path(checkpoint).name}`", {}
    return ConversionSource(description=f"timm's `{timm_name}`{origin}", **licence)


@contextlib.contextmanager
def corrupt_as_usage_error():
    """A corrupt or truncated weights file the user gave (`CorruptCheckpointError`, which names it) is a user error:
    one line on the command line, not a traceback."""
    from ..models.hub_mixin import CorruptCheckpointError

    try:
        yield
    except CorruptCheckpointError as error:
        raise UsageError(str(error)) from error


def convert_marian(
    checkpoint: str | Path,
    output_dir: str | Path,
    *,
    license: str | None = None,
    base_model: str | None = None,
    card: bool = True,
) -> Path:
    """Convert the `MarianMTModel` saved in the folder `checkpoint` (safetensors weights) into a Seq2seq Transformer
    checkpoint in `output_dir` (model, generation config, model code for trust_remote_code), copy its tokenizer and,
    with `card`, write the model card (README.md: the licence and languages of the folder's own card, e.g. an
    opus-mt card's cc-by-4.0; see `hf_vit_plus.hub.conversion_card`). The converted model's logits are compared with
    Marian's on a seeded random input; the max |difference| is logged (and written into the card).

    A bad `license` / `base_model` (see `convert_checkpoint`), a folder that does not exist, is not a Marian model,
    holds no safetensors weights (pickled `.bin` files are not read: loading them can run code) or a Marian the
    converter cannot express raises a `UsageError`. A folder without the tokenizer files is converted with a warning:
    `output_dir` then has no tokenizer."""
    from transformers import MarianMTModel

    from ..models.hub_mixin import naming_corrupt_safetensors
    from .marian import RECOMPUTED_KEYS, check_recomputed_tensors, seq2seq_from_marian
    from .parity import seq2seq_logits_difference

    check_card_options(license, base_model)
    source = check_exists(checkpoint, "CHECKPOINT", "dir")
    config = load_config(source, "CHECKPOINT")
    if config.model_type != "marian":
        raise UsageError(
            f"{str(checkpoint)!r} is a {config.model_type!r} model; the 'marian' source converts transformers' "
            "MarianMTModel (model_type 'marian')."
        )
    if not any((source / name).is_file() for name in _SAFETENSORS_WEIGHTS):
        found = sorted(path.name for path in source.iterdir() if path.suffix in (".bin", ".pt", ".pth", ".h5"))
        raise UsageError(
            f"{str(checkpoint)!r} has no safetensors weights ({' or '.join(_SAFETENSORS_WEIGHTS)}; found "
            f"{found or 'no weights file'}): only safetensors are read, since loading pickled weights can run code. "
            "Re-save the model with safetensors (transformers 5's `save_pretrained` writes them)."
        )
    with tqdm(total=4, desc="converting a Marian model", unit="step") as bar:  # read, convert, save, compare
        with naming_corrupt_safetensors(source):  # a corrupt or truncated weights file is named
            marian = MarianMTModel.from_pretrained(source, use_safetensors=True)
        bar.update(1)
        try:
            model = seq2seq_from_marian(marian)
            # The files too: a loader that rebuilt a stored table would hide a stored table that differs.
            check_recomputed_tensors(_stored_tensors(source, RECOMPUTED_KEYS), model.config)
        except ValueError as error:
            raise UsageError(f"{str(checkpoint)!r}: {error}") from error
        bar.update(1)
        output_dir = Path(output_dir)
        model.save_pretrained(output_dir)
        copy_marian_tokenizer(source, output_dir)
        bar.update(1)
        difference = _logits_difference(seq2seq_logits_difference, marian, model)
        bar.update(1)
    if card:
        _write_card(output_dir, model.config, _marian_source(source), difference, license, base_model)
    logger.info("wrote %s", output_dir)
    return output_dir


def _marian_source(folder: Path) -> ConversionSource:
    """The `ConversionSource` of a Marian folder: its card's licence and languages; the languages of its tokenizer
    config (`source_lang`, `target_lang`) when the card gives none."""
    from ..hub.conversion_card import transformers_source

    record = transformers_source(folder, "the Marian translation model (transformers' `MarianMTModel`)")
    if record.language:
        return record
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return record
    if not isinstance(tokenizer_config, dict):
        return record
    languages = [tokenizer_config.get(key) for key in ("source_lang", "target_lang")]
    languages = list(dict.fromkeys(code.strip() for code in languages if isinstance(code, str) and code.strip()))
    return dataclasses.replace(record, language=languages or None)


def _stored_tensors(folder: Path, keys: tuple[str, ...]) -> dict:
    """The tensors named `keys` as stored in the safetensors files of `folder` (those it holds)."""
    from safetensors import safe_open

    found = {}
    for name in _SAFETENSORS_WEIGHTS:
        path = folder / name
        files = [path] if path.suffix == ".safetensors" else []
        if path.suffix == ".json" and path.is_file():  # a sharded checkpoint's index
            files = sorted({folder / shard for shard in json.loads(path.read_text())["weight_map"].values()})
        for file in files:
            if not file.is_file():
                continue
            with safe_open(str(file), framework="pt") as handle:
                for key in set(keys) & set(handle.keys()):
                    found[key] = handle.get_tensor(key)
    return found


def copy_marian_tokenizer(source: Path, output_dir: Path) -> list[str]:
    """Copy the Marian tokenizer files of `source` into `output_dir`; returns the names copied.

    `tokenizer_config.json` gets `"tokenizer_class": "MarianTokenizer"` when it does not name a class (older opus-mt
    folders): `AutoTokenizer` would otherwise look the class up from the model type, which is now ours."""
    copied = [name for name in MARIAN_TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, output_dir / name)
    missing = [name for name in _MARIAN_TOKENIZER_REQUIRED if name not in copied]
    if missing:
        logger.warning(
            "%s has no complete Marian tokenizer (missing %s): %s has no tokenizer; save one there with "
            "`MarianTokenizer(...).save_pretrained`.",
            source,
            ", ".join(missing),
            output_dir,
        )
        return copied
    tokenizer_config_path = output_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text()) if tokenizer_config_path.is_file() else {}
    if not tokenizer_config.get("tokenizer_class"):
        tokenizer_config["tokenizer_class"] = "MarianTokenizer"
        tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
        if "tokenizer_config.json" not in copied:
            copied.append("tokenizer_config.json")
    return copied


def run(args: argparse.Namespace) -> int:
    """Convert a timm, transformers or Marian checkpoint into this package's format (`hf-vit-plus convert`).

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0; the folder written is printed.

    Raises:
        UsageError: a checkpoint that cannot be read or converted (`hf_vit_plus.cli.main` prints it, status 2).
    """
    with corrupt_as_usage_error():
        out = convert_checkpoint(
            args.source,
            args.checkpoint,
            args.output_dir,
            args.timm_name,
            args.num_classes,
            args.image_size,
            license=args.license,
            base_model=args.base_model,
            card=not args.no_card,
        )
    family = "Seq2seq Transformer" if args.source == "marian" else "ViTPlus"
    card = "" if args.no_card else ", with its model card (README.md)"
    print(f"{family} checkpoint written to {out}{card}")
    return 0
