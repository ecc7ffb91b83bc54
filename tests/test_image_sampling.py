"""Drawing and completing images (`hf_vit_plus.image_generation`) and `hf-vit-plus sample`: cached sampling equals
uncached sampling for a seed, seeds are reproducible and leave the caller's random state alone, completions keep
their top rows bit for bit, a temperature near 0 is greedy decoding, the grids have the size they announce, and bad
input is refused with a message naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM, SparseTransformerForImageGeneration
from hf_vit_plus.cli import main
from hf_vit_plus.image_generation import complete_images, image_grid, mask_rows, read_images, sample_images
from tests.utils import TINY_IMAGE_MODEL, random_pixels, tiny_image_model


# ---------------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("attention_type", ["dense", "strided", "fixed"])
def test_cached_sampling_equals_uncached_sampling(attention_type):
    model = tiny_image_model(attention_type)
    cached = sample_images(model, 5, seed=3, batch_size=4, use_cache=True)
    uncached = sample_images(model, 5, seed=3, batch_size=4, use_cache=False)
    assert cached.shape == (5, 1, 6, 5) and cached.dtype == torch.uint8
    assert torch.equal(cached, uncached)


@pytest.mark.slow  # compiles a decoding step (10-20 s on a CPU)
@pytest.mark.parametrize("attention_type", ["dense", "strided", "fixed"])
def test_compiled_static_cache_sampling_equals_dynamic_cache_sampling(attention_type):
    model = tiny_image_model(attention_type)
    static = sample_images(model, 3, seed=8, batch_size=4, cache_implementation="static")
    assert torch.equal(static, sample_images(model, 3, seed=8, batch_size=4))
    prompt_rows = complete_images(
        model, random_pixels(3, 1, 6, 5), 2, seed=8, batch_size=4, cache_implementation="static"
    )
    assert torch.equal(prompt_rows, complete_images(model, random_pixels(3, 1, 6, 5), 2, seed=8, batch_size=4))


def test_colour_images_are_drawn_with_their_channels():
    model = tiny_image_model("strided", 3, 4, 3)
    images = sample_images(model, 2, seed=0)
    assert images.shape == (2, 3, 3, 4) and images.dtype == torch.uint8
    assert torch.equal(images, sample_images(model, 2, seed=0, use_cache=False))


def test_a_seed_gives_the_same_images_and_another_seed_others():
    model = tiny_image_model("strided")
    first = sample_images(model, 4, seed=11)
    assert torch.equal(first, sample_images(model, 4, seed=11))
    assert not torch.equal(first, sample_images(model, 4, seed=12))
    assert not torch.equal(first[0], first[1])  # the rows of a batch are independent draws


def test_sampling_leaves_the_callers_random_state_alone():
    model = tiny_image_model("dense")
    torch.manual_seed(123)
    state = torch.get_rng_state()
    sample_images(model, 2, seed=5)
    complete_images(model, random_pixels(2, 1, 6, 5), 2, seed=5)
    assert torch.equal(torch.get_rng_state(), state)


def test_sampling_runs_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    config = SparseTransformerConfig.for_images(
        6, 5, attention_type="fixed", hidden_dropout_prob=0.5, **TINY_IMAGE_MODEL
    )
    model = SparseTransformerForImageGeneration(config).train()
    drawn_in_train_mode = sample_images(model, 3, seed=1)
    assert model.training
    assert torch.equal(drawn_in_train_mode, sample_images(model.eval(), 3, seed=1))  # no dropout while drawing


def test_the_last_short_batch_is_drawn_at_full_size():
    model = tiny_image_model("strided")
    five = sample_images(model, 5, seed=2, batch_size=4)
    eight = sample_images(model, 8, seed=2, batch_size=4)
    assert torch.equal(five, eight[:5])  # the second batch of four rows, of which one is kept


@pytest.mark.parametrize("attention_type", ["dense", "strided"])
def test_a_temperature_near_zero_is_greedy_decoding(attention_type):
    model = tiny_image_model(attention_type)
    start = torch.full((2, 1), model.config.bos_token_id)
    greedy = model.tokens_to_pixels(model.generate(input_ids=start, max_new_tokens=30, do_sample=False)[:, 1:])
    assert torch.equal(sample_images(model, 2, temperature=1e-5, seed=4), greedy)
    assert torch.equal(sample_images(model, 2, top_k=1, seed=9), greedy)


# -------------------------------------------------------------------------------------------------- completion
@pytest.mark.parametrize("attention_type", ["dense", "strided", "fixed"])
def test_completion_keeps_the_top_rows_and_draws_the_rest(attention_type):
    model = tiny_image_model(attention_type)
    originals = random_pixels(3, 1, 6, 5)
    completed = complete_images(model, originals, 2, seed=0)
    assert completed.shape == originals.shape and completed.dtype == torch.uint8
    assert torch.equal(completed[:, :, :2], originals[:, :, :2])  # bit for bit
    assert not torch.equal(completed[:, :, 2:], originals[:, :, 2:])
    uncached = complete_images(model, originals, 2, seed=0, use_cache=False)
    assert torch.equal(completed, uncached)
    # the prompt is the start token and the kept rows' tokens (greedy decoding makes the draw a function of it)
    prompt = torch.cat([torch.full((3, 1), 256), originals[:, 0, :2].reshape(3, 10).long()], dim=1)
    greedy = model.generate(input_ids=prompt, max_new_tokens=20, do_sample=False)
    assert torch.equal(complete_images(model, originals, 2, temperature=1e-5), model.tokens_to_pixels(greedy[:, 1:]))


def test_completion_from_no_rows_is_sampling_and_grey_images_may_omit_the_channel_axis():
    model = tiny_image_model("strided")
    originals = random_pixels(3, 1, 6, 5)
    assert torch.equal(complete_images(model, originals, 0, seed=6), sample_images(model, 3, seed=6))
    grey = complete_images(model, originals[:, 0], 4, seed=6)
    assert torch.equal(grey, complete_images(model, originals, 4, seed=6))


def test_completion_of_colour_images_keeps_every_channel_of_the_kept_rows():
    model = tiny_image_model("dense", 3, 4, 3)
    originals = random_pixels(2, 3, 3, 4)
    completed = complete_images(model, originals, 1, seed=0)
    assert torch.equal(completed[:, :, :1], originals[:, :, :1])


# ------------------------------------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: sample_images(m, 0), r"`num_images` must be a positive integer, got 0"),
        (lambda m: sample_images(m, 2, temperature=0.0), r"`temperature` must be > 0, got 0.0"),
        (lambda m: sample_images(m, 2, temperature=-1), r"`temperature` must be > 0, got -1"),
        (lambda m: sample_images(m, 2, temperature=float("nan")), r"finite positive number, got nan"),
        (lambda m: sample_images(m, 2, top_k=0), r"`top_k` must be a positive integer, got 0"),
        (lambda m: sample_images(m, 2, seed=-1), r"`seed` must be a non-negative integer, got -1"),
        (lambda m: sample_images(m, 2, batch_size=0), r"`batch_size` must be a positive integer, got 0"),
        (
            lambda m: complete_images(m, random_pixels(1, 1, 6, 5), 6),
            r"`keep_rows` must be an integer in \[0, 6\).*got 6",
        ),
        (lambda m: complete_images(m, random_pixels(1, 1, 6, 5), -1), r"in \[0, 6\).*got -1"),
        (lambda m: complete_images(m, random_pixels(1, 1, 6, 5), 2, temperature=0), r"`temperature` must be > 0"),
        (lambda m: complete_images(m, random_pixels(1, 1, 5, 6), 2), r"\(batch, 1, 6, 5\)"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny_image_model("dense"))


def test_a_text_model_is_refused():
    text = SparseTransformerForCausalLM(SparseTransformerConfig(attention_type="dense", **TINY_IMAGE_MODEL))
    for call in (lambda: sample_images(text, 2), lambda: complete_images(text, random_pixels(1, 1, 6, 5), 2)):
        with pytest.raises(ValueError, match=r"SparseTransformerForCausalLM with SparseTransformerConfig "):
            call()
    with pytest.raises(ValueError, match="image_size=None"):
        read_images(["digits"], text.config)


# ------------------------------------------------------------------------------------------------------ grids
def test_image_grid_size_scale_and_placement():
    images = random_pixels(5, 1, 6, 5)
    grid = image_grid(images, nrow=3, pad=2, scale=4)
    assert grid.mode == "L" and grid.size == (3 * 20 + 4 * 2, 2 * 24 + 3 * 2)  # (width, height)
    array = np.asarray(grid)
    tile = array[2 + 24 + 2 : 2 + 24 + 2 + 24, 2 + 20 + 2 : 2 + 20 + 2 + 20]  # second row, second column: image 4
    assert np.array_equal(tile[::4, ::4], images[4, 0].numpy())
    assert image_grid(images).size == (3 * 80 + 4 * 2, 2 * 96 + 3 * 2)  # 6 x 5 at 16x: the long side >= 96
    colour = image_grid(random_pixels(2, 3, 28, 28))
    assert colour.mode == "RGB" and colour.size == (2 * 112 + 3 * 2, 112 + 2 * 2)  # 28 x 28 drawn at 4x


def test_image_grid_refuses_what_it_cannot_draw():
    with pytest.raises(TypeError, match="uint8"):
        image_grid(torch.zeros(2, 1, 4, 4))
    with pytest.raises(ValueError, match=r"C = 1 or 3, got \(2, 2, 4, 4\)"):
        image_grid(torch.zeros(2, 2, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="`nrow` must be a positive integer, got 0"):
        image_grid(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), nrow=0)


def test_mask_rows_greys_the_rows_to_draw():
    images = random_pixels(2, 1, 6, 5)
    masked = mask_rows(images, 2)
    assert torch.equal(masked[:, :, :2], images[:, :, :2]) and (masked[:, :, 2:] == 128).all()


# -------------------------------------------------------------------------------------------- images to complete
def test_read_images_from_files_and_the_digits(tmp_path):
    config = tiny_image_model("dense", 8, 8).config
    grey = random_pixels(1, 1, 8, 8)[0, 0].numpy()
    Image.fromarray(grey, mode="L").save(tmp_path / "grey.png")
    rgb = np.stack([grey, grey, grey], axis=-1)
    Image.fromarray(rgb, mode="RGB").save(tmp_path / "rgb.png")
    images = read_images([tmp_path / "grey.png", str(tmp_path / "rgb.png"), "digits"], config, num_images=3)
    assert images.shape == (5, 1, 8, 8) and images.dtype == torch.uint8
    assert torch.equal(images[0, 0], torch.from_numpy(grey)) and torch.equal(images[1, 0], torch.from_numpy(grey))
    from hf_vit_plus.data.digits import load_digits_dataset

    first = np.asarray(load_digits_dataset()["test"][0]["image"])
    assert torch.equal(images[2, 0], torch.from_numpy(first.copy()))
    colour = read_images([tmp_path / "grey.png"], tiny_image_model("dense", 8, 8, 3).config)
    assert colour.shape == (1, 3, 8, 8) and all(torch.equal(colour[0, c], images[0, 0]) for c in range(3))


def test_read_images_names_what_it_cannot_use(tmp_path):
    config = tiny_image_model("dense", 6, 5).config
    Image.fromarray(np.zeros((7, 9), dtype=np.uint8)).save(tmp_path / "big.png")
    (tmp_path / "notes.txt").write_text("not an image")
    big = str(tmp_path / "big.png")
    with pytest.raises(ValueError, match=rf"'{big}' is 7 x 9 pixels .* image_size is 6 x 5"):
        read_images([big], config)
    with pytest.raises(ValueError, match="The 'digits' images are 8 x 8 pixels but the model's image_size is 6 x 5"):
        read_images(["digits"], config)
    with pytest.raises(ValueError, match="'cifar' is neither an image file nor a built-in data set"):
        read_images(["cifar"], config)
    with pytest.raises(ValueError, match="Cannot read .*notes.txt"):
        read_images([tmp_path / "notes.txt"], config)
    with pytest.raises(ValueError, match="is not a file"):
        read_images([tmp_path], config)


def test_read_images_from_fashion_mnist():
    from hf_vit_plus.data.fashion_mnist import FASHION_MNIST_DIR, load_fashion_mnist_arrays

    if not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST is not installed in {FASHION_MNIST_DIR}")
    config = SparseTransformerConfig.for_images(28, 28, **TINY_IMAGE_MODEL)
    images = read_images(["fashion-mnist"], config, num_images=3)
    assert torch.equal(images[:, 0], torch.from_numpy(load_fashion_mnist_arrays("test")[0][:3].copy()))


# ---------------------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def image_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("image_model")
    tiny_image_model("strided", 8, 8).save_pretrained(folder)
    return folder


def _run(argv, capsys):
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def test_cli_writes_a_grid_of_samples(image_checkpoint, tmp_path, capsys):
    output = tmp_path / "grid.png"
    argv = ["sample", str(image_checkpoint), "--num_images", "4", "--output", str(output), "--temperature", "0.9",
            "--top_k", "20", "--seed", "3", "--batch_size", "2"]  # fmt: skip
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    grid = Image.open(output)
    assert grid.format == "PNG" and grid.size == (2 * 96 + 3 * 2, 2 * 96 + 3 * 2)  # 2 x 2 images of 8 x 8 at 12x
    assert "4 samples" in out and str(output) in out
    model = SparseTransformerForImageGeneration.from_pretrained(image_checkpoint)
    expected = sample_images(model, 4, temperature=0.9, top_k=20, seed=3, batch_size=2)
    assert np.array_equal(np.asarray(grid), np.asarray(image_grid(expected, 2)))


def test_cli_completes_an_image_file_and_the_digits(image_checkpoint, tmp_path, capsys):
    picture = random_pixels(1, 1, 8, 8, seed=5)[0, 0].numpy()
    Image.fromarray(picture, mode="L").save(tmp_path / "picture.png")
    output = tmp_path / "completions.png"
    argv = ["sample", str(image_checkpoint), "--complete", str(tmp_path / "picture.png"), "digits",
            "--num_images", "2", "--keep_rows", "3", "--num_completions", "2", "--output", str(output)]  # fmt: skip
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert "6 completions of 3 images from their top 3 rows" in out
    grid = np.asarray(Image.open(output))
    # 3 columns (the file, two digits) x 4 rows (originals, kept rows, 2 completions), 96-pixel tiles, 2-pixel pad
    assert grid.shape == (4 * 96 + 5 * 2, 3 * 96 + 4 * 2)

    def tile(row: int, column: int) -> np.ndarray:
        top, left = 2 + row * 98, 2 + column * 98
        return grid[top : top + 96 : 12, left : left + 96 : 12]  # back to 8 x 8

    assert np.array_equal(tile(0, 0), picture)
    assert np.array_equal(tile(1, 0)[:3], picture[:3]) and (tile(1, 0)[3:] == 128).all()
    for row in (2, 3):
        assert np.array_equal(tile(row, 0)[:3], picture[:3])
        assert np.array_equal(tile(row, 2)[:3], tile(0, 2)[:3])  # a digit's kept rows
    assert not np.array_equal(tile(2, 0)[3:], tile(3, 0)[3:])  # two different completions


def test_cli_compile_decodes_with_a_static_cache(image_checkpoint, tmp_path, capsys, monkeypatch):
    import hf_vit_plus.image_generation as image_generation

    calls = []

    def fake_sample(model, num_images, **options):
        calls.append(options)
        return torch.zeros(num_images, 1, 8, 8, dtype=torch.uint8)

    monkeypatch.setattr(image_generation, "sample_images", fake_sample)
    for flags in ([], ["--compile"]):
        code, _, err = _run(["sample", str(image_checkpoint), "--output", str(tmp_path / "x.png"), *flags], capsys)
        assert code == 0, err
    assert [options["cache_implementation"] for options in calls] == [None, "static"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--complete", "digits", "--keep_rows", "8"], "--keep_rows must be below the images' height (8 rows"),
        (["--keep_rows", "2"], "--keep_rows is for --complete"),
        (["--complete", "no-such-file.png"], "'no-such-file.png' is neither an image file nor a built-in data set"),
        (["--complete", "fashion-mnist"], "'fashion-mnist' images are 28 x 28 pixels but the model's image_size is"),
        (["--temperature", "0"], "argument --temperature: expected a positive number, got '0'"),
        (["--num_images", "0"], "argument --num_images: expected a positive integer, got '0'"),
        (["--top_k", "-3"], "argument --top_k: expected a positive integer, got '-3'"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(image_checkpoint, tmp_path, capsys, extra, message):
    code, _, err = _run(["sample", str(image_checkpoint), "--output", str(tmp_path / "x.png"), *extra], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hf-vit-plus sample: error: ") and message in err[0], err
    assert not (tmp_path / "x.png").exists()


def test_cli_refuses_a_file_of_the_wrong_size_and_a_text_model(tmp_path, capsys, image_checkpoint):
    Image.fromarray(np.zeros((28, 28), dtype=np.uint8)).save(tmp_path / "big.png")
    code, _, err = _run(["sample", str(image_checkpoint), "--complete", str(tmp_path / "big.png")], capsys)
    assert code == 2 and len(err) == 1 and "is 28 x 28 pixels" in err[0] and "image_size is 8 x 8" in err[0], err
    text = SparseTransformerForCausalLM(SparseTransformerConfig(attention_type="dense", **TINY_IMAGE_MODEL))
    text.save_pretrained(tmp_path / "lm")
    code, _, err = _run(["sample", str(tmp_path / "lm"), "--output", str(tmp_path / "x.png")], capsys)
    assert code == 2 and len(err) == 1 and "is not an image model (SparseTransformerConfig" in err[0], err
    code, _, err = _run(["sample", str(tmp_path / "missing"), "--output", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "does not exist" in err[0], err
    code, _, err = _run(["sample", str(image_checkpoint), "--output", str(tmp_path)], capsys)
    assert code == 2 and "is a folder" in err[0], err
