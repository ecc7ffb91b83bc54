"""The model card of a converted checkpoint (`hf-vit-plus convert`): what the source says of itself (its model card's
licence and languages, its Hub id) and the card's paragraph on the conversion.

The card itself is the family's, rendered by `hf_vit_plus.hub.card.write_converted_model_card`; this module decides
what goes in it:

- `base_model`: the id given by the user, else the source's own Hub id, else the Hub id its config.json names
  (`_name_or_path`); never a local path.
- `license`: the one given by the user, else the source's (its card's `license`, or one the caller read elsewhere,
  such as timm's pretrained config), else the Hub's `unknown` with a sentence saying that the source's licence was
  not found and must be checked: a conversion is the source's weights, so no licence of this package's choosing.
- `language`: the source card's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from .card import HUB_LICENSES, check_license, hub_base_model, load_card_metadata, write_converted_model_card

logger = logging.getLogger(__name__)

# The licence of a card whose source states none that the Hub knows: the Hub's id for a licence not known.
DEFAULT_LICENSE = "unknown"


@dataclass(frozen=True)
class ConversionSource:
    """What the model card says of the checkpoint a conversion read.

    Attributes:
        description: markdown naming the source: its kind, and its Hub id or file/folder name (never a full local
            path: the card may be published).
        hub_id: the source's own Hub id, when it was loaded from the Hub.
        base_model: a Hub id the source names as its origin (its config.json's `_name_or_path`), if any.
        license: the licence the source states, and `license_origin` where it says so (e.g. "the source's model
            card"); `license_name` / `license_link` for a licence "other".
        unusable_license: a licence the source states that is not a Hub licence id (it cannot go in the card).
        language: the languages the source gives.
    """

    description: str
    hub_id: str | None = None
    base_model: str | None = None
    license: str | None = None
    license_origin: str | None = None
    license_name: str | None = None
    license_link: str | None = None
    unusable_license: str | None = None
    language: list[str] | None = None


def source_card_metadata(checkpoint: str | Path) -> dict:
    """The metadata block of the source's model card: README.md of a local folder, or of a Hub model (downloaded);
    {} when there is none or it cannot be read."""
    folder = Path(checkpoint).expanduser()
    if folder.is_dir():
        readme = folder / "README.md"
        if not readme.is_file():
            return {}
    elif hub_base_model(str(checkpoint)):
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            readme = Path(hf_hub_download(str(checkpoint), "README.md"))
        except (OSError, EntryNotFoundError) as error:  # no card, offline, not found
            logger.info("Could not read the model card of %s (%s): its licence is not known.", checkpoint, error)
            return {}
    else:
        return {}
    try:
        return load_card_metadata(readme)
    except (ValueError, UnicodeDecodeError) as error:
        logger.warning("The source's model card cannot be read (%s): its licence and languages are not known.", error)
        return {}


def licence_fields(metadata: dict, origin: str) -> dict:
    """The `ConversionSource` fields of the licence that a card's (or config's) metadata states; `origin` says where
    (e.g. "the source's model card")."""
    value = metadata.get("license")
    if not isinstance(value, str) or not value.strip():
        return {}
    value = value.strip()
    if value == "other" and isinstance(metadata.get("license_name"), str) and metadata["license_name"].strip():
        link = metadata.get("license_link")
        return dict(
            license="other",
            license_origin=origin,
            license_name=metadata["license_name"].strip(),
            license_link=link if isinstance(link, str) else None,
        )
    if value.lower() in HUB_LICENSES - {"other"}:
        return dict(license=value.lower(), license_origin=origin)
    return dict(unusable_license=value)


def card_languages(metadata: dict) -> list[str] | None:
    """The language codes of a card's metadata (`language`: a string or a list), None when it gives none."""
    value = metadata.get("language")
    values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [v.strip() for v in values if isinstance(v, str) and v.strip()] or None


def config_hub_id(folder: str | Path) -> str | None:
    """The Hub id that a local folder's config.json names as `_name_or_path` (transformers 4 saved it; often the
    checkpoint the model was fine-tuned from), if it is one."""
    path = Path(folder).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = config.get("_name_or_path") if isinstance(config, dict) else None
    return hub_base_model(name) if isinstance(name, str) else None


def transformers_source(checkpoint: str | Path, kind: str) -> ConversionSource:
    """The `ConversionSource` of a transformers checkpoint, a local folder or a Hub id; `kind` names its class in
    markdown (e.g. "transformers' `ViTForImageClassification`")."""
    metadata = source_card_metadata(checkpoint)
    local = Path(checkpoint).expanduser().exists()
    hub_id = None if local else hub_base_model(str(checkpoint))
    if hub_id:
        description, base_model = f"{kind} [`{hub_id}`](https://huggingface.co/{hub_id})", None
    else:
        name = Path(checkpoint).expanduser().resolve().name
        description, base_model = f"{kind} in the local folder `{name}`", config_hub_id(checkpoint)
    return ConversionSource(
        description=description,
        hub_id=hub_id,
        base_model=base_model,
        language=card_languages(metadata),
        **licence_fields(metadata, "the source's model card"),
    )


def package_version() -> str:
    """The installed hf_vit_plus's version (from its distribution's metadata: this module does not import the
    package's public API)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hf_vit_plus")
    except PackageNotFoundError:  # a source tree that is not installed
        return "not installed"


def conversion_paragraph(
    source: ConversionSource, max_logit_difference: float, licence_sentence: str, base_model: str | None = None
) -> str:
    """The card's paragraph on the conversion: from what (and the Hub id `base_model`, when the source's description
    does not name it), by what, how close the logits are, and the licence."""
    origin = source.description
    if base_model and base_model != source.hub_id:
        origin += f" ([`{base_model}`](https://huggingface.co/{base_model}) on the Hub)"
    return (
        f"This checkpoint was converted from {origin} by `hf-vit-plus convert` (hf_vit_plus {package_version()}). "
        "The max |difference| of the logits on a seeded random input (a batch of 2, both models in float32): "
        f"{max_logit_difference:.2g}. Its training data and evaluation are those of the source: see the source's own "
        f"model card. {licence_sentence}"
    )


def write_conversion_card(
    output_dir: str | Path,
    *,
    model_config,
    source: ConversionSource,
    max_logit_difference: float,
    license: str | None = None,
    base_model: str | None = None,
) -> Path:
    """Write the model card (README.md) of a converted checkpoint into `output_dir` and return its path.

    Args:
        output_dir: the converted checkpoint's folder.
        model_config: the converted model's config (it sets the family's card).
        source: what the source says of itself (`transformers_source`, or built by the caller).
        max_logit_difference: the max |difference| of the two models' logits on a seeded random input.
        license: a Hub licence id given by the user; it wins over the source's.
        base_model: a Hub id given by the user; it wins over the source's.

    Raises:
        ValueError: `license` is not a Hub licence id, or `base_model` not a Hub model id.
    """
    if license is not None:
        check_license(license)
    if base_model is not None and hub_base_model(base_model) is None:
        raise ValueError(f"base_model {base_model!r} is not a Hub model id ('namespace/name').")
    license_name = license_link = None
    if license is not None:
        sentence = f"Licence: `{license}`, as given to `hf-vit-plus convert --license`."
    elif source.license is not None:
        license, license_name, license_link = source.license, source.license_name, source.license_link
        shown = f"{license} ({license_name})" if license == "other" else license
        sentence = f"Licence: `{shown}`, as {source.license_origin} says."
    else:
        license = DEFAULT_LICENSE
        stated = (
            f"the source's licence `{source.unusable_license}` is not a Hub licence id"
            if source.unusable_license
            else "the source's licence was not found"
        )
        sentence = (
            f"**Licence: {stated}.** This card says `license: {DEFAULT_LICENSE}`: check the source's licence and set "
            "it (`hf-vit-plus convert --license`, or the card's metadata)."
        )
        logger.warning("%s: the card says %s; check the source's licence (or pass --license).", stated, license)
    base_model = base_model or source.hub_id or source.base_model
    return write_converted_model_card(
        output_dir,
        model_config=model_config,
        conversion=conversion_paragraph(source, max_logit_difference, sentence, base_model),
        base_model=base_model,
        license=license,
        license_name=license_name,
        license_link=license_link,
        language=source.language,
    )


__all__ = [
    "ConversionSource",
    "card_languages",
    "config_hub_id",
    "conversion_paragraph",
    "licence_fields",
    "source_card_metadata",
    "transformers_source",
    "write_conversion_card",
]
