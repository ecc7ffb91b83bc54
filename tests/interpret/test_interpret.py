"""Tests of `hf_vit_plus.interpret`: every number checked against a case whose answer is known by construction,
plus a small ViT trained on the digits whose rollout must fall on the ink, and the `explain` CLI's PNGs."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor
from hf_vit_plus.cli import main as cli_main
from hf_vit_plus.interpret import (
    attention_pattern,
    attention_rollout,
    class_token_attention,
    class_token_rollout,
    collect_attentions,
    mean_attention_distance,
    patch_embedding_components,
    pattern_from_config,
    position_embedding_similarity,
    prefix_attention_fraction,
    prepare_images,
    vit_embedding_parts,
    write_vit_figures,
)
from hf_vit_plus.interpret.plots import DPI, PANEL_INCHES
from hf_vit_plus.models.sparse_layouts import ATTENTION_TYPES
from tests.utils import open_png

# ------------------------------------------------------------------------------------------------------- rollout


def test_rollout_of_identity_attention_is_identity():
    tokens = 17
    layers = [torch.eye(tokens).expand(2, 3, tokens, tokens) for _ in range(4)]  # (B, H, T, T)
    rollout = attention_rollout(layers)
    assert rollout.shape == (2, tokens, tokens)
    torch.testing.assert_close(rollout, torch.eye(tokens).expand(2, tokens, tokens))


def test_rollout_of_uniform_attention_is_uniform():
    tokens, num_layers = 10, 3
    uniform = torch.full((1, 4, tokens, tokens), 1.0 / tokens)
    # Without the residual identity, uniform attention stays uniform.
    torch.testing.assert_close(attention_rollout([uniform] * num_layers, residual_weight=0.0)[0], uniform[0, 0])
    # With it, (I/2 + U/2)^L = I/2^L + (1 - 1/2^L) U because U^2 = U (U: the uniform matrix).
    expected = torch.eye(tokens) / 2**num_layers + (1 - 1 / 2**num_layers) * uniform[0, 0]
    torch.testing.assert_close(attention_rollout([uniform] * num_layers)[0], expected)


def test_rollout_multiplies_later_layers_on_the_left():
    # Two permutations that do not commute: the rollout must be P2 @ P1 (layer 2 reads layer 1's output).
    p1 = torch.eye(4)[[1, 2, 3, 0]]
    p2 = torch.eye(4)[[0, 2, 1, 3]]
    rollout = attention_rollout([p1[None, None], p2[None, None]], residual_weight=0.0)[0]
    torch.testing.assert_close(rollout, p2 @ p1)
    assert not torch.equal(p2 @ p1, p1 @ p2)
    rows = attention_rollout([torch.rand(2, 3, 4, 4).softmax(-1) for _ in range(5)]).sum(-1)
    torch.testing.assert_close(rows, torch.ones(2, 4))


def test_class_token_maps_read_row_zero_over_the_patch_grid():
    tokens = 1 + 6  # class token + a 2 x 3 grid
    attention = torch.zeros(1, 2, tokens, tokens)
    attention[0, 0, 0, 1 + 5] = 1.0  # head 0: class token -> patch (1, 2)
    attention[0, 1, 0, 1 + 1] = 1.0  # head 1: class token -> patch (0, 1)
    heads = class_token_attention([attention], grid_size=(2, 3))
    assert heads.shape == (1, 2, 2, 3)
    assert heads[0, 0, 1, 2] == 1.0 and heads[0, 1, 0, 1] == 1.0 and heads.sum() == 2.0
    rollout = attention_rollout([attention], residual_weight=0.0)
    maps = class_token_rollout(rollout, (2, 3))
    torch.testing.assert_close(maps[0], heads[0].mean(0))


def test_rollout_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout([torch.eye(3)[None, None]], head_fusion="median")
    with pytest.raises(ValueError, match="residual_weight"):
        attention_rollout([torch.eye(3)[None, None]], residual_weight=1.5)
    with pytest.raises(ValueError, match="Layer 1 has no attention weights"):
        attention_rollout([torch.eye(3)[None, None], None])
    with pytest.raises(ValueError, match="square grid"):
        class_token_rollout(torch.eye(7)[None], num_prefix_tokens=1)  # 6 patches, no grid_size


# ------------------------------------------------------------------------------------------- attention distance


def _offset_attention(grid: int, offsets: list[tuple[int, int]], class_share: float) -> torch.Tensor:
    """(1, H, 1 + N, 1 + N) attention: head h sends `class_share` to the class token and the rest to the patch at
    offsets[h] from the query, mirrored (-offset) where that would leave the grid; so every patch query of head h
    attends at exactly the distance |offsets[h]|."""
    n = grid * grid
    attention = torch.zeros(1, len(offsets), 1 + n, 1 + n)
    attention[:, :, 0, 0] = 1.0
    for h, (dr, dc) in enumerate(offsets):
        for r in range(grid):
            for c in range(grid):
                rr = r + dr if 0 <= r + dr < grid else r - dr
                cc = c + dc if 0 <= c + dc < grid else c - dc
                attention[0, h, 1 + r * grid + c, 0] = class_share
                attention[0, h, 1 + r * grid + c, 1 + rr * grid + cc] += 1.0 - class_share
    return attention


def test_mean_attention_distance_of_known_offsets():
    patch = 8
    offsets = [(0, 0), (0, 2), (1, 1), (2, 2)]
    layer = _offset_attention(grid=4, offsets=offsets, class_share=0.3)
    distances = mean_attention_distance([layer, layer], patch_size=patch)
    expected = torch.tensor([0.0, 2 * patch, math.sqrt(2) * patch, math.sqrt(8) * patch])
    assert distances.shape == (2, 4)
    torch.testing.assert_close(distances, expected.expand(2, 4))
    # The class token's share is reported apart: the distance is over the patches only.
    torch.testing.assert_close(prefix_attention_fraction([layer]), torch.full((1, 4), 0.3))


def test_mean_attention_distance_of_uniform_attention_is_the_mean_pairwise_distance():
    grid, patch = 3, 16
    tokens = 1 + grid * grid
    uniform = torch.full((2, 1, tokens, tokens), 1.0 / tokens)
    centres = torch.tensor([(r, c) for r in range(grid) for c in range(grid)], dtype=torch.float) * patch
    expected = torch.cdist(centres, centres).mean()
    torch.testing.assert_close(mean_attention_distance(uniform, patch)[0, 0], expected)
    with pytest.raises(ValueError, match="patch_size"):
        mean_attention_distance(uniform, 0)


# ------------------------------------------------------------------------------------------------- embeddings


def test_position_similarity_recovers_row_and_column_structure():
    rows, cols = 3, 4
    # Patch (r, c) = one-hot(row r) + one-hot(column c): cosine = ([r == r'] + [c == c']) / 2.
    basis = torch.eye(rows + cols + 5)
    patches = torch.stack([basis[r] + basis[rows + c] for r in range(rows) for c in range(cols)])
    table = torch.cat([torch.randn(1, basis.shape[1]), patches])[None]  # class token first
    similarity = position_embedding_similarity(table, grid_size=(rows, cols))
    r = torch.arange(rows).view(rows, 1, 1, 1)
    c = torch.arange(cols).view(1, cols, 1, 1)
    r2 = torch.arange(rows).view(1, 1, rows, 1)
    c2 = torch.arange(cols).view(1, 1, 1, cols)
    expected = ((r == r2).float() + (c == c2).float()) / 2
    torch.testing.assert_close(similarity, expected)


def test_patch_pca_recovers_known_components():
    torch.manual_seed(0)
    channels, patch, filters = 3, 4, 64
    dims = channels * patch * patch
    truth = torch.linalg.qr(torch.randn(dims, 4, dtype=torch.double))[0].T  # 4 orthonormal filters
    scales = torch.tensor([5.0, 3.0, 2.0, 1.0], dtype=torch.double)
    coefficients = torch.randn(filters, 4, dtype=torch.double)
    coefficients = torch.linalg.qr(coefficients - coefficients.mean(0))[0]  # centred, orthonormal columns
    mean_filter = torch.randn(dims, dtype=torch.double)
    weight = (coefficients * scales) @ truth + mean_filter  # (D, C*P*P)
    pca = patch_embedding_components(weight.reshape(filters, channels, patch, patch).float(), num_components=28)
    # Rank 4 after centring, but PCA can return up to min(D - 1, C*P*P) = 48 components.
    assert pca.components.shape == (28, channels, patch, patch)
    found = pca.components[:4].reshape(4, -1).double()
    cosines = (found * truth).sum(-1)
    torch.testing.assert_close(cosines.abs(), torch.ones(4, dtype=torch.double), atol=1e-5, rtol=0)
    # Sign convention: the largest-magnitude entry of every component is positive.
    peaks = found.gather(1, found.abs().argmax(1, keepdim=True))
    assert (peaks > 0).all()
    torch.testing.assert_close(
        pca.explained_variance_ratio[:4].double(), scales**2 / (scales**2).sum(), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(pca.mean_filter.reshape(-1).double(), mean_filter, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="num_components"):
        patch_embedding_components(weight.reshape(filters, channels, patch, patch).float(), num_components=0)


# ---------------------------------------------------------------------------------------------------- patterns


def test_strided_and_fixed_parts_match_the_paper():
    strided = attention_pattern("strided", 16, stride=4, causal=True)
    keys = {name: part[10].nonzero().flatten().tolist() for name, part in strided.parts.items()}
    assert keys == {"band": [6, 7, 8, 9, 10], "residue": [2, 6, 10]}
    fixed = attention_pattern("fixed", 16, stride=4, summary_size=1, causal=True)
    keys = {name: part[10].nonzero().flatten().tolist() for name, part in fixed.parts.items()}
    assert keys == {"block": [8, 9, 10], "summary": [3, 7]}
    both = attention_pattern("fixed", 16, stride=4, summary_size=1, causal=False)
    assert both.mask[10].nonzero().flatten().tolist() == [3, 7, 8, 9, 10, 11, 15]
    second = attention_pattern("fixed", 16, stride=4, summary_size=1, causal=True, summary_block=1)
    # Summary block 1 is column 2 of each block, here also in the query's own block (10 mod 4 = 2).
    assert second.parts["summary"][10].nonzero().flatten().tolist() == [2, 6, 10]
    # Codes: 1 = first part only, 2 = second only, 3 = both (offset 0 and l of the strided pattern).
    assert strided.part_codes()[10, [10, 9, 2, 11]].tolist() == [3, 1, 2, 0]
    assert attention_pattern("dense", 8, causal=True).density() == 1.0


@pytest.mark.parametrize("kind", ["strided", "fixed"])
@pytest.mark.parametrize("causal", [True, False])
def test_pattern_union_is_the_model_layout(kind, causal):
    from hf_vit_plus.models.sparse_layouts import SparsePattern

    fixed = kind == "fixed"
    reference = SparsePattern(kind, 6, 2 if fixed else 0, 2 if fixed else 1, causal).dense_mask(48, num_heads=2)
    for head in range(2):
        block = head if fixed else 0  # head h uses summary block h mod 2
        pattern = attention_pattern(kind, 48, 6, 2 if fixed else None, causal, block)
        assert torch.equal(pattern.mask, reference[head])


def test_pattern_from_config_and_bad_kinds():
    from hf_vit_plus.models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
    from hf_vit_plus.models.configuration_sparse_transformer import SparseTransformerConfig

    config = SparseTransformerConfig(
        attention_type="fixed", sparse_stride=8, sparse_summary_size=2, sparse_num_summary_blocks=2,
        max_position_embeddings=256,
    )  # fmt: skip
    pattern = pattern_from_config(config, head=1)
    assert (pattern.kind, pattern.length, pattern.stride, pattern.summary_block, pattern.causal) == (
        "fixed", 64, 8, 1, True,
    )  # fmt: skip
    assert pattern.parts["summary"][63].nonzero().flatten().tolist() == [
        4,
        5,
        12,
        13,
        20,
        21,
        28,
        29,
        36,
        37,
        44,
        45,
        52,
        53,
        60,
        61,
    ]
    with pytest.raises(ValueError, match="seq2seq_transformer"):
        pattern_from_config(Seq2SeqTransformerConfig(d_model=16, encoder_ffn_dim=16, decoder_ffn_dim=16))
    with pytest.raises(ValueError, match="Unknown attention pattern kind 'banded'"):
        attention_pattern("banded", 16, 4)
    with pytest.raises(ValueError, match="needs a stride"):
        attention_pattern("strided", 16)
    with pytest.raises(ValueError, match="does not fit"):
        attention_pattern("fixed", 16, stride=4, summary_size=3, summary_block=1)


# ------------------------------------------------------------------------------------------------ model inputs


def _tiny_vit(**kwargs) -> ViTPlusForImageClassification:
    torch.manual_seed(0)
    fields = dict(
        image_size=16, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=10,
    )  # fmt: skip
    fields.update(kwargs)
    return ViTPlusForImageClassification(ViTPlusConfig(**fields)).eval()


def test_prepare_images_converts_modes_and_sizes():
    model = _tiny_vit()
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 20, 3), dtype=np.uint8))
    pixel_values, display = prepare_images(model, [rgb, np.zeros((8, 8), dtype=np.uint8)])
    assert pixel_values.shape == (2, 1, 16, 16)
    assert display.shape == (2, 16, 16, 1) and display.min() >= 0 and display.max() <= 1
    with pytest.raises(ValueError, match=r"\(batch, 1, 16, 16\)"):
        prepare_images(model, torch.zeros(1, 3, 16, 16))
    with pytest.raises(ValueError, match="uint8"):
        prepare_images(model, np.full((8, 8), 7.0))


def test_collect_attentions_switches_a_weightless_kernel_to_eager(caplog):
    class WeightlessUnlessEager(nn.Module):
        """A foreign model whose fused kernel returns no weights."""

        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(_attn_implementation="sdpa", model_type="foreign")
            self.scale = nn.Parameter(torch.ones(()))

        def set_attn_implementation(self, name):
            self.config._attn_implementation = name

        def forward(self, pixel_values, output_attentions=False):
            eager = self.config._attn_implementation == "eager"
            weights = torch.full((1, 2, 5, 5), 0.2) if eager else None
            return SimpleNamespace(attentions=(weights, weights))

    model = WeightlessUnlessEager()
    with caplog.at_level(logging.INFO, logger="hf_vit_plus.interpret.attention"):
        attentions = collect_attentions(model, torch.zeros(1, 1, 4, 4))
    assert len(attentions) == 2 and attentions[0].shape == (1, 2, 5, 5)
    assert "'sdpa'" in caplog.text and "eager" in caplog.text
    assert model.config._attn_implementation == "sdpa"  # switched back

    class NeverWeights(WeightlessUnlessEager):
        def forward(self, pixel_values, output_attentions=False):
            return SimpleNamespace(attentions=None)

    with pytest.raises(ValueError, match=r"NeverWeights \(model_type='foreign'\) returned no attention weights"):
        collect_attentions(NeverWeights(), torch.zeros(1, 1, 4, 4))


def test_sdpa_vit_plus_and_transformers_vit_give_weights():
    model = _tiny_vit()
    model.set_attn_implementation("sdpa")
    attentions = collect_attentions(model, torch.randn(2, 1, 16, 16))
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 17, 17)
    torch.testing.assert_close(attentions[1].sum(-1), torch.ones(2, 4, 17))

    from transformers import ViTConfig, ViTModel

    foreign = ViTModel(
        ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=32),
        add_pooling_layer=False,
    )  # fmt: skip
    foreign.set_attn_implementation("sdpa")
    parts = vit_embedding_parts(foreign)
    assert (parts.patch_size, parts.grid_size, parts.num_prefix_tokens) == (4, (4, 4), 1)
    attentions = collect_attentions(foreign, torch.randn(1, 3, 16, 16))
    assert attentions[0].shape == (1, 2, 17, 17)


def test_non_vit_models_are_named():
    from hf_vit_plus.models.configuration_seq2seq_transformer import Seq2SeqTransformerConfig
    from hf_vit_plus.models.modeling_seq2seq_transformer import Seq2SeqTransformerModel

    config = Seq2SeqTransformerConfig(
        vocab_size=32, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16,
    )  # fmt: skip
    model = Seq2SeqTransformerModel(config)
    with pytest.raises(
        ValueError, match=r"Seq2SeqTransformerModel \(model_type='seq2seq_transformer'\) is not a Vision"
    ):
        vit_embedding_parts(model)
    with pytest.raises(ValueError, match="Seq2SeqTransformerModel"):
        write_vit_figures(model, [Image.new("L", (8, 8))], "unused")


# ------------------------------------------------------------------------------- a ViT trained on the digits


def _ink_border_ratio(rollout_maps: torch.Tensor, pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """Per image: mean rollout weight on patches with ink (mean ink > 0.25) over that on blank patches (< 0.02)."""
    ink = (pixel_values[:, 0] + 1) / 2  # the processor maps 0..255 to -1..1
    batch, height, width = ink.shape
    ink_per_patch = ink.reshape(batch, height // patch, patch, width // patch, patch).mean(dim=(2, 4))
    ratios = []
    for maps, inked in zip(rollout_maps, ink_per_patch):
        on, off = inked > 0.25, inked < 0.02
        if on.any() and off.any():
            ratios.append(maps[on].mean() / maps[off].mean())
    return torch.stack(ratios)


@pytest.fixture(scope="module")
def digits_vit(tmp_path_factory):
    """A 3-layer ViT trained for 300 steps on 16 x 16 digits (about 20 s on one core), saved with its processor."""
    from hf_vit_plus.data.digits import load_digits_dataset

    dataset = load_digits_dataset()
    model = _tiny_vit(hidden_size=48, num_hidden_layers=3, intermediate_size=96)
    processor = ViTPlusImageProcessor.from_model_config(model.config)
    train = processor(images=list(dataset["train"]["image"]), return_tensors="pt")["pixel_values"]
    labels = torch.tensor(dataset["train"]["label"])
    test_images = list(dataset["test"]["image"])
    test = processor(images=test_images, return_tensors="pt")["pixel_values"]
    untrained = collect_attentions(model, test)

    steps = 300
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = torch.randint(0, len(train), (64,), generator=generator)
        loss = model(pixel_values=train[batch], labels=labels[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(pixel_values=test).logits.argmax(-1) == torch.tensor(dataset["test"]["label"])).float()
    folder = tmp_path_factory.mktemp("digits_vit")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    image_paths = []
    for index in range(3):
        path = folder / f"digit{index}.png"
        test_images[index].save(path)
        image_paths.append(path)
    return SimpleNamespace(
        model=model, folder=folder, test=test, untrained=untrained, accuracy=accuracy.mean().item(),
        images=test_images, image_paths=image_paths,
    )  # fmt: skip


def test_trained_rollout_lies_on_the_ink(digits_vit):
    assert digits_vit.accuracy > 0.7, digits_vit.accuracy
    patch = digits_vit.model.config.patch_size
    maps = class_token_rollout(attention_rollout(collect_attentions(digits_vit.model, digits_vit.test)))
    ratios = _ink_border_ratio(maps, digits_vit.test, patch)
    untrained = _ink_border_ratio(class_token_rollout(attention_rollout(digits_vit.untrained)), digits_vit.test, patch)
    print(
        f"digits ViT: accuracy {digits_vit.accuracy:.3f}, ink/blank rollout ratio median {ratios.median():.2f} "
        f"(min {ratios.min():.2f}), untrained {untrained.median():.2f}"
    )
    # a trained model's rollout favours the ink clearly; an untrained one's is flat (ratio about 1)
    assert ratios.median() > 1.4, ratios.median()
    assert (ratios > 1).float().mean() > 0.9
    assert abs(untrained.median() - 1) < 0.2, untrained.median()


def test_write_vit_figures(digits_vit, tmp_path):
    paths = write_vit_figures(digits_vit.model, digits_vit.images[:5], tmp_path, max_images=2)
    names = [p.name for p in paths]
    assert names == [
        "attention_maps.png", "mean_attention_distance.png", "position_embedding_similarity.png",
        "patch_embedding_components.png",
    ]  # fmt: skip
    heads = digits_vit.model.config.num_attention_heads
    assert open_png(paths[0]).size == (round(PANEL_INCHES * (2 + heads) * DPI), round((PANEL_INCHES * 2 + 0.3) * DPI))
    assert open_png(paths[1]).size == (480, 360)
    assert open_png(paths[2]).size == (500, 440)
    open_png(paths[3])


def test_cli_writes_pngs(digits_vit, tmp_path, capsys):
    folder, images = str(digits_vit.folder), [str(p) for p in digits_vit.image_paths]
    heads = digits_vit.model.config.num_attention_heads

    assert cli_main(["explain", "rollout", folder, *images[:2], "--output", str(tmp_path / "r.png")]) == 0
    assert open_png(tmp_path / "r.png").size == (
        round(PANEL_INCHES * (2 + heads) * DPI),
        round((PANEL_INCHES * 2 + 0.3) * DPI),
    )
    assert cli_main(["explain", "distance", folder, "--output", str(tmp_path / "d.png"), "--num_random", "4"]) == 0
    assert "layer 3:" in capsys.readouterr().out
    assert open_png(tmp_path / "d.png").size == (480, 360)
    assert cli_main(["explain", "positions", folder, "--output", str(tmp_path / "p.png")]) == 0
    assert open_png(tmp_path / "p.png").mode == "RGBA"
    assert cli_main(["explain", "filters", folder, "--output", str(tmp_path / "f.png")]) == 0
    assert "16 components" in capsys.readouterr().out  # 48 filters in 1 * 4 * 4 = 16 dimensions
    args = [
        "explain",
        "pattern",
        "--kind",
        "all",
        "--stride",
        "4",
        "--length",
        "64",
        "--output",
        str(tmp_path / "s.png"),
    ]
    assert cli_main(args) == 0
    assert open_png(tmp_path / "s.png").size == (len(ATTENTION_TYPES) * 320, 700)  # one panel per registered kind
    assert cli_main(["explain", "all", folder, *images, "--output_dir", str(tmp_path / "all")]) == 0
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == [
        "attention_maps.png", "mean_attention_distance.png", "patch_embedding_components.png",
        "position_embedding_similarity.png",
    ]  # fmt: skip


def test_cli_errors_name_the_problem(digits_vit, tmp_path, capsys):
    # A dense ViT has no sparse pattern.
    assert cli_main(["explain", "pattern", str(digits_vit.folder), "--output", str(tmp_path / "x.png")]) == 2
    assert "model_type='vit_plus'" in capsys.readouterr().err
    assert cli_main(["explain", "pattern", "--kind", "strided", "--stride", "4", "--length", "5000"]) == 2
    assert "too long to draw" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
