"""Drawing and completing images with a Sparse Transformer image model (sec. 7.1 of the paper), and grids of them.

An image model (`SparseTransformerForImageGeneration`, built from `SparseTransformerConfig.for_images`) reads an image
as its 8-bit intensities in raster order, channels interleaved. Drawing an image is `generate` from the start token,
exactly `pixels_per_image` new tokens; completing one is `generate` from the start token followed by the tokens of
its top rows, which come back unchanged.

    from hf_vit_plus.image_generation import complete_images, image_grid, read_images, sample_images

    samples = sample_images(model, 16, temperature=1.0, seed=0)  # (16, C, H, W) uint8
    image_grid(samples, nrow=4).save("samples.png")
    originals = read_images(["fashion-mnist"], model.config, num_images=8)
    completions = complete_images(model, originals, keep_rows=14, seed=0)

Both samplers seed their own draw (`seed`) inside `torch.random.fork_rng`, so the same seed gives the same images
and the caller's random state is left as it was. The images of a seed depend on `batch_size` (rows of one batch
share the random stream) but not on the cache: `use_cache=False` and `cache_implementation="static"` (compiled
decoding) draw the same images as the default dynamic cache, up to floating-point ties. Every batch is drawn at the
full `batch_size` (the last one cut afterwards), so that a compiled decoding step is traced once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers.generation import BaseStreamer

from .data.images import IMAGE_DATASETS, load_image_arrays
from .models.config_checks import check_positive_int
from .utils.logging import tqdm

logger = logging.getLogger(__name__)


def check_image_model(model, caller: str = "this function") -> None:
    """Raise a ValueError naming the class and config of `model` unless it is an image model (a model with
    `tokens_to_pixels` whose config has `image_size` set, i.e. `SparseTransformerForImageGeneration`)."""
    config = getattr(model, "config", None)
    if not getattr(config, "is_image_model", False) or not hasattr(model, "tokens_to_pixels"):
        config_name = type(config).__name__ if config is not None else "no config"
        detail = f"image_size={getattr(config, 'image_size', None)!r}" if config is not None else "no `config`"
        raise ValueError(
            f"{caller} needs an image model (SparseTransformerForImageGeneration with a config from "
            f"SparseTransformerConfig.for_images), got {type(model).__name__} with {config_name} ({detail})."
        )


def _check_sampling(temperature: float, top_k: int | None, seed: int, batch_size: int) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature):
        raise ValueError(f"`temperature` must be a finite positive number, got {temperature!r}.")
    if temperature <= 0:
        raise ValueError(
            f"`temperature` must be > 0, got {temperature!r} (a temperature close to 0, e.g. 1e-4, draws the most "
            "likely value of each pixel)."
        )
    if top_k is not None:
        check_positive_int("top_k", top_k)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`seed` must be a non-negative integer, got {seed!r}.")
    check_positive_int("batch_size", batch_size)


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed the default generators of the CPU and of `device` with `seed`, and restore their states on exit."""
    accelerated = device.type not in ("cpu", "meta")
    index = device.index
    if accelerated and index is None:
        index = getattr(torch, device.type).current_device()
    devices = [index] if accelerated else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if accelerated else "cuda"):
        torch.random.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        elif accelerated:
            getattr(torch, device.type).manual_seed(seed)
        yield


@contextmanager
def _eval_mode(model) -> Iterator[None]:
    """`model` in eval mode (no dropout) for the draw, back in its own mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class _TokenCounter(BaseStreamer):
    """A `generate` streamer that advances a progress bar by one per decoding step (generate hands it the prompt
    first, then each step's tokens)."""

    def __init__(self, bar):
        self.bar, self.prompt = bar, True

    def put(self, value) -> None:
        if self.prompt:
            self.prompt = False
            return
        self.bar.update(1)

    def end(self) -> None:
        self.prompt = True


def _draw(
    model,
    prompts: torch.Tensor,
    *,
    temperature: float,
    top_k: int | None,
    seed: int,
    batch_size: int,
    use_cache: bool,
    cache_implementation: str | None,
) -> torch.Tensor:
    """Complete each prompt (start token + known pixels, (N, p)) to a full image; (N, C, H, W) uint8 on the CPU."""
    num_pixels = model.config.pixels_per_image
    new_tokens = num_pixels + 1 - prompts.shape[1]
    options = dict(
        max_new_tokens=new_tokens,
        do_sample=True,
        temperature=float(temperature),
        top_k=top_k if top_k is not None else 0,  # 0: no top-k filtering (transformers' default would be 50)
        top_p=1.0,
        use_cache=use_cache,
    )
    if cache_implementation is not None:
        options["cache_implementation"] = cache_implementation
    batch_size = min(batch_size, prompts.shape[0])
    images = []
    batches = math.ceil(prompts.shape[0] / batch_size)
    bar = tqdm(total=batches * new_tokens, desc=f"drawing {prompts.shape[0]} image(s)", unit="token")
    if not bar.disable:  # the bar counts the tokens `generate` hands its streamer
        options["streamer"] = _TokenCounter(bar)
    with bar, _eval_mode(model), _seeded(seed, model.device):
        for start in range(0, prompts.shape[0], batch_size):
            batch = prompts[start : start + batch_size]
            count = batch.shape[0]
            if count < batch_size:  # the last batch at full size: one traced graph for compiled decoding
                batch = torch.cat([batch, batch[-1:].expand(batch_size - count, -1)])
            batch = batch.to(model.device)
            tokens = model.generate(
                input_ids=batch, attention_mask=torch.ones_like(batch), **options
            )  # (B, 1 + n): the start token and every pixel
            if tokens.shape[1] != num_pixels + 1:
                raise RuntimeError(f"generate returned {tokens.shape[1] - 1} pixels per image, expected {num_pixels}.")
            images.append(model.tokens_to_pixels(tokens[:count, 1:]).cpu())
    return torch.cat(images)


def sample_images(
    model,
    num_images: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    use_cache: bool = True,
    cache_implementation: str | None = None,
) -> torch.Tensor:
    """Draw `num_images` images from an image model: (num_images, C, H, W) uint8 on the CPU.

    Each image is `generate`d from the start token, one pixel (sub-pixel for colour) at a time in raster order,
    sampling from the model's distribution sharpened by `temperature` (< 1) and, with `top_k`, restricted to the
    `top_k` most likely values. `seed` makes the draw reproducible without touching the caller's random state;
    `batch_size` images are drawn at once. `use_cache=False` recomputes every step from scratch (slow; the same
    images); `cache_implementation="static"` decodes with a compiled step (see `hf_vit_plus.generation`)."""
    check_image_model(model, "sample_images")
    check_positive_int("num_images", num_images)
    _check_sampling(temperature, top_k, seed, batch_size)
    prompts = torch.full((num_images, 1), model.config.bos_token_id, dtype=torch.long)
    return _draw(
        model, prompts, temperature=temperature, top_k=top_k, seed=seed, batch_size=batch_size,
        use_cache=use_cache, cache_implementation=cache_implementation,
    )  # fmt: skip


def complete_images(
    model,
    pixels: torch.Tensor,
    keep_rows: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    use_cache: bool = True,
    cache_implementation: str | None = None,
) -> torch.Tensor:
    """Complete images from their top rows, as in the paper's figures: (N, C, H, W) uint8 on the CPU, whose first
    `keep_rows` rows are those of `pixels` (integer images (N, C, H, W), or (N, H, W) for grey ones, values 0..255)
    and whose other rows are drawn by the model given them. The prompt is the start token followed by the kept
    rows' tokens (width x channels per row). Repeat an image in `pixels` for several completions of it. The other
    arguments are those of `sample_images`; `keep_rows=0` draws whole images."""
    check_image_model(model, "complete_images")
    height, width = model.config.image_size
    if isinstance(keep_rows, bool) or not isinstance(keep_rows, int) or not 0 <= keep_rows < height:
        raise ValueError(
            f"`keep_rows` must be an integer in [0, {height}) for images of height {height} (the rows kept from "
            f"the top; the others are drawn), got {keep_rows!r}."
        )
    _check_sampling(temperature, top_k, seed, batch_size)
    tokens = model.pixels_to_tokens(pixels).cpu()  # (N, n): checks the dtype, shape and values
    kept = keep_rows * width * model.config.num_channels
    start = torch.full((tokens.shape[0], 1), model.config.bos_token_id, dtype=torch.long)
    prompts = torch.cat([start, tokens[:, :kept]], dim=1)  # (N, 1 + kept)
    return _draw(
        model, prompts, temperature=temperature, top_k=top_k, seed=seed, batch_size=batch_size,
        use_cache=use_cache, cache_implementation=cache_implementation,
    )  # fmt: skip


def mask_rows(images: torch.Tensor, keep_rows: int, fill: int = 128) -> torch.Tensor:
    """`images` (N, C, H, W) with every row from `keep_rows` on set to `fill` (grey): what a completion is given."""
    masked = images.clone()
    masked[:, :, keep_rows:] = fill
    return masked


def image_grid(
    images: torch.Tensor | Sequence[torch.Tensor],
    nrow: int | None = None,
    *,
    pad: int = 2,
    scale: int | None = None,
    pad_value: int = 255,
):
    """A PIL image of `images` (N, C, H, W) uint8 (C = 1 or 3), `nrow` per grid row (default: a square grid),
    each enlarged `scale` times with nearest-neighbour (default: the smallest factor making a side >= 96 pixels, so
    28 x 28 images are drawn at 112 x 112), separated by `pad` pixels of `pad_value`. The grid is
    nrow x (W * scale) + (nrow + 1) x pad pixels wide and rows x (H * scale) + (rows + 1) x pad high."""
    from PIL import Image

    if not torch.is_tensor(images):
        images = torch.stack(list(images)) if len(images) else torch.empty(0)
    if images.dim() != 4 or images.shape[0] == 0 or images.shape[1] not in (1, 3):
        raise ValueError(
            f"`images` must be a non-empty (N, C, H, W) tensor with C = 1 or 3, got {tuple(images.shape)}."
        )
    if images.dtype != torch.uint8:
        raise TypeError(f"`images` must be uint8 (0..255), got {images.dtype}.")
    count, channels, height, width = images.shape
    if nrow is None:
        nrow = math.ceil(math.sqrt(count))
    check_positive_int("nrow", nrow)
    if scale is None:
        scale = max(1, math.ceil(96 / max(height, width)))
    check_positive_int("scale", scale)
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"`pad` must be a non-negative integer, got {pad!r}.")
    nrow = min(nrow, count)
    rows = math.ceil(count / nrow)
    images = images.cpu().repeat_interleave(scale, dim=2).repeat_interleave(scale, dim=3)  # (N, C, H*s, W*s)
    tile_h, tile_w = height * scale, width * scale
    grid = torch.full(
        (channels, rows * tile_h + (rows + 1) * pad, nrow * tile_w + (nrow + 1) * pad), pad_value, dtype=torch.uint8
    )
    for index, image in enumerate(images):
        row, column = divmod(index, nrow)
        top, left = pad + row * (tile_h + pad), pad + column * (tile_w + pad)
        grid[:, top : top + tile_h, left : left + tile_w] = image
    array = grid.permute(1, 2, 0).numpy()  # (H, W, C)
    return Image.fromarray(array[..., 0], mode="L") if channels == 1 else Image.fromarray(array, mode="RGB")


def _to_tensor(pil_images, num_channels: int) -> torch.Tensor:
    """PIL images -> (N, C, H, W) uint8, converted to grey ("L") or colour ("RGB")."""
    import numpy as np

    mode = "L" if num_channels == 1 else "RGB"
    arrays = [np.asarray(image.convert(mode), dtype=np.uint8) for image in pil_images]
    stacked = torch.from_numpy(np.stack(arrays))
    return stacked[:, None] if num_channels == 1 else stacked.permute(0, 3, 1, 2).contiguous()


def _dataset_images(name: str, count: int):
    """The first `count` test images of a built-in data set, as PIL images (FileNotFoundError naming the apt package
    when Fashion-MNIST is missing)."""
    from PIL import Image

    return [Image.fromarray(array, mode="L") for array in load_image_arrays(name, "test")[:count]]


def read_images(sources: Sequence[str | Path], config, *, num_images: int = 16) -> torch.Tensor:
    """Images to complete, (N, C, H, W) uint8 with the channels of the model whose config is `config`: each source
    is an image file (read with PIL and converted to grey or RGB) or the name of a built-in data set
    (`data.images.IMAGE_DATASETS`: "digits", "fashion-mnist"), which contributes the first `num_images` images of its
    test split. A ValueError names a source that is neither, or whose images are not the model's `image_size`."""
    from PIL import Image, UnidentifiedImageError

    if not getattr(config, "is_image_model", False):
        raise ValueError(
            f"read_images needs an image model's config, got {type(config).__name__} with image_size=None."
        )
    if isinstance(sources, (str, Path)):
        sources = [sources]
    if not sources:
        raise ValueError("No images to read: give at least one image file or data set name.")
    check_positive_int("num_images", num_images)
    height, width = config.image_size
    batches = []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_file():
            try:
                with Image.open(path) as image:
                    image.load()
            except (UnidentifiedImageError, OSError) as error:
                raise ValueError(f"Cannot read {str(source)!r} as an image: {error}") from error
            if image.size != (width, height):
                raise ValueError(
                    f"{str(source)!r} is {image.size[1]} x {image.size[0]} pixels (height x width) but the model's "
                    f"image_size is {height} x {width}; resize or crop it first."
                )
            batches.append(_to_tensor([image], config.num_channels))
        elif str(source) in IMAGE_DATASETS:
            size = IMAGE_DATASETS[str(source)].image_size
            if tuple(size) != (height, width):
                raise ValueError(
                    f"The {source!r} images are {size[0]} x {size[1]} pixels but the model's image_size is "
                    f"{height} x {width}."
                )
            batches.append(_to_tensor(_dataset_images(str(source), num_images), config.num_channels))
        elif path.exists():
            raise ValueError(f"{str(source)!r} is not a file: expected an image file or a data set name.")
        else:
            raise ValueError(
                f"{str(source)!r} is neither an image file nor a built-in data set ({', '.join(IMAGE_DATASETS)})."
            )
    return torch.cat(batches)


__all__ = [
    "check_image_model",
    "complete_images",
    "image_grid",
    "mask_rows",
    "read_images",
    "sample_images",
]
