"""`hf-vit-plus sample CHECKPOINT`: images drawn by a Sparse Transformer image model, or completions of real images
from their top rows (sec. 7.1 of the paper), as one PNG grid.

    hf-vit-plus sample outputs/image-lm --num_images 16 --output samples.png --temperature 1.0 --seed 0
    hf-vit-plus sample outputs/image-lm --complete fashion-mnist --num_images 8 --keep_rows 14 --output completions.png
    hf-vit-plus sample outputs/image-lm --complete shirt.png boot.png --keep_rows 10 --num_completions 4

With --complete, each column of the grid is one image: its original, then its kept top rows (the rest grey), then
its completions, one per grid row; more images than --nrow continue in a further block of rows below.
--compile decodes with a static cache and a compiled step: the same images in about half the time once compiled, but
the first compilation takes 10-20 s on a CPU (a few seconds when inductor's on-disk cache holds it from an earlier
run), so it pays off for many images or repeated runs.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from .cli_utils import RawDescriptionDefaultsFormatter, non_negative_int, positive_float, positive_int
from .data.images import IMAGE_DATASETS
from .errors import UsageError, load_config

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "sample",
        help="draw images from a Sparse Transformer image model, or complete real images from their top rows",
        description=__doc__,
        formatter_class=RawDescriptionDefaultsFormatter,
    )
    parser.add_argument("checkpoint", help="a saved image model (folder or Hub id)")
    parser.add_argument(
        "--num_images", type=positive_int, default=16, help="images to draw, or to take from each --complete data set"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="the PNG grid (default: samples.png, or completions.png)"
    )
    parser.add_argument(
        "--temperature", type=positive_float, default=1.0, help="< 1 sharpens each pixel's distribution"
    )
    parser.add_argument("--top_k", type=positive_int, default=None, help="draw among the K most likely values only")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed of the draw (default: 0)")
    parser.add_argument("--batch_size", type=positive_int, default=16, help="images drawn at once")
    parser.add_argument(
        "--complete",
        nargs="+",
        metavar="IMAGE_OR_DATASET",
        default=None,
        help="complete these images instead: image files, or a built-in data set's test images "
        f"({', '.join(IMAGE_DATASETS)}; --num_images of them)",
    )
    parser.add_argument(
        "--keep_rows", type=non_negative_int, default=None, help="rows kept from the top (default: half the height)"
    )
    parser.add_argument("--num_completions", type=positive_int, default=3, help="completions per image")
    parser.add_argument(
        "--nrow", type=positive_int, default=None, help="images per grid row (default: a square grid, or 8 columns)"
    )
    parser.add_argument(
        "--scale", type=positive_int, default=None, help="enlargement of each image (default: sides >= 96 pixels)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="decode with a static cache and a compiled step (see above)"
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--trust_remote_code", action="store_true", help="load the model with its own code, without the package"
    )
    parser.set_defaults(func=run_sample)


def load_image_config(checkpoint: str, trust_remote_code: bool = False):
    """The config saved at `checkpoint`; a `UsageError` when it is not a Sparse Transformer image model's."""
    import hf_vit_plus  # noqa: F401  (registers the Auto classes)

    config = load_config(checkpoint, "CHECKPOINT", trust_remote_code=trust_remote_code)
    if not getattr(config, "is_image_model", False):
        raise UsageError(
            f"CHECKPOINT {checkpoint!r} is not an image model ({type(config).__name__}, model_type "
            f"{config.model_type!r}, image_size={getattr(config, 'image_size', None)!r}); `sample` needs a Sparse "
            "Transformer trained on images (`hf-vit-plus train image-lm`)."
        )
    return config


def load_image_model(checkpoint: str, device: str | None = None, trust_remote_code: bool = False):
    """The image model saved at `checkpoint` (through `AutoModelForCausalLM`), in eval mode on `device` (default:
    cuda if available, else cpu); a `UsageError` when it is not a Sparse Transformer image model."""
    import torch
    from transformers import AutoModelForCausalLM

    load_image_config(checkpoint, trust_remote_code)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise UsageError(f"--device {device!r} is not a torch device: {error}") from None
    model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=trust_remote_code)
    return model.to(device).eval()


def completion_tiles(originals, completions, keep_rows: int, nrow: int):
    """The tiles of the completion grid, in row-major order for `image_grid(tiles, nrow)`: per block of `nrow`
    images (columns), a row of originals, a row of their kept top rows (the rest grey), then one row per completion;
    a short last block is filled with white tiles. `completions` is (N, K, C, H, W)."""
    import torch

    from .image_generation import mask_rows

    count = originals.shape[0]
    masked = mask_rows(originals, keep_rows)
    blank = torch.full_like(originals[0], 255)
    tiles = []
    for start in range(0, count, nrow):
        columns = range(start, start + nrow)
        rows = [originals, masked] + [completions[:, k] for k in range(completions.shape[1])]
        for row in rows:
            tiles.extend(row[i] if i < count else blank for i in columns)
    return torch.stack(tiles)


def run_sample(args: argparse.Namespace) -> int:
    """Sample images from, or complete images with, an image Sparse Transformer (`hf-vit-plus sample`) into a PNG grid.

    Everything the user gave is checked against the checkpoint's config before the weights are loaded.

    Args:
        args: the parsed command line.

    Returns:
        The exit status, 0.

    Raises:
        UsageError: an output that is a folder, --keep_rows without --complete or too large, or images to complete
            that cannot be read.
    """
    from .image_generation import complete_images, image_grid, read_images, sample_images

    output = args.output or Path("samples.png" if args.complete is None else "completions.png")
    if output.is_dir():
        raise UsageError(f"--output {str(output)!r} is a folder; expected a .png file name.")
    if args.complete is None and args.keep_rows is not None:
        raise UsageError("--keep_rows is for --complete: give the images to complete.")
    # everything the user gave is checked against the config before the weights are loaded
    config = load_image_config(args.checkpoint, args.trust_remote_code)
    height, width = config.image_size
    if args.complete is not None:
        keep_rows = args.keep_rows if args.keep_rows is not None else height // 2
        if keep_rows >= height:
            raise UsageError(
                f"--keep_rows must be below the images' height ({height} rows; {height - 1} keeps all but one), "
                f"got {keep_rows}."
            )
        try:
            originals = read_images(args.complete, config, num_images=args.num_images)
        except FileNotFoundError as error:  # Fashion-MNIST not installed: the message names the apt package
            raise UsageError(str(error)) from error
        except ValueError as error:
            raise UsageError(f"--complete: {error}") from error
    model = load_image_model(args.checkpoint, args.device, args.trust_remote_code)
    options = dict(
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        batch_size=args.batch_size,
        cache_implementation="static" if args.compile else None,
    )
    started = time.perf_counter()
    if args.complete is None:
        images = sample_images(model, args.num_images, **options)
        seconds = time.perf_counter() - started
        grid = image_grid(images, args.nrow, scale=args.scale)
        what = f"{images.shape[0]} samples"
    else:
        repeats = args.num_completions
        drawn = complete_images(model, originals.repeat_interleave(repeats, dim=0), keep_rows, **options)
        seconds = time.perf_counter() - started
        completions = drawn.reshape(originals.shape[0], repeats, *drawn.shape[1:])  # (N, K, C, H, W)
        nrow = min(args.nrow or 8, originals.shape[0])
        grid = image_grid(completion_tiles(originals, completions, keep_rows, nrow), nrow, scale=args.scale)
        what = f"{drawn.shape[0]} completions of {originals.shape[0]} images from their top {keep_rows} rows"
    output.parent.mkdir(parents=True, exist_ok=True)
    grid.save(output, format="PNG")
    print(f"{what} ({height}x{width}, {seconds:.1f} s) written to {output} ({grid.width}x{grid.height} pixels)")
    return 0
