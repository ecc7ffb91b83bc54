"""Model cards: render README.md for a checkpoint folder from the family's template, and check card metadata.

`write_model_card` renders the card of a trained checkpoint (dataset, hyperparameters, evaluation, figures);
`model_card_from_config` renders the same family card from the config alone, for a checkpoint pushed without
training records (`model.push_to_hub`, `hf-vit-plus push` on a folder without README.md): it says plainly that
its training data, procedure and evaluation were not recorded.

The templates are Jinja files for huggingface_hub's `ModelCard.from_template`; their one copy lives in
`hf_vit_plus/hub/templates/` (shipped with the package; `model_cards/` at the repository root links to them).
`ModelCard.validate()` needs the real Hub, so `card_metadata.validate_card_metadata` checks the metadata offline.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..data.images import IMAGE_DATASETS
from ..families import FAMILIES, family_of_config
from .card_metadata import HUB_LICENSES, LOSS_METRIC, is_number, metadata_problems, repo_id_problem
from .card_metadata import PIPELINE_TAGS as PIPELINE_TAGS  # the card's vocabulary and checks, read here too
from .card_metadata import load_card_metadata as load_card_metadata
from .card_metadata import validate_card_metadata as validate_card_metadata

logger = logging.getLogger(__name__)

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


# The families' pre-0.3 names, still accepted: alias -> family id.
FAMILY_ALIASES = {alias: family.id for family in FAMILIES.values() for alias in family.card.aliases}

# Keys of `trainer.evaluate()` output that describe the run, not the model: kept out of the model-index.
_BOOKKEEPING = re.compile(r"(^|_)(runtime|samples_per_second|steps_per_second|model_preparation_time)$|^(epoch|step)$")
_SPLIT_PREFIXES = {"eval_": "validation", "test_": "test", "predict_": "test"}
# Metrics named "baseline_..." (after the split prefix) are reference numbers on the same split, not the model's
# (e.g. an image model's floors, "eval_baseline_pixel_histogram_bits_per_dim"): a table of their own, no model-index.
_BASELINE_PREFIX = "baseline_"

FIGURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".gif")


def check_license(license: str) -> str:
    """`license` when it is one of the Hub's licence ids (`HUB_LICENSES`, e.g. "apache-2.0", "cc-by-4.0"), else a
    ValueError naming it."""
    if not isinstance(license, str) or license not in HUB_LICENSES:
        close = sorted(known for known in HUB_LICENSES if isinstance(license, str) and known.startswith(license[:4]))
        hint = f" (close: {', '.join(close[:5])})" if close else ""
        raise ValueError(
            f"Unknown licence {license!r}: expected a Hub licence id such as 'apache-2.0', 'mit' or 'cc-by-4.0'"
            f"{hint}; see https://huggingface.co/docs/hub/repositories-licenses."
        )
    return license


def check_family(family: str) -> str:
    """`family` (an id of `hf_vit_plus.families.FAMILIES`: "vit", "seq2seq", ...; an old spelling is accepted), or a
    ValueError naming it."""
    family = FAMILY_ALIASES.get(family, family)
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}; expected one of {sorted(FAMILIES)}.")
    return family


def template_path(family: str) -> Path:
    """The Jinja template of `family` ("vit", "seq2seq", ...)."""
    return TEMPLATES_DIR / FAMILIES[check_family(family)].card.template


def family_of(model_config) -> str | None:
    """The card family ("vit", "seq2seq", ...) of a config or config dict, by its `model_type` (and, for the Sparse
    Transformer, whether it is an image model); None for a model type that is not one of this project's."""
    family = family_of_config(_config_dict(model_config))
    return None if family is None else family.id


def _check_family_matches(family: str, config: dict) -> None:
    """A ValueError when the config is one of this project's model types but of another card family than `family`."""
    model_type = config.get("model_type")
    known = {spec.model_type for spec in FAMILIES.values()}
    if model_type not in known or family_of(config) == family:
        return
    if model_type == FAMILIES[family].model_type:  # a model type of several families: text and image models
        kind = "an image model" if config.get("image_size") is not None else "not an image model (no image_size)"
        raise ValueError(
            f"family {family!r} does not match the config's model_type {model_type!r}: the config is {kind}, whose "
            f"family is {family_of(config)!r}."
        )
    raise ValueError(f"family {family!r} does not match the config's model_type {model_type!r}.")


def _config_dict(model_config) -> dict:
    if isinstance(model_config, dict):
        return dict(model_config)
    if hasattr(model_config, "to_dict"):
        return model_config.to_dict()
    raise ValueError(f"model_config must be a PretrainedConfig or a dict, got {type(model_config).__name__}.")


def _cell(value) -> str:
    """A value formatted for a markdown table cell."""
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (list, tuple)):
        text = ", ".join(_cell(v) for v in value)
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _split_metric(key: str, eval_split: str = "validation") -> tuple[str, str | None]:
    for prefix, split in _SPLIT_PREFIXES.items():
        if key.startswith(prefix):
            return key[len(prefix) :], eval_split if prefix == "eval_" else split
    return key, None


# Readable names of the metrics the families report, for the model-index's `name` (the Hub shows it on the
# leaderboards); any other metric gets its type in words ("online_accuracy" -> "Online accuracy").
METRIC_NAMES = {
    "accuracy": "Accuracy",
    "top5_accuracy": "Top-5 accuracy",
    "exact_match": "Exact match",
    "token_accuracy": "Token accuracy",
    "perplexity": "Perplexity",
    "bits_per_dim": "Bits per dim",
    "bits_per_token": "Bits per token",
    "bits_per_byte": "Bits per byte",
    "mpp_accuracy": "Masked patch accuracy",
    "bleu": "BLEU",
    "sacrebleu": "BLEU",
    "chrf": "chrF",
    "output_variety": "Output variety",
}


def metric_display_name(metric_type: str) -> str:
    """The readable name of a metric type for the model-index, e.g. "accuracy" -> "Accuracy", "bits_per_dim" ->
    "Bits per dim", "cls_head_accuracy" -> "Cls head accuracy"."""
    if metric_type in METRIC_NAMES:
        return METRIC_NAMES[metric_type]
    words = metric_type.replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def _eval_results(
    eval_results: dict[str, float],
    family: str,
    dataset_name: str,
    dataset_config: str | None,
    eval_split: str,
    dataset_id: str | None,
) -> tuple[list[EvalResult], list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The model's results for the model-index (losses left out, readable metric names; none without a Hub data set
    id, which the model-index requires), the rows (key, value, split) of the card's results table (losses included),
    and the baselines' rows (name, value, split) of `eval_results`."""
    if not isinstance(eval_results, dict):
        raise ValueError(f"eval_results must be a dict of metric name -> number, got {type(eval_results).__name__}.")
    results, rows, baselines = [], [], []
    for key, value in eval_results.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"eval_results keys must be non-empty strings, got {key!r}.")
        if _BOOKKEEPING.search(key):
            continue
        if not is_number(value):
            raise ValueError(f"eval_results[{key!r}] must be a number, got {value!r}.")
        if not math.isfinite(value):
            logger.warning("Leaving eval_results[%r] = %r out of the model-index (not finite).", key, value)
            continue
        metric, split = _split_metric(key, eval_split)
        if metric.startswith(_BASELINE_PREFIX):
            baselines.append((metric.removeprefix(_BASELINE_PREFIX), _cell(value), split or ""))
            continue
        rows.append((key, _cell(value), split or ""))
        if LOSS_METRIC.search(metric) or dataset_id is None:
            continue
        results.append(
            EvalResult(
                task_type=FAMILIES[family].card.pipeline_tag,
                task_name=FAMILIES[family].card.task_name,
                dataset_type=dataset_id,
                dataset_name=dataset_name,
                dataset_config=dataset_config,
                dataset_split=split,
                metric_type=metric,
                metric_name=metric_display_name(metric),
                metric_value=float(value) if isinstance(value, float) else value,
            )
        )
    return results, rows, baselines


# The builders of the `datasets` library (`load_dataset("json", data_files=...)`, `"imagefolder"`, ...): a data set
# loaded with one reports the builder's name as its `info.dataset_name`, but it is made of local (or remote) files,
# not a data set of the Hub. (transformers' Trainer cards leave out csv, json, pandas, parquet and text likewise.)
DATASETS_BUILDERS = frozenset({
    "arrow", "audiofolder", "cache", "conll", "csv", "eval", "fasta", "fastq", "folder_based_builder", "genbank",
    "generator", "harbor", "hdf5", "iceberg", "imagefolder", "json", "lance", "meshfolder", "mmcif", "niftifolder",
    "pandas", "parquet", "pdb", "pdffolder", "spark", "sql", "text", "tsfile", "videofolder", "vortex", "webdataset",
    "xml",
})  # fmt: skip
# Names that end like a data file are files (a relative path that does not exist here), not Hub ids.
_DATA_FILE_SUFFIXES = (
    ".json", ".jsonl", ".csv", ".tsv", ".txt", ".parquet", ".arrow", ".xml", ".h5", ".hdf5", ".npy", ".npz", ".zip",
    ".tar", ".gz", ".bz2", ".xz", ".zst",
)  # fmt: skip


def is_datasets_builder(name: str | None) -> bool:
    """Whether `name` is one of the `datasets` library's builders (`DATASETS_BUILDERS`: json, csv, imagefolder, ...).

    Args:
        name: a data set name, e.g. a `Dataset`'s `info.dataset_name`.

    Returns:
        True for a builder's name.
    """
    return isinstance(name, str) and name.strip().lower() in DATASETS_BUILDERS


def local_data_name(name: str) -> str:
    """What a card calls data known by a builder's name: the files it read, which are not on the Hub.

    Args:
        name: a builder's name (`is_datasets_builder`).

    Returns:
        E.g. "local files (read by the datasets `json` builder)".
    """
    return f"local files (read by the datasets `{name.strip().lower()}` builder)"


def hub_dataset_id(dataset: str | None) -> str | None:
    """`dataset` when it is a Hub data set id ("namespace/name" or "name"); None for a builder of the `datasets`
    library (`json`, `csv`, `imagefolder`, ...: `DATASETS_BUILDERS`), a local folder or file (an existing path, an
    absolute or relative path, a name ending in a data file's suffix) or anything that is not a valid repo id."""
    if not dataset or is_datasets_builder(dataset) or dataset.lower().endswith(_DATA_FILE_SUFFIXES):
        return None
    if Path(dataset).expanduser().exists() or repo_id_problem(dataset):
        return None
    return dataset


def hub_base_model(base_model: str | None) -> str | None:
    """`base_model` when it is a Hub model id, None for a local folder (an existing path, an absolute or relative
    path, or anything that is not a valid repo id): the Hub would render it as a broken link."""
    if not base_model or Path(base_model).expanduser().exists() or repo_id_problem(base_model):
        return None
    return base_model


# What `write_model_card`'s `dataset_id` defaults to: `dataset_name` is the data set's Hub id too.
_NAME_IS_ID = "<dataset_name>"
# The libraries a card's "Framework versions" lists (those a loaded model runs on), by `env_cli.framework_versions`.
CARD_LIBRARIES = ("hf_vit_plus", "Python", "torch", "transformers", "accelerate", "datasets", "tokenizers",
                  "safetensors", "huggingface_hub", "peft")  # fmt: skip
CO2_CALCULATOR = "https://mlco2.github.io/impact#compute"


@dataclass(frozen=True)
class RunRecord:
    """What a model card says of how the model was trained besides its hyperparameters: the data (source and splits,
    and how examples were prepared) and the compute it took.

    Args:
        data_description: the data's source and splits, in markdown (e.g. `TrainingData.description`).
        split_sizes: (split as the card names it, number of examples) of the training and evaluation data.
        preprocessing: how examples became model inputs, in markdown.
        hardware: what trained it, e.g. "1 process on CPU (AMD EPYC, 2 logical cores)".
        train_seconds: the training time, all resumed sessions together.
        precision: the mixed precision of the run ("no", "bf16", "fp16").
    """

    data_description: str = ""
    split_sizes: tuple[tuple[str, int], ...] = ()
    preprocessing: str = ""
    hardware: str = ""
    train_seconds: float | None = None
    precision: str | None = None


def _training_data_section(record: RunRecord | None) -> str:
    if record is None or not (record.data_description or record.split_sizes or record.preprocessing):
        return ""
    text = "## Training data\n\n"
    if record.data_description:
        text += record.data_description.strip() + "\n\n"
    if record.split_sizes:
        text += "| split | examples |\n|---|---|\n" + "".join(f"| {s} | {n:,} |\n" for s, n in record.split_sizes)
        text += "\n"
    if record.preprocessing:
        text += "### Preprocessing\n\n" + record.preprocessing.strip() + "\n\n"
    return text


def _environment_section(record: RunRecord | None, *, trained: bool) -> str:
    """Compute, environmental impact and framework versions (from `hf_vit_plus.env_cli`, as `hf-vit-plus env`)."""
    from ..utils.environment import framework_versions

    text = ""
    if record is not None and (record.hardware or record.train_seconds is not None):
        rows = [("Hardware", record.hardware or "not recorded")]
        if record.train_seconds is not None:
            seconds = record.train_seconds
            took = f"{seconds:.3g} seconds" if seconds < 60 else f"{seconds / 60:.3g} minutes"
            rows.append(("Training time", f"{seconds / 3600:.2g} hours ({took})"))
        if record.precision:
            rows.append(("Mixed precision", record.precision))
        text += "## Compute\n\n| | |\n|---|---|\n" + "".join(f"| {k} | {_cell(v)} |\n" for k, v in rows) + "\n"
        text += (
            "## Environmental impact\n\nThe energy used and the carbon emitted were not measured. The "
            f"[Machine Learning Impact calculator]({CO2_CALCULATOR}) (Lacoste et al., 2019) estimates them from the "
            "hardware and the training time above, with the place where it ran.\n\n"
        )
    versions = framework_versions(installed_only=True)
    who = "trained this model and wrote this card" if trained else "wrote this card"
    text += f"## Framework versions\n\nThe environment that {who}:\n\n"
    text += "".join(f"- {name} {versions[name]}\n" for name in CARD_LIBRARIES if name in versions) + "\n"
    return text


def _place_figures(figures, output_dir: Path) -> list[str]:
    """Relative paths (POSIX) of the figures inside `output_dir`; figures outside it are copied in."""
    placed = []
    for figure in figures:
        src = Path(figure)
        if not src.is_file():
            raise FileNotFoundError(f"Figure {str(src)!r} does not exist.")
        if src.suffix.lower() not in FIGURE_SUFFIXES:
            raise ValueError(f"Figure {str(src)!r} is not an image ({', '.join(FIGURE_SUFFIXES)}).")
        try:
            rel = src.resolve().relative_to(output_dir.resolve())
        except ValueError:
            rel = Path(src.name)
            if (output_dir / rel).exists() and not (output_dir / rel).samefile(src):
                raise ValueError(f"Cannot copy figure {str(src)!r}: {output_dir / rel} exists already.") from None
            shutil.copyfile(src, output_dir / rel)
        placed.append(rel.as_posix())
    return placed


def write_model_card(
    output_dir: str | Path,
    *,
    family: str,
    model_config,
    training_args: dict,
    eval_results: dict[str, float],
    dataset_name: str,
    dataset_config: str | None = None,
    figures: list[str | Path] = (),
    base_model: str | None = None,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    language: list[str] | None = None,
    eval_split: str = "validation",
    learning_warning: str | None = None,
    dataset_id: str | None = _NAME_IS_ID,
    run_record: RunRecord | None = None,
) -> Path:
    """Render the family's model card into `output_dir/README.md` and return its path.

    Args:
        output_dir: the checkpoint folder (it must exist; figures outside it are copied into it).
        family: a family id of `hf_vit_plus.families.FAMILIES` ("vit", "seq2seq", "sparse-lm" or "image-lm").
        model_config: the model's `PretrainedConfig` (or its dict); its architecture fields go in a table.
        training_args: hyperparameters for the table (e.g. selected `TrainingArguments` fields).
        eval_results: metric name -> number, e.g. `trainer.evaluate()`; numbers go into the model-index
            (an "eval_"/"test_" prefix sets the split and is dropped from the metric type; runtime/throughput/epoch
            entries are skipped; non-finite values are left out with a warning). Metrics named "baseline_..."
            after the prefix (e.g. "eval_baseline_uniform_bits_per_dim") are reference numbers measured on the same
            split, not the model's: they get a table of their own beside the results and stay out of the
            model-index.
        dataset_name: the data set's name (the model-index's readable `name`; its Hub id too unless `dataset_id`
            says otherwise).
        dataset_config: the dataset configuration, if any.
        figures: image files to embed (relative paths from the folder).
        base_model: the checkpoint this one was fine-tuned from, if any.
        repo_id: the Hub id used in the loading examples (default: the folder's name).
        license: a Hub license id.
        language: language codes for the metadata (text models).
        eval_split: the data set's split that the "eval_" results were measured on (e.g. "test" when the run
            evaluates on the test split); "test_"/"predict_" results are always "test".
        learning_warning: a line saying that the run did not learn its task, shown above the results.
        dataset_id: the data set's Hub id (`datasets` and the model-index's `type`; default: `dataset_name`).
            None for data that is not on the Hub: the card then has no `datasets` and no model-index (whose
            `dataset.type` must be a Hub id), and its results are in the card's table only.
        run_record: the training data's description and splits, the preprocessing, and the compute (hardware,
            time), for the card's "Training data", "Compute" and "Environmental impact" sections.

    Returns:
        The path of the README.md written.

    Raises:
        ValueError: an unknown family or licence, a config of another family, or malformed results.
        FileNotFoundError: `output_dir` or a figure does not exist.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise FileNotFoundError(f"output_dir {str(output_dir)!r} is not an existing folder.")
    family = check_family(family)
    if not isinstance(dataset_name, str) or not dataset_name.strip():
        raise ValueError(f"dataset_name must be a non-empty string, got {dataset_name!r}.")
    if not isinstance(training_args, dict):
        raise ValueError(f"training_args must be a dict, got {type(training_args).__name__}.")
    if not isinstance(eval_split, str) or not eval_split.strip():
        raise ValueError(f"eval_split must be a non-empty string (e.g. 'validation' or 'test'), got {eval_split!r}.")
    check_license(license)
    config = _config_dict(model_config)
    _check_family_matches(family, config)

    if dataset_id == _NAME_IS_ID:  # a builder's name or a path is no Hub id: the card names the files
        dataset_id = hub_dataset_id(dataset_name)
    elif dataset_id is not None and (not isinstance(dataset_id, str) or repo_id_problem(dataset_id)):
        raise ValueError(f"dataset_id must be a Hub data set id such as 'zalando-datasets/fashion_mnist' or None, "
                         f"got {dataset_id!r}.")  # fmt: skip
    elif dataset_id is not None and (is_datasets_builder(dataset_id) or dataset_id.endswith(_DATA_FILE_SUFFIXES)):
        raise ValueError(f"dataset_id {dataset_id!r} names local files (a builder of the datasets library or a "
                         "file), not a Hub data set: pass dataset_id=None.")  # fmt: skip
    if is_datasets_builder(dataset_name):
        dataset_name = local_data_name(dataset_name)
    model_id = repo_id or output_dir.resolve().name
    results, rows, baselines = _eval_results(
        eval_results, family, dataset_name, dataset_config, eval_split, dataset_id
    )
    if base_model and hub_base_model(base_model) is None:
        logger.info("base_model %r is a local folder, not a Hub id: it is left out of the card.", base_model)
    card = _render_card(
        family,
        config,
        model_id=model_id,
        repo_id=repo_id or "path/to/this/folder",
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        dataset_config=dataset_config,
        base_model=hub_base_model(base_model),
        license=license,
        language=language,
        tags=(),
        hyperparameters=[(str(k), _cell(v)) for k, v in sorted(training_args.items(), key=lambda kv: str(kv[0]))],
        results=results,
        result_rows=rows,
        baselines=baselines,
        figures=_place_figures(figures, output_dir),
        learning_warning=learning_warning,
        run_record=run_record,
    )
    path = output_dir / "README.md"
    card.save(path)
    problems = validate_card_metadata(path, require_datasets=dataset_id is not None)
    if problems:  # a bug in a template or in this function, not in the caller's input
        raise RuntimeError(f"The rendered card {path} has invalid metadata: {problems}")
    return path


def model_card_from_config(
    model_config,
    *,
    repo_id: str,
    family: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
    license: str = "apache-2.0",
    language: list[str] | None = None,
) -> ModelCard:
    """The family's model card for a checkpoint with no training records, rendered from its config alone.

    The card has the family's metadata (license, library, pipeline tag, tags), description, architecture table,
    loading examples for `repo_id` and citation; it says that the training data, the hyperparameters and any
    evaluation were not recorded, and has no model-index. Nothing is written: save it with `card.save(path)` or
    upload `str(card)`.

    Args:
        model_config: the model's `PretrainedConfig` (or its dict).
        repo_id: the Hub id used in the title and the loading examples.
        family: a family id ("vit", "seq2seq", "sparse-lm" or "image-lm"; default: from the config's `model_type`,
            and whether it is an image model).
        tags: extra Hub tags, added after the family's.
        license: a Hub license id.
        language: language codes for the metadata (text models).

    Raises:
        ValueError: an unknown family, a config of another model type, or a bad repo_id / tags.
    """
    config = _config_dict(model_config)
    family = _card_family(config, family)
    check_license(license)
    if not isinstance(repo_id, str) or not repo_id.strip():
        raise ValueError(f"repo_id must be a non-empty string, got {repo_id!r}.")
    if isinstance(tags, str) or not all(isinstance(tag, str) and tag.strip() for tag in tags):
        raise ValueError(f"tags must be a list of non-empty strings, got {tags!r}.")
    card = _render_card(
        family,
        config,
        model_id=repo_id,
        repo_id=repo_id,
        dataset_name=None,
        dataset_id=None,
        dataset_config=None,
        base_model=None,
        license=license,
        language=language,
        tags=tags,
        hyperparameters=[],
        results=[],
        result_rows=[],
        baselines=[],
        figures=[],
    )
    problems = metadata_problems(card.data.to_dict(), require_datasets=False)
    if problems:  # a bug in a template or in this function, not in the caller's input
        raise RuntimeError(f"The rendered card for {repo_id!r} has invalid metadata: {problems}")
    return card


def _card_family(config: dict, family: str | None) -> str:
    """`family` checked against the config, or the config's own family when it is None; a ValueError naming the
    model type when there is none or they differ."""
    if family is None:
        family = family_of(config)
        if family is None:
            raise ValueError(
                f"No model card family for model_type {config.get('model_type')!r}; expected one of "
                f"{sorted(spec.model_type for spec in FAMILIES.values())}, or pass family=."
            )
    family = check_family(family)
    if config.get("model_type") != FAMILIES[family].model_type:
        raise ValueError(f"family {family!r} does not match the config's model_type {config.get('model_type')!r}.")
    _check_family_matches(family, config)
    return family


def write_converted_model_card(
    output_dir: str | Path,
    *,
    model_config,
    conversion: str,
    base_model: str | None = None,
    license: str = "apache-2.0",
    license_name: str | None = None,
    license_link: str | None = None,
    language: list[str] | None = None,
) -> Path:
    """Render the family's card of a checkpoint converted from another format (`hf-vit-plus convert`) into
    `output_dir/README.md` and return its path.

    The card is the one `model_card_from_config` renders (no training records, no model-index), titled with the
    folder's name, with loading examples of "path/to/this/folder" (`hf-vit-plus push` names the repository), and the
    paragraph `conversion` after its introduction: where the weights come from and how close the converted model's
    logits are to the source's.

    Args:
        output_dir: the converted checkpoint's folder (it must exist).
        model_config: the converted model's `PretrainedConfig` (or its dict); it sets the family.
        conversion: a markdown paragraph saying what the checkpoint was converted from, by what, and how close.
        base_model: the source's Hub id; a local path is left out (`hub_base_model`).
        license: a Hub licence id; "other" needs `license_name`.
        license_name / license_link: the name of a licence "other" and a link to its text.
        language: language codes for the metadata (text models).

    Raises:
        ValueError: an empty `conversion`, an unknown licence, "other" without a name, or a config of no family.
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise FileNotFoundError(f"output_dir {str(output_dir)!r} is not an existing folder.")
    if not isinstance(conversion, str) or not conversion.strip():
        raise ValueError(f"conversion must be a non-empty paragraph, got {conversion!r}.")
    check_license(license)
    if license == "other" and not license_name:
        raise ValueError("license 'other' needs a license_name (the Hub shows it in place of a licence id).")
    config = _config_dict(model_config)
    family = _card_family(config, None)
    if base_model and hub_base_model(base_model) is None:
        logger.info("base_model %r is a local folder, not a Hub id: it is left out of the card.", base_model)
    card = _render_card(
        family,
        config,
        model_id=output_dir.resolve().name,
        repo_id=LOCAL_PLACEHOLDER,
        dataset_name=None,
        dataset_id=None,
        dataset_config=None,
        base_model=hub_base_model(base_model),
        license=license,
        license_name=license_name if license == "other" else None,
        license_link=license_link if license == "other" else None,
        language=language,
        tags=(),
        hyperparameters=[],
        results=[],
        result_rows=[],
        baselines=[],
        figures=[],
        conversion=conversion.strip(),
    )
    if conversion.strip() not in card.text:  # a bug in a template, not in the caller's input
        raise RuntimeError(f"The {family!r} card template has no place for the conversion paragraph.")
    path = output_dir / "README.md"
    card.save(path)
    problems = validate_card_metadata(path, require_datasets=False)
    if problems:  # a bug in a template or in this function, not in the caller's input
        raise RuntimeError(f"The rendered card {path} has invalid metadata: {problems}")
    return path


def _render_card(
    family: str,
    config: dict,
    *,
    model_id: str,
    repo_id: str,
    dataset_name: str | None,
    dataset_id: str | None,
    dataset_config: str | None,
    base_model: str | None,
    license: str,
    language: list[str] | None,
    tags,
    hyperparameters: list[tuple[str, str]],
    results: list[EvalResult],
    result_rows: list[tuple[str, str, str]],
    baselines: list[tuple[str, str, str]],
    figures: list[str],
    learning_warning: str | None = None,
    run_record: RunRecord | None = None,
    license_name: str | None = None,
    license_link: str | None = None,
    conversion: str | None = None,
) -> ModelCard:
    spec = FAMILIES[family].card
    metrics = sorted({r.metric_type for r in results})
    card_data = ModelCardData(
        language=language,
        license=license,
        license_name=license_name,
        license_link=license_link,
        library_name="transformers",
        tags=list(spec.tags) + [tag for tag in dict.fromkeys(tags) if tag not in spec.tags],
        datasets=[dataset_id] if dataset_id else None,
        metrics=metrics or None,
        pipeline_tag=spec.pipeline_tag,
        base_model=base_model,
        # the model-index's name; without results there is no model-index, and no stray `model_name` key either
        model_name=model_id if results else None,
        eval_results=results or None,
    )
    values = {k: v for k, v in config.items() if k != "num_labels"}
    if config.get("id2label"):  # the class count is that of the labels (a config dict has no num_labels)
        values["num_labels"] = len(config["id2label"])
    hidden = {field for field, condition in spec.architecture_when if not values.get(condition)}
    arch = [(k, _cell(values[k])) for k in spec.architecture if values.get(k) is not None and k not in hidden]
    # a built-in data set's own citation (`hf_vit_plus.data.images`), for the templates that cite their data
    known = (d for d in IMAGE_DATASETS.values() if dataset_name in (d.card_name, d.name) or dataset_id == d.hub_id)
    citation = next((d.citation for d in known if d.citation), "")
    link = f"**{dataset_name}**" if dataset_name else ""
    if dataset_id:  # the Hub's page of the data set
        link = f"[**{dataset_name}**](https://huggingface.co/datasets/{dataset_id})"
    return ModelCard.from_template(
        card_data,
        template_path=template_path(family),
        model_id=model_id,
        repo_id=repo_id,
        dataset_name=dataset_name,
        dataset_link=link,
        dataset_config=dataset_config,
        base_model=base_model,
        architecture=arch,
        training_data_section=_training_data_section(run_record),
        # results of data that is not on the Hub stay out of the metadata, whose model-index needs a Hub data set id
        results_note=(
            "The data set is not on the Hub, so these results are in this table only, not in the card's metadata "
            "(whose `model-index` names a Hub data set).\n\n"
            if result_rows and not dataset_id
            else ""
        ),
        environment_section=_environment_section(run_record, trained=bool(dataset_name)),
        hyperparameters=hyperparameters,
        results=result_rows,
        baselines=baselines,
        figures=figures,
        learning_warning=learning_warning,
        conversion=conversion,
        dataset_citation=citation,
        # what the image templates say of the architecture: transformers' own model types trained by the ViT family
        # for comparison (a ResNet), DeiT's distillation token
        model_type=config.get("model_type"),
        model_class=(config.get("architectures") or [None])[0],
        distillation_token=bool(config.get("use_distillation_token")),
        drop_path_rate=config.get("drop_path_rate") or 0,
        # a run with --ema_decay saves the weights' average; `online_*` results are the last weights'
        averaged_weights=any(_split_metric(key)[0].startswith("online_") for key, _, _ in result_rows),
        # masked patch prediction (the vit-mpp card)
        mpp_percent=f"{100 * config.get('mpp_mask_ratio', 0.5):g}%",
        mpp_bits=config.get("mpp_num_bits", 3),
        mpp_classes=2 ** (config.get("mpp_num_bits", 3) * (config.get("num_channels") or 3)),
        grey=config.get("num_channels") == 1,
    )


# What the loading examples of a card written without a repository id (--hub_model_id) load.
LOCAL_PLACEHOLDER = "path/to/this/folder"


def card_for_repo(text: str, repo_id: str, folder_name: str) -> str | None:
    """The card `text` (a README.md this package wrote, tagged `hf_vit_plus`) made to name the repository it is pushed
    to: the loading examples' "path/to/this/folder" (a card written without --hub_model_id), the model-index name,
    the title, and an adapter card's `PeftModel.from_pretrained(base, "<folder>")` become `repo_id`. The old name is
    the model-index's, else `folder_name` (the folder the card was written in). None when the card is not one of this
    package's (a hand-written card goes up as it is) or its metadata cannot be read; `text` itself when nothing
    changes."""
    try:
        card = ModelCard(text)
    except Exception:  # noqa: BLE001 - huggingface_hub raises several kinds for a broken YAML block
        return None
    if "hf_vit_plus" not in (card.data.tags or []):
        return None
    unchanged = str(card)
    old = card.data.model_name if card.data.eval_results else folder_name
    if card.data.eval_results and card.data.model_name != repo_id:
        card.data.model_name = repo_id
    body = card.text.replace(f'"{LOCAL_PLACEHOLDER}"', f'"{repo_id}"').replace(LOCAL_PLACEHOLDER, repo_id)
    if old and old != repo_id:
        body = re.sub(rf"^# {re.escape(old)}[ \t]*$", f"# {repo_id}", body, count=1, flags=re.MULTILINE)
        adapter = 'PeftModel.from_pretrained(base, "{}")'  # an adapter card's loading example
        body = body.replace(adapter.format(old), adapter.format(repo_id))
    card.text = body
    rewritten = str(card)
    return text if rewritten == unchanged else rewritten
