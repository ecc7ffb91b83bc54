"""Where an image model's attention looks when it generates the next pixel (Sparse Transformer Fig. 2):
`next_pixel_attention` against the model's own pattern (shifted by the start token), its figure, and
`hf-vit-plus explain next-pixel`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM
from hf_vit_plus.cli import main as cli_main
from hf_vit_plus.interpret import NextPixelAttention, next_pixel_attention, plot_next_pixel_attention
from hf_vit_plus.interpret.image_attention import generated_mask
from hf_vit_plus.interpret.plots import DPI, PANEL_INCHES
from hf_vit_plus.models.sparse_layouts import pattern_from_config
from tests.utils import open_png, tiny_image_model

HEIGHT, WIDTH = 6, 5
TARGET = (3, 2)  # pixel index 17: the rows above and the row so far are both non-trivial


def image_model(
    attention_type: str,
    mode: str = "merged",
    height: int = HEIGHT,
    width: int = WIDTH,
    num_channels: int = 1,
    **overrides,
):
    return tiny_image_model(attention_type, height, width, num_channels, sparse_pattern_mode=mode, **overrides)


def random_image(height: int = HEIGHT, width: int = WIDTH, channels: int | None = None, seed: int = 1):
    shape = (height, width) if channels is None else (channels, height, width)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def allowed_pixels(model, position: int, layer: int, head: int) -> tuple[set[tuple[int, int]], bool]:
    """The pixels (row, col) and whether the start token that the model's pattern lets query `position` of `layer`
    and `head` see: key j >= 1 holds pixel j - 1, key 0 the start token (grey images)."""
    config = model.config
    pattern = pattern_from_config(config)
    keys = torch.arange(position + 1)
    if pattern is None:
        allowed = torch.ones(position + 1, dtype=torch.bool)
    else:
        part = pattern.head_parts(None, layer, config.num_attention_heads)[head]
        query = torch.tensor(position)
        allowed = pattern.allowed(query, keys, head) if part is None else pattern.part_allowed(part, query, keys, head)
    width = config.image_size[1]
    pixels = {divmod(int(j) - 1, width) for j in keys[allowed] if j >= 1}
    return pixels, bool(allowed[0])


def support(grid: torch.Tensor) -> set[tuple[int, int]]:
    return {(int(r), int(c)) for r, c in torch.nonzero(grid > 0)}


# --------------------------------------------------------------------------------------------------- the maps


@pytest.mark.parametrize(
    "attention_type, mode",
    [("dense", "merged"), ("strided", "merged"), ("strided", "interleaved"), ("strided", "heads"),
     ("fixed", "merged"), ("fixed", "interleaved"), ("fixed", "heads")],
)  # fmt: skip
def test_maps_sum_to_one_and_cover_exactly_the_pattern_shifted_by_the_start_token(attention_type, mode):
    model = image_model(attention_type, mode)
    image = random_image()
    for pixel in [(0, 0), (0, 3), (1, 0), TARGET, (HEIGHT - 1, WIDTH - 1)]:
        result = next_pixel_attention(model, image, pixel)
        assert isinstance(result, NextPixelAttention)
        assert result.maps.shape == (2, HEIGHT, WIDTH) and result.head_maps.shape == (2, 2, HEIGHT, WIDTH)
        assert result.position == pixel[0] * WIDTH + pixel[1]
        torch.testing.assert_close(result.maps.sum((1, 2)) + result.start_weights, torch.ones(2))
        torch.testing.assert_close(result.head_maps.sum((2, 3)) + result.head_start_weights, torch.ones(2, 2))
        torch.testing.assert_close(result.maps, result.head_maps.mean(1))
        for layer in range(2):
            for head in range(2):
                pixels, sees_start = allowed_pixels(model, result.position, layer, head)
                assert support(result.head_maps[layer, head]) == pixels, (pixel, layer, head)
                assert (result.head_start_weights[layer, head] > 0) == sees_start
            assert support(result.maps[layer]) == set().union(
                *(allowed_pixels(model, result.position, layer, h)[0] for h in range(2))
            )


def test_no_weight_at_or_after_the_target_and_later_pixels_change_nothing():
    model = image_model("dense")
    image = random_image()
    result = next_pixel_attention(model, image, TARGET)
    before = torch.from_numpy(generated_mask((HEIGHT, WIDTH), TARGET))
    assert int(before.sum()) == TARGET[0] * WIDTH + TARGET[1]
    assert not result.maps[:, ~before].any()
    assert (result.maps[:, before] > 0).all()  # dense: every earlier pixel gets some weight
    changed = image.clone()
    changed.view(-1)[TARGET[0] * WIDTH + TARGET[1] :] = 255 - changed.view(-1)[TARGET[0] * WIDTH + TARGET[1] :]
    torch.testing.assert_close(next_pixel_attention(model, changed, TARGET).maps, result.maps)
    first = next_pixel_attention(model, image, (0, 0))  # the first pixel sees only the start token
    assert not first.maps.any()
    torch.testing.assert_close(first.start_weights, torch.ones(2))


@pytest.mark.parametrize("attention_type, mode", [("dense", "merged"), ("strided", "interleaved")])
def test_maps_are_the_full_image_forward_row_of_the_query(attention_type, mode):
    # next_pixel_attention runs only the tokens up to the query (causal): the rows must be the whole image's.
    model = image_model(attention_type, mode)
    image = random_image()
    result = next_pixel_attention(model, image, TARGET)
    with torch.no_grad():
        attentions = model(pixel_values=image[None], output_attentions=True).attentions
    for layer, weights in enumerate(attentions):  # (1, heads, n, n)
        row = weights[0, :, result.position].mean(0)  # (n,)
        torch.testing.assert_close(result.start_weights[layer], row[0])
        torch.testing.assert_close(result.maps[layer].flatten()[: result.position], row[1 : result.position + 1])
        assert not row[result.position + 1 :].any()


def test_dense_weights_spread_over_all_earlier_pixels():
    result = next_pixel_attention(image_model("dense"), random_image(), TARGET)
    earlier = TARGET[0] * WIDTH + TARGET[1]
    for layer in range(2):
        assert support(result.maps[layer]) == {divmod(p, WIDTH) for p in range(earlier)}
        assert result.start_weights[layer] > 0
        # A random model looks almost uniformly: no pixel takes more than three times its uniform share.
        assert float(result.maps[layer].max()) < 3.0 / (earlier + 1)


def test_strided_picture_shows_the_row_and_the_column():
    # Query 17 holds pixel 16 (the start token shifts the sequence): its band {0 <= 17 - j <= 5} is the row so far
    # plus the end of the row above (the 6 pixels before the target), its residue {(17 - j) mod 5 = 0} the pixels
    # 1, 6, 11, 16: the column just left of the target in every earlier row.
    row_band = {(2, 1), (2, 2), (2, 3), (2, 4), (3, 0), (3, 1)}
    column = {(0, 1), (1, 1), (2, 1), (3, 1)}
    merged = next_pixel_attention(image_model("strided", "merged"), random_image(), TARGET)
    for layer in range(2):
        assert support(merged.maps[layer]) == row_band | column
    assert not merged.start_weights.any()  # key 0 is on neither part for this query
    interleaved = next_pixel_attention(image_model("strided", "interleaved"), random_image(), TARGET)
    assert support(interleaved.maps[0]) == row_band  # layer 1: the band part
    assert support(interleaved.maps[1]) == column  # layer 2: the residue part
    heads = next_pixel_attention(image_model("strided", "heads"), random_image(), TARGET)
    for layer in range(2):
        assert support(heads.head_maps[layer, 0]) == row_band
        assert support(heads.head_maps[layer, 1]) == column
        assert support(heads.maps[layer]) == row_band | column


def test_colour_pixels_sum_their_channels():
    model = image_model("dense", height=3, width=4, num_channels=3)
    image = random_image(3, 4, channels=3)
    result = next_pixel_attention(model, image, (1, 2), channel=2)
    assert result.position == (1 * 4 + 2) * 3 + 2
    torch.testing.assert_close(result.maps.sum((1, 2)) + result.start_weights, torch.ones(2))
    assert (result.maps[:, 1, 2] > 0).all()  # the target's own red and green are generated already
    assert not result.maps.view(2, -1)[:, 1 * 4 + 3 :].any()
    first_channel = next_pixel_attention(model, image, (1, 2), channel=0)
    assert not first_channel.maps[:, 1, 2].any()
    # Channels are summed: the weights on one pixel's three keys are added up.
    outputs = model(pixel_values=image[None], output_attentions=True)
    row = outputs.attentions[0][0, :, result.position].mean(0)  # (n,)
    torch.testing.assert_close(result.maps[0, 0, 1], row[1 + 3 : 1 + 6].sum())


def test_bad_inputs_name_the_value():
    model = image_model("strided")
    image = random_image()
    with pytest.raises(ValueError, match=r"row 6, col 0.*6 x 5"):
        next_pixel_attention(model, image, (6, 0))
    with pytest.raises(ValueError, match=r"row 0, col -1"):
        next_pixel_attention(model, image, (0, -1))
    with pytest.raises(ValueError, match=r"\(row, col\).*'3'"):
        next_pixel_attention(model, image, "3")
    with pytest.raises(ValueError, match=r"`channel`.*\[0, 1\).*got 1"):
        next_pixel_attention(model, image, TARGET, channel=1)
    with pytest.raises(ValueError, match=r"\(1, 6, 5\) or \(6, 5\).*got shape \(5, 5\)"):
        next_pixel_attention(model, random_image(5, 5), TARGET)
    with pytest.raises(ValueError, match=r"one image.*got shape \(2, 1, 6, 5\)"):
        next_pixel_attention(model, random_image(channels=1)[None].expand(2, -1, -1, -1), TARGET)
    with pytest.raises(TypeError, match="float32"):
        next_pixel_attention(model, image.float(), TARGET)
    with pytest.raises(ValueError, match="256"):
        next_pixel_attention(model, image.long() + 255, TARGET)
    text = SparseTransformerForCausalLM(
        SparseTransformerConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16, attention_type="dense")
    )  # fmt: skip
    with pytest.raises(ValueError, match="model_type='sparse_transformer'.*not an image generation model"):
        next_pixel_attention(text, image, TARGET)


# ---------------------------------------------------------------------------------------------------- the figure


def test_plot_draws_one_panel_per_layer(tmp_path):
    model = image_model("strided")
    image = random_image()
    result = next_pixel_attention(model, image, TARGET)
    path = plot_next_pixel_attention(result.maps, image, TARGET, tmp_path / "f" / "two.png", result.start_weights)
    drawn = open_png(path)
    assert drawn.size[0] == round(2 * PANEL_INCHES * DPI)  # two panels side by side
    one = plot_next_pixel_attention(result.maps, image, TARGET, tmp_path / "one.png", layers=[1])
    assert open_png(one).size[0] == round(PANEL_INCHES * DPI)
    deep = torch.rand(10, HEIGHT, WIDTH)  # a deeper model: rows of 8 panels
    grid = open_png(plot_next_pixel_attention(deep, image, TARGET, tmp_path / "deep.png"))
    assert grid.size[0] == round(8 * PANEL_INCHES * DPI) and grid.size[1] > 2 * PANEL_INCHES * DPI
    # The target pixel's centre is drawn in the colour of the pixels not generated yet, not the image's grey.
    pixels = np.asarray(drawn.convert("RGB")).astype(int)
    assert (np.abs(pixels - [140, 191, 242]).sum(-1) < 40).sum() > 100
    with pytest.raises(ValueError, match=r"`maps` must be \(layers, height, width\).*\(2, 5, 6\)"):
        plot_next_pixel_attention(result.maps.transpose(1, 2), image, TARGET, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"`layers` \[2\].*0\.\.1"):
        plot_next_pixel_attention(result.maps, image, TARGET, tmp_path / "x.png", layers=[2])
    with pytest.raises(ValueError, match="row 9"):
        plot_next_pixel_attention(result.maps, image, (9, 0), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def saved_digits_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("image_model")
    model = image_model("strided", height=8, width=8)
    model.save_pretrained(folder)
    image = Image.fromarray(random_image(8, 8).numpy(), mode="L")
    image.save(folder / "image.png")
    return folder


def test_cli_writes_the_figure_for_an_image_file_and_for_digits(saved_digits_model, tmp_path, capsys):
    folder = str(saved_digits_model)
    output = tmp_path / "from_file.png"
    args = ["explain", "next-pixel", folder, "--image", str(saved_digits_model / "image.png"), "--pixel", "3", "2"]
    assert cli_main([*args, "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "layer 1: start token" in printed and "layer 2:" in printed and f"wrote {output}" in printed
    assert open_png(output).size[0] == round(2 * PANEL_INCHES * DPI)
    output = tmp_path / "digits.png"
    args = ["explain", "next-pixel", folder, "--dataset", "digits", "--index", "5", "--layers", "2", "--head", "1"]
    assert cli_main([*args, "--output", str(output)]) == 0
    assert open_png(output).size[0] == round(PANEL_INCHES * DPI)
    assert "layer 1:" not in capsys.readouterr().out  # only the layer asked for


def test_cli_errors_name_the_problem(saved_digits_model, tmp_path, capsys):
    folder, image = str(saved_digits_model), str(saved_digits_model / "image.png")
    output = tmp_path / "x.png"
    base = ["explain", "next-pixel", folder, "--output", str(output)]
    assert cli_main([*base, "--image", image, "--pixel", "8", "0"]) == 2
    assert "row 8, col 0" in capsys.readouterr().err
    assert cli_main([*base, "--image", image, "--layers", "3"]) == 2
    assert "--layers [3]" in capsys.readouterr().err
    assert cli_main([*base, "--image", image, "--dataset", "digits"]) == 2
    assert "exactly one of --image, --dataset and --sample" in capsys.readouterr().err
    assert cli_main([*base, "--image", image, "--index", "3"]) == 2
    assert "--index and --split" in capsys.readouterr().err
    assert cli_main([*base, "--dataset", "digits", "--index", "100000"]) == 2
    assert "--index 100000" in capsys.readouterr().err
    small = tmp_path / "small.png"
    Image.new("L", (5, 6)).save(small)
    assert cli_main([*base, "--image", str(small)]) == 2
    assert "5 x 6 pixels" in capsys.readouterr().err
    grey_image_model = image_model("dense")  # 6 x 5: not the digits' size
    grey_image_model.save_pretrained(tmp_path / "six_by_five")
    assert cli_main(["explain", "next-pixel", str(tmp_path / "six_by_five"), "--dataset", "digits"]) == 2
    assert "8 x 8 grey images; the model takes 6 x 5" in capsys.readouterr().err
    text = tmp_path / "text"
    SparseTransformerForCausalLM(
        SparseTransformerConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16, attention_type="dense")
    ).save_pretrained(text)  # fmt: skip
    assert cli_main(["explain", "next-pixel", str(text), "--image", image]) == 2
    assert "model_type='sparse_transformer' without `image_size`" in capsys.readouterr().err
    assert cli_main(["explain", "rollout", folder, image, "--output", str(output)]) == 2  # the ViT figures
    assert "image Sparse Transformer (model_type='sparse_transformer'), not a ViT" in capsys.readouterr().err
    assert not output.exists()


def test_cli_draws_a_sample_of_the_model(saved_digits_model, tmp_path, capsys):
    output = tmp_path / "sample.png"
    assert cli_main(["explain", "next-pixel", str(saved_digits_model), "--sample", "--seed", "3", "--output",
                     str(output)]) == 0  # fmt: skip
    assert "layer 2: start token" in capsys.readouterr().out
    assert open_png(output).size[0] == round(2 * PANEL_INCHES * DPI)
    assert cli_main(["explain", "next-pixel", str(saved_digits_model), "--dataset", "digits", "--seed", "3"]) == 2
    assert "--seed applies to --sample only" in capsys.readouterr().err
