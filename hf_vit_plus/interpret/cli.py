"""`hf-vit-plus explain`: interpretability figures for a saved checkpoint (ViT paper Fig. 7, attention rollout,
Sparse Transformer Fig. 2 and 3).

    hf-vit-plus explain rollout CHECKPOINT IMAGE [IMAGE ...] --output attention_maps.png
    hf-vit-plus explain distance CHECKPOINT [IMAGE ...] --output mean_attention_distance.png
    hf-vit-plus explain positions CHECKPOINT --output position_embedding_similarity.png
    hf-vit-plus explain filters CHECKPOINT --output patch_embedding_components.png
    hf-vit-plus explain pattern [CHECKPOINT] [--kind KIND|all --stride 4 --length 64] --output pattern.png
    hf-vit-plus explain all CHECKPOINT IMAGE [IMAGE ...] --output_dir figures/
    hf-vit-plus explain next-pixel IMAGE_MODEL (--image FILE | --dataset {datasets} [--index I] | --sample)
        [--pixel ROW COL] --output next_pixel_attention.png
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from ..cli_utils import HelpFormatter, checked_number, existing_file, positive_int, unit_interval
from ..data.images import IMAGE_DATASETS, split_names
from ..errors import UsageError, load_config
from ..errors import user_errors as user_input  # the checks of what the user gave
from ..utils.extras import require

logger = logging.getLogger(__name__)

DESCRIPTION = __doc__.replace("{datasets}", "|".join(IMAGE_DATASETS))


non_negative_int = checked_number(int, lambda value: value >= 0, "an integer >= 0")  # an index


def load_checkpoint(checkpoint: str | Path, trust_remote_code: bool = False):
    """(model, image processor or None) from a saved folder or Hub id, with the eager attention kernel so that the
    attention weights are returned. Image-classification models load with their head, others as the base model.
    A checkpoint that is neither a folder nor a Hub model raises a `UsageError`."""
    from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification

    import hf_vit_plus  # noqa: F401  (registers the Auto classes)

    config = load_config(checkpoint, "CHECKPOINT", trust_remote_code=trust_remote_code)
    if getattr(config, "is_image_model", False):
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is an image Sparse Transformer (model_type={config.model_type!r}), not a ViT: "
            "draw where its attention looks with `hf-vit-plus explain next-pixel` (or its pattern with `explain "
            "pattern`)."
        )
    model = None
    for auto_class in (AutoModelForImageClassification, AutoModel):
        try:
            model = auto_class.from_pretrained(
                checkpoint, attn_implementation="eager", trust_remote_code=trust_remote_code
            )
            break
        except ValueError as error:  # the Auto class does not know this config
            logger.debug("%s cannot load %s: %s", auto_class.__name__, checkpoint, error)
    if model is None:
        raise UsageError(
            f"Neither AutoModelForImageClassification nor AutoModel loads {checkpoint!r} ({config.model_type})."
        )
    model.eval()
    processor = None
    if getattr(config, "image_size", None) is not None:
        try:
            processor = AutoImageProcessor.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as error:
            logger.warning("No image processor saved with %s (%s); using one made from its config.", checkpoint, error)
    return model, processor


def _random_inputs(model, count: int, seed: int):
    import torch

    from .attention import _model_resolution

    channels, height, width = _model_resolution(model.config)
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, channels, height, width, generator=generator)


def _rollout(args: argparse.Namespace) -> list[Path]:
    from .attention import (
        attention_rollout,
        class_token_attention,
        class_token_rollout,
        collect_attentions,
        prepare_images,
    )
    from .embeddings import vit_embedding_parts
    from .plots import plot_attention_maps

    model, processor = load_checkpoint(args.checkpoint, args.trust_remote_code)
    with user_input():
        parts = vit_embedding_parts(model)
        pixel_values, display = prepare_images(model, [str(p) for p in args.images], processor)
    attentions = collect_attentions(model, pixel_values)
    rollout = attention_rollout(attentions, args.residual_weight, args.head_fusion)
    maps = class_token_rollout(rollout, parts.grid_size, parts.num_prefix_tokens)
    heads = class_token_attention(attentions, -1, parts.grid_size, parts.num_prefix_tokens)
    for image, grid in zip(args.images, maps):
        peak = divmod(int(grid.argmax()), grid.shape[1])
        share = float(grid.sum())
        print(f"{image}: rollout peak at patch (row {peak[0]}, col {peak[1]}), share on the patches {share:.3f}")
    labels = [Path(p).name for p in args.images]
    return [plot_attention_maps(display, maps, heads, args.output, labels)]


def _distance(args: argparse.Namespace) -> list[Path]:
    from .attention import collect_attentions, mean_attention_distance, prefix_attention_fraction, prepare_images
    from .embeddings import vit_embedding_parts
    from .plots import plot_mean_attention_distance

    model, processor = load_checkpoint(args.checkpoint, args.trust_remote_code)
    with user_input():
        parts = vit_embedding_parts(model)
        if args.images:
            pixel_values, _ = prepare_images(model, [str(p) for p in args.images], processor)
    if not args.images:
        logger.warning("No images: using %d N(0, 1) noise inputs (shows the weights, not data).", args.num_random)
        pixel_values = _random_inputs(model, args.num_random, args.seed)
    attentions = collect_attentions(model, pixel_values)
    distances = mean_attention_distance(attentions, parts.patch_size, parts.grid_size, parts.num_prefix_tokens)
    on_class = prefix_attention_fraction(attentions, parts.num_prefix_tokens)
    for layer, (row, share) in enumerate(zip(distances.tolist(), on_class.mean(dim=1).tolist()), start=1):
        print(f"layer {layer}: " + " ".join(f"{d:6.1f}" for d in row) + f"  px  (class-token share {share:.2f})")
    image_size = parts.grid_size[0] * parts.patch_size
    return [plot_mean_attention_distance(distances, args.output, image_size, pixel_values.shape[0])]


def _positions(args: argparse.Namespace) -> list[Path]:
    from .embeddings import position_embedding_similarity, vit_embedding_parts
    from .plots import plot_position_similarity

    model, _ = load_checkpoint(args.checkpoint, args.trust_remote_code)
    with user_input():
        parts = vit_embedding_parts(model)
    similarity = position_embedding_similarity(parts.position_embeddings, parts.grid_size, parts.num_prefix_tokens)
    return [plot_position_similarity(similarity, args.output)]


def _filters(args: argparse.Namespace) -> list[Path]:
    from .embeddings import patch_embedding_components, vit_embedding_parts
    from .plots import plot_patch_components

    model, _ = load_checkpoint(args.checkpoint, args.trust_remote_code)
    with user_input():
        parts = vit_embedding_parts(model)
        if parts.stem is not None:
            raise ValueError(
                f"{args.checkpoint} is a hybrid ViT (conv_stem_layers={model.config.conv_stem_layers}): its patch "
                "projection is a 1 x 1 conv of the convolutional stem's features, not filters of pixels to show."
            )
    pca = patch_embedding_components(parts.projection.weight, args.num_components)
    ratios = ", ".join(f"{100 * r:.1f}" for r in pca.explained_variance_ratio[:8].tolist())
    print(f"{pca.components.shape[0]} components; explained variance (%) of the first ones: {ratios}")
    return [plot_patch_components(pca.components, args.output, pca.explained_variance_ratio)]


def _pattern(args: argparse.Namespace) -> list[Path]:
    from .patterns import PATTERN_KINDS, attention_pattern, default_length, pattern_from_config
    from .plots import MAX_PATTERN_LENGTH, plot_sparse_patterns

    if args.checkpoint is not None:
        config = load_config(args.checkpoint, "CHECKPOINT", trust_remote_code=args.trust_remote_code)
        with user_input():  # a model without sparse attention, or a --length it cannot take
            patterns = [pattern_from_config(config, args.length)]
    else:
        if args.kind is None:
            raise UsageError(f"Give a CHECKPOINT or --kind ({', '.join(PATTERN_KINDS)} or all).")
        kinds = list(PATTERN_KINDS) if args.kind == "all" else [args.kind]
        # The paper takes l close to sqrt(n).
        stride = args.stride or (max(2, math.isqrt(args.length)) if args.length else 8)
        length = args.length or default_length(stride)
        if length > MAX_PATTERN_LENGTH:
            raise UsageError(
                f"--length {length} is too long to draw (at most {MAX_PATTERN_LENGTH}); the pattern repeats along the "
                "sequence, so a prefix shows it."
            )
        with user_input():  # --stride / --summary_size / --length that do not fit together
            patterns = [
                attention_pattern(kind, length, stride, args.summary_size, not args.bidirectional) for kind in kinds
            ]
    for pattern in patterns:
        print(f"{pattern.describe()}: {100 * pattern.density():.1f}% of the attention matrix")
    queries = [args.query] * len(patterns) if args.query is not None else None
    return [plot_sparse_patterns(patterns, args.output, queries)]


def _all(args: argparse.Namespace) -> list[Path]:
    from .attention import prepare_images
    from .embeddings import vit_embedding_parts
    from .plots import write_vit_figures

    model, processor = load_checkpoint(args.checkpoint, args.trust_remote_code)
    with user_input():  # a ViT, and images it can take?
        vit_embedding_parts(model)
        prepare_images(model, [str(p) for p in args.images], processor)
    return write_vit_figures(model, [str(p) for p in args.images], args.output_dir, processor, args.max_images)


def _image_model(checkpoint: str, trust_remote_code: bool):
    """An image Sparse Transformer (`SparseTransformerForImageGeneration`) from a saved folder or Hub id; a
    `UsageError` naming the model type for any other model."""
    from transformers import AutoModelForCausalLM

    import hf_vit_plus  # noqa: F401  (registers the Auto classes)

    config = load_config(checkpoint, "CHECKPOINT", trust_remote_code=trust_remote_code)
    if not getattr(config, "is_image_model", False):
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is model_type={config.model_type!r} without `image_size`: `explain "
            "next-pixel` applies to image Sparse Transformers (SparseTransformerConfig.for_images, `hf-vit-plus "
            "train image-lm`)."
        )
    model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    return model.eval()


def _image_from_file(path: Path, config):
    """(H, W) or (C, H, W) uint8 array from an image file, converted to the model's mode, of the model's size
    exactly."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    height, width = config.image_size
    try:
        with Image.open(path) as opened:
            image = opened.convert("L" if config.num_channels == 1 else "RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise UsageError(f"--image {str(path)!r} is not an image file PIL can read ({error}).") from error
    if config.num_channels not in (1, 3):
        raise UsageError(f"--image needs a 1- or 3-channel model; this one has num_channels={config.num_channels}.")
    if image.size != (width, height):
        raise UsageError(
            f"--image {str(path)!r} is {image.size[0]} x {image.size[1]} pixels (width x height); the model takes "
            f"{width} x {height} images (images are not resized: every pixel is a token)."
        )
    array = np.asarray(image, dtype=np.uint8)
    return array if array.ndim == 2 else array.transpose(2, 0, 1)  # (H, W) or (C, H, W)


def _image_from_dataset(name: str, split: str, index: int):
    """(H, W) uint8 array: image `index` of the `split` of data set `name` (`data.images.load_image_arrays`)."""
    from ..data.images import load_image_arrays

    try:
        images = load_image_arrays(name, split)
    except FileNotFoundError as error:  # Fashion-MNIST missing: the message names the apt package
        raise UsageError(str(error)) from error
    if not 0 <= index < len(images):
        raise UsageError(
            f"--index {index} is outside the {len(images)} images of the {name} {split} split (0..{len(images) - 1})."
        )
    return images[index]


def _sampled_image(model, seed: int):
    import torch

    torch.manual_seed(seed)
    start = torch.full((1, 1), model.config.bos_token_id, device=next(model.parameters()).device)
    with torch.no_grad():
        tokens = model.generate(
            input_ids=start, max_new_tokens=model.config.pixels_per_image, do_sample=True, top_k=0, top_p=1.0
        )
    image = model.tokens_to_pixels(tokens[:, 1:].cpu())[0].numpy()  # (C, H, W)
    return image[0] if image.shape[0] == 1 else image


def _next_pixel(args: argparse.Namespace) -> list[Path]:
    import numpy as np

    from .image_attention import next_pixel_attention, plot_next_pixel_attention

    chosen = [flag for flag, given in (("--image", args.image), ("--dataset", args.dataset), ("--sample", args.sample))
              if given]  # fmt: skip
    if len(chosen) != 1:
        raise UsageError(f"Give exactly one of --image, --dataset and --sample; got {', '.join(chosen) or 'none'}.")
    if args.dataset is None and (args.index is not None or args.split is not None):
        raise UsageError("--index and --split pick an image of --dataset; they do not apply to --image or --sample.")
    if not args.sample and args.seed is not None:
        raise UsageError("--seed applies to --sample only (the seed of the image drawn from the model).")
    model = _image_model(args.checkpoint, args.trust_remote_code)
    config = model.config
    height, width = config.image_size
    if args.image is not None:
        image, source = _image_from_file(args.image, config), args.image.name
    elif args.dataset is not None:
        split, index = args.split or "test", args.index or 0
        image, source = _image_from_dataset(args.dataset, split, index), f"{args.dataset} {split}[{index}]"
        if config.num_channels != 1 or image.shape != (height, width):
            raise UsageError(
                f"--dataset {args.dataset} has {image.shape[0]} x {image.shape[1]} grey images; the model takes "
                f"{height} x {width} images with {config.num_channels} channel(s)."
            )
    else:
        seed = 0 if args.seed is None else args.seed
        image, source = _sampled_image(model, seed), f"a sample (seed {seed})"
    pixel = tuple(args.pixel) if args.pixel is not None else (height // 2, width // 2)
    with user_input():  # a pixel, channel, head or layer that the model does not have
        attention = next_pixel_attention(model, image, pixel, args.channel)
        num_heads = attention.head_maps.shape[1]
        if args.head is not None and not 1 <= args.head <= num_heads:
            raise ValueError(f"--head {args.head} is not a head of this model (1..{num_heads}).")
        layers = None
        if args.layers is not None:
            bad = [k for k in args.layers if not 1 <= k <= attention.num_layers]
            if bad:
                raise ValueError(f"--layers {bad} are not layers of this model (1..{attention.num_layers}).")
            layers = [k - 1 for k in args.layers]
    if args.head is None:
        maps, start, who = attention.maps, attention.start_weights, "mean over heads"
    else:
        maps, start = attention.head_maps[:, args.head - 1], attention.head_start_weights[:, args.head - 1]
        who = f"head {args.head}"
    row, col = attention.pixel
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    distance = np.hypot(rows - row, cols - col)
    for layer in layers if layers is not None else range(attention.num_layers):
        weights = maps[layer].numpy()
        peak = divmod(int(weights.argmax()), width)
        mass = float(weights.sum())
        mean_distance = float((weights * distance).sum() / mass) if mass > 0 else float("nan")
        print(
            f"layer {layer + 1}: start token {float(start[layer]):.3f}, {int((weights > 0).sum())} pixels attended, "
            f"peak at (row {peak[0]}, col {peak[1]}) {float(weights.max()):.3f}, mean distance {mean_distance:.1f} px"
        )
    what = f"pixel (row {row}, col {col})" + (f", channel {args.channel}" if config.num_channels > 1 else "")
    title = f"Attention when generating {what} of {source}, {who}"
    return [plot_next_pixel_attention(maps, image, attention.pixel, args.output, start, layers, args.channel,
                                      title=title)]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Draw the figures of one `hf-vit-plus explain` sub-command (its `explain_func`) and print their paths.

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0.
    """
    require("interpret", "hf-vit-plus explain", ("matplotlib",))
    paths = args.explain_func(args)  # a UsageError is printed by `hf_vit_plus.cli.main`
    for path in paths:
        print(f"wrote {path}")
    return 0


def _pattern_arguments(sub: argparse.ArgumentParser) -> None:
    """The arguments of `explain pattern`: the registered pattern kinds are their choices."""
    from ..models.sparse_layouts import ATTENTION_TYPES, PATTERNS

    sub.add_argument(
        "--kind",
        choices=[*ATTENTION_TYPES, "all"],
        default=None,
        help=f"pattern to draw without a checkpoint ('all': {', '.join(ATTENTION_TYPES)} side by side)",
    )
    sub.add_argument(
        "--stride", type=positive_int, default=None, help="the pattern's length l (stride, block length or window)"
    )
    sub.add_argument(
        "--summary_size",
        type=int,
        default=None,
        help="the second setting of the kinds that read one: "
        + "; ".join(
            f"{name}: {kind.symbols['summary_size']} (default {kind.default_settings(8)['summary_size']} at l=8)"
            for name, kind in PATTERNS.items()
            if "summary_size" in kind.settings
        ),
    )
    sub.add_argument(
        "--length", type=positive_int, default=None, help="sequence length n (default about l^2, at most 1024)"
    )
    sub.add_argument("--bidirectional", action="store_true", help="encoder form (no j <= i restriction)")
    sub.add_argument("--query", type=int, default=None, help="query position of the top row (default: near the end)")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="interpretability figures: attention rollout, attention distance, embeddings, patterns",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modes = parser.add_subparsers(dest="mode", required=True)

    def mode(name: str, func, help_text: str, default_output: str | None, checkpoint: str = "required"):
        sub = modes.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if checkpoint == "required":
            sub.add_argument("checkpoint", help="saved model folder or Hub id")
        elif checkpoint == "optional":
            sub.add_argument("checkpoint", nargs="?", default=None, help="saved model folder or Hub id (optional)")
        sub.add_argument("--trust_remote_code", action="store_true", help="allow the checkpoint's own code")
        if default_output is not None:
            sub.add_argument("--output", type=Path, default=Path(default_output), help="PNG to write")
        sub.set_defaults(func=run, explain_func=func)
        return sub

    sub = mode(
        "rollout", _rollout, "attention rollout and last-layer class-token attention over images", "attention_maps.png"
    )
    sub.add_argument("images", nargs="+", type=existing_file, help="image files")
    sub.add_argument(
        "--residual_weight", type=unit_interval, default=0.5, help="weight of the identity (Abnar & Zuidema)"
    )
    sub.add_argument(
        "--head_fusion", choices=["mean", "max", "min"], default="mean", help="how a layer's heads are combined"
    )

    sub = mode(
        "distance",
        _distance,
        "mean attention distance per head and layer (ViT Fig. 7 right)",
        "mean_attention_distance.png",
    )
    sub.add_argument("images", nargs="*", type=existing_file, help="image files (none: N(0, 1) noise inputs)")
    sub.add_argument("--num_random", type=positive_int, default=16, help="noise inputs when no images are given")
    sub.add_argument("--seed", type=int, default=0, help="random seed of the noise inputs")

    mode(
        "positions",
        _positions,
        "position-embedding cosine similarity (ViT Fig. 7 centre)",
        "position_embedding_similarity.png",
    )

    sub = mode(
        "filters",
        _filters,
        "principal components of the patch-embedding filters (ViT Fig. 7 left)",
        "patch_embedding_components.png",
    )
    sub.add_argument("--num_components", type=positive_int, default=28, help="principal components drawn")

    sub = mode(
        "pattern",
        _pattern,
        "sparse attention pattern: keys each query sees (Sparse Transformer Fig. 3)",
        "sparse_attention_pattern.png",
        checkpoint="optional",
    )
    sub.add_arguments_later(_pattern_arguments)  # its choices and help read the pattern registry (torch)

    sub = mode("all", _all, "every figure of a ViT checkpoint into a folder (for its model card)", None)
    sub.add_argument("images", nargs="+", type=existing_file, help="image files")
    sub.add_argument("--output_dir", type=Path, default=Path("figures"), help="folder the PNGs are written to")
    sub.add_argument("--max_images", type=positive_int, default=4, help="images shown in attention_maps.png")

    sub = mode(
        "next-pixel",
        _next_pixel,
        "where an image model's attention looks when it generates one pixel, per layer (Sparse Transformer Fig. 2)",
        "next_pixel_attention.png",
    )
    sub.add_argument("--image", type=existing_file, default=None, help="image file of the model's size")
    sub.add_argument("--dataset", choices=list(IMAGE_DATASETS), default=None, help="take the image from this data set")
    sub.add_argument("--split", choices=split_names(), default=None, help="--dataset split (default: test)")
    sub.add_argument("--index", type=non_negative_int, default=None, help="--dataset image index (default: 0)")
    sub.add_argument("--sample", action="store_true", help="draw the image from the model itself")
    sub.add_argument("--seed", type=int, default=None, help="--sample: random seed (default: 0)")
    sub.add_argument(
        "--pixel", type=non_negative_int, nargs=2, metavar=("ROW", "COL"), default=None,
        help="the pixel being generated, 0-based (default: the middle of the image)",
    )  # fmt: skip
    sub.add_argument("--channel", type=non_negative_int, default=0, help="its channel, for a colour model")
    sub.add_argument("--head", type=positive_int, default=None, help="draw this head (1-based), not the mean")
    sub.add_argument(
        "--layers", type=positive_int, nargs="+", default=None, help="layers to draw, 1-based (default: all)"
    )
