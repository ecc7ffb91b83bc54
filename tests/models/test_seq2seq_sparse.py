"""The Sparse Transformer's attention (Child et al. 2019) as an option of the seq2seq Transformer's ENCODER:
config validation, the fast kernel against the reference kernel and against a dense model given the pattern as an
explicit mask (with right padding), gradients, generation, save/load and a remote-code load without the package."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.models.sparse_layouts import SparsePattern, pattern_from_config
from tests.utils import run_without_package

PAD, BOS, EOS = 0, 1, 2
VOCAB = 20
HEADS = 4
SRC_LEN = 23  # not a multiple of the stride: the kernels pad internally

# (type, mode, summary blocks): every kind and every way of combining the two parts.
PATTERNS = [
    ("strided", "merged", 1),
    ("fixed", "merged", 2),
    ("strided", "interleaved", 1),
    ("fixed", "heads", 1),
]


def tiny_config(**overrides) -> Seq2SeqTransformerConfig:
    fields = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        dropout=0.0,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
    )
    fields.update(overrides)
    return Seq2SeqTransformerConfig(**fields)


def sparse_config(kind: str = "fixed", mode: str = "merged", blocks: int = 1, **overrides):
    return tiny_config(
        encoder_attention_type=kind,
        encoder_sparse_stride=4,
        encoder_sparse_summary_size=1 if kind == "fixed" else 0,
        encoder_sparse_num_summary_blocks=blocks,
        encoder_sparse_pattern_mode=mode,
        **overrides,
    )


def source_batch(seed: int = 0, batch: int = 3, src_len: int = SRC_LEN):
    """Random source ids with right padding in the later rows, and the mask (1 = real token)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (batch, src_len), generator=gen)
    mask = torch.ones_like(src)
    for row in range(1, batch):
        mask[row, src_len - 5 * row :] = 0
    return src.masked_fill(mask == 0, PAD), mask


def make_model(config, seed: int = 0):
    torch.manual_seed(seed)
    return Seq2SeqTransformerForConditionalGeneration(config).eval()


def encode(model, src, mask, implementation=None):
    if implementation is not None:
        model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model.get_encoder()(src, attention_mask=mask).last_hidden_state


def layer_mask(pattern: SparsePattern, mode: str, layer: int, n: int, heads: int) -> torch.Tensor:
    """(H, n, n) boolean mask of one encoder layer, built from the pattern's dense masks."""
    merged = pattern.dense_mask(n, heads)
    parts = pattern.head_parts(mode, layer, heads)
    return torch.stack([merged[h] if p is None else pattern.part_mask(p, n, heads)[h] for h, p in enumerate(parts)])


# ----------------------------------------------------------------------------------------------------------- config
def test_default_is_the_dense_paper_encoder():
    config = tiny_config()
    assert config.encoder_attention_type == "dense"
    assert pattern_from_config(config) is None
    model = Seq2SeqTransformerForConditionalGeneration(config)
    assert all(layer.self_attn.sparse_pattern is None for layer in model.model.encoder.layers)


def test_only_the_encoder_self_attention_is_sparse():
    model = make_model(sparse_config("fixed", "heads", blocks=2))
    pattern = pattern_from_config(model.config)
    assert pattern == SparsePattern("fixed", 4, 1, 2, causal=False, mode="heads")
    for layer in model.model.encoder.layers:
        assert layer.self_attn.sparse_pattern == pattern
    for layer in model.model.decoder.layers:
        assert layer.self_attn.sparse_pattern is None and layer.encoder_attn.sparse_pattern is None


def test_bad_values_raise_value_errors_naming_them():
    with pytest.raises(ValueError, match=r"Unknown `encoder_attention_type` 'sliding'"):
        tiny_config(encoder_attention_type="sliding")
    with pytest.raises(ValueError, match=r"Unknown `encoder_sparse_pattern_mode` 'mixed'"):
        tiny_config(encoder_attention_type="strided", encoder_sparse_pattern_mode="mixed")
    with pytest.raises(ValueError, match=r"`encoder_sparse_stride` must be a positive integer, got 0"):
        tiny_config(encoder_attention_type="strided", encoder_sparse_stride=0)
    with pytest.raises(ValueError, match=r"`encoder_sparse_stride` must be a positive integer, got -3"):
        tiny_config(encoder_attention_type="strided", encoder_sparse_stride=-3)
    with pytest.raises(ValueError, match=r"`encoder_sparse_stride` \(64\).*`max_position_embeddings` \(32\)"):
        tiny_config(encoder_attention_type="strided", encoder_sparse_stride=64)
    with pytest.raises(ValueError, match=r"`encoder_sparse_summary_size`=0 and `encoder_sparse_stride`=4"):
        tiny_config(encoder_attention_type="fixed", encoder_sparse_stride=4, encoder_sparse_summary_size=0)
    with pytest.raises(ValueError, match=r"`encoder_sparse_summary_size`=5 and `encoder_sparse_stride`=4"):
        tiny_config(encoder_attention_type="fixed", encoder_sparse_stride=4, encoder_sparse_summary_size=5)
    with pytest.raises(ValueError, match=r"\(3\) x `encoder_sparse_num_summary_blocks` \(2\) = 6"):
        tiny_config(
            encoder_attention_type="fixed",
            encoder_sparse_stride=4,
            encoder_sparse_summary_size=3,
            encoder_sparse_num_summary_blocks=2,
        )
    with pytest.raises(ValueError, match=r"'heads'.*`encoder_attention_heads` \(3\) must be divisible by 2"):
        tiny_config(
            d_model=24,
            encoder_attention_heads=3,
            encoder_attention_type="strided",
            encoder_sparse_pattern_mode="heads",
        )
    # A dense encoder does not range-check the sparse settings; an odd head count is fine outside "heads" mode.
    tiny_config(encoder_sparse_stride=64)
    tiny_config(d_model=24, encoder_attention_heads=3, encoder_attention_type="strided")


# ------------------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("kind,mode,blocks", PATTERNS)
def test_sparse_encoder_matches_reference_kernel_and_explicit_mask(kind, mode, blocks):
    config = sparse_config(kind, mode, blocks)
    model = make_model(config)
    src, mask = source_batch()
    assert (mask == 0).any() and (mask[:, -1] == 0).any()  # right padding

    fast = encode(model, src, mask)  # default "sdpa": the sparse layers use the block kernel
    assert model.config._attn_implementation == "sdpa"
    reference = encode(model, src, mask, "sparse_dense")
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)

    # The same weights in a dense model, eager attention, each layer given the pattern as an explicit mask (and the
    # kernels' padding rule: padding keys are hidden from every query but themselves).
    dense = make_model(tiny_config(), seed=1)
    dense.load_state_dict(model.state_dict())
    dense.set_attn_implementation("eager")
    pattern = pattern_from_config(config)
    real_key = mask.bool()[:, None, None, :] | torch.eye(SRC_LEN, dtype=torch.bool)
    hooks = []
    for index, layer in enumerate(dense.model.encoder.layers):
        explicit = layer_mask(pattern, mode, index, SRC_LEN, HEADS)
        assert not explicit.all() and explicit.diagonal(dim1=-2, dim2=-1).all()

        def use_mask(module, args, kwargs, explicit=explicit):
            return args, {**kwargs, "attention_mask": explicit[None] & real_key}

        hooks.append(layer.self_attn.register_forward_pre_hook(use_mask, with_kwargs=True))
    try:
        masked = encode(dense, src, mask)
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(fast, masked, atol=1e-5, rtol=1e-5)
    # ... and the pattern matters: the plain dense encoder differs on the real tokens.
    plain = encode(dense, src, mask)
    assert (plain - fast)[mask.bool()].abs().max() > 1e-3

    # Right padding changes nothing for the real tokens (each row encoded alone, unpadded).
    for row in range(1, src.shape[0]):
        length = int(mask[row].sum())
        alone = encode(model, src[row : row + 1, :length], None, "sdpa")
        torch.testing.assert_close(alone[0], fast[row, :length], atol=1e-5, rtol=1e-5)


def test_encoder_attentions_follow_the_pattern():
    model = make_model(sparse_config("strided", "interleaved"))
    src, mask = source_batch()
    with torch.no_grad():
        out = model(
            input_ids=src, attention_mask=mask, decoder_input_ids=torch.full((3, 4), BOS), output_attentions=True
        )
    pattern = pattern_from_config(model.config)
    for index, weights in enumerate(out.encoder_attentions):
        allowed = layer_mask(pattern, "interleaved", index, SRC_LEN, HEADS)[None] & mask.bool()[:, None, None, :]
        rows = mask.bool()[:, None, :, None].expand_as(weights)  # real queries
        assert weights[rows & ~allowed].abs().max() == 0
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
    assert len(out.cross_attentions) == 2 and out.cross_attentions[0].shape[-1] == SRC_LEN


@pytest.mark.parametrize("kind", ["strided", "fixed"])
def test_gradients_are_finite_and_equal_between_block_and_reference_kernels(kind):
    model = make_model(sparse_config(kind, "merged", 2 if kind == "fixed" else 1)).train()
    src, mask = source_batch(seed=3)
    labels = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(4))

    def run(implementation):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    block_loss, block_grads = run("sparse_block")
    ref_loss, ref_grads = run("sparse_dense")
    torch.testing.assert_close(block_loss, ref_loss, atol=1e-5, rtol=1e-5)
    assert block_grads.keys() == ref_grads.keys()
    assert any(name.startswith("model.encoder.layers.0.self_attn.q_proj") for name in block_grads)
    for name, grad in block_grads.items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_dense_attentions_fall_back_to_sdpa_under_a_sparse_kernel_name():
    """With `_attn_implementation` naming a sparse kernel, the decoder and cross-attention (and a dense encoder)
    run on sdpa with masks built for sdpa: the logits equal eager's."""
    src, mask = source_batch()
    tgt = torch.randint(3, VOCAB, (3, 6), generator=torch.Generator().manual_seed(5))
    tgt_mask = torch.ones_like(tgt)
    tgt_mask[2, 4:] = 0
    for config in (tiny_config(), sparse_config("fixed", "merged")):
        model = make_model(config)
        logits = {}
        for implementation in ("sparse_dense", "sparse_block", "sdpa"):
            model.set_attn_implementation(implementation)
            with torch.no_grad():
                logits[implementation] = model(
                    input_ids=src, attention_mask=mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
                ).logits
        torch.testing.assert_close(logits["sparse_block"], logits["sparse_dense"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits["sdpa"], logits["sparse_dense"], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("kind,mode,blocks", [("fixed", "heads", 2), ("strided", "interleaved", 1)])
def test_generate_cached_equals_uncached(kind, mode, blocks):
    model = make_model(sparse_config(kind, mode, blocks))
    src, mask = source_batch(seed=7)
    settings = dict(max_new_tokens=10, min_new_tokens=10, num_beams=1, do_sample=False)
    cached = model.generate(src, attention_mask=mask, use_cache=True, **settings)
    uncached = model.generate(src, attention_mask=mask, use_cache=False, **settings)
    assert cached.shape == (3, 11) and torch.equal(cached, uncached)
    beams = model.generate(src, attention_mask=mask, max_new_tokens=6, num_beams=2)
    assert beams.shape[0] == 3
    # The first greedy token is the argmax of one forward pass with the sparse encoder.
    with torch.no_grad():
        first = model(input_ids=src, attention_mask=mask, decoder_input_ids=torch.full((3, 1), BOS)).logits
    assert torch.equal(cached[:, 1], first[:, -1].argmax(-1))


# ------------------------------------------------------------------------------------------------- save / load
def test_save_load_keeps_the_option(tmp_path):
    model = make_model(sparse_config("fixed", "heads", 2))
    src, mask = source_batch()
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"modeling_seq2seq_transformer.py", "sparse_attention.py", "sparse_layouts.py", "attention.py"} <= files
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["encoder_attention_type"] == "fixed" and saved["encoder_sparse_pattern_mode"] == "heads"
    assert (saved["encoder_sparse_stride"], saved["encoder_sparse_summary_size"]) == (4, 1)
    assert saved["encoder_sparse_num_summary_blocks"] == 2

    config = AutoConfig.from_pretrained(tmp_path)
    assert pattern_from_config(config) == pattern_from_config(model.config)
    assert config.encoder_sparse_pattern_mode == "heads"
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is Seq2SeqTransformerForConditionalGeneration
    assert loaded.model.encoder.layers[1].self_attn.sparse_pattern == SparsePattern("fixed", 4, 1, 2, False, "heads")
    tgt = torch.randint(3, VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
        got = loaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
    torch.testing.assert_close(got.encoder_last_hidden_state, expected.encoder_last_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(got.logits, expected.logits, atol=0, rtol=0)


def test_remote_code_load_without_the_package(tmp_path):
    model = make_model(sparse_config("strided", "interleaved"))
    src, mask = source_batch()
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    expected = encode(model, src, mask)
    expected_generated = model.generate(src, attention_mask=mask, max_new_tokens=6, num_beams=1, do_sample=False)
    code = f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM
        try:
            import hf_vit_plus  # noqa: F401
            blocked = False
        except ModuleNotFoundError:
            blocked = True
        model = AutoModelForSeq2SeqLM.from_pretrained({str(checkpoint)!r}, trust_remote_code=True).eval()
        src = torch.tensor({src.tolist()})
        mask = torch.tensor({mask.tolist()})
        with torch.no_grad():
            encoded = model.get_encoder()(src, attention_mask=mask).last_hidden_state
        generated = model.generate(src, attention_mask=mask, max_new_tokens=6, num_beams=1, do_sample=False)
        attn = model.model.encoder.layers[0].self_attn
        print(json.dumps({{
            "blocked": blocked,
            "module": type(model).__module__,
            "type": model.config.encoder_attention_type,
            "pattern": [attn.sparse_pattern.kind, attn.sparse_pattern.stride, attn.sparse_pattern.causal],
            "encoded": encoded.flatten().tolist(),
            "generated": generated.tolist(),
        }}))
    """
    result = run_without_package(code, cwd=tmp_path)
    assert result["blocked"] is True and not result["module"].startswith("hf_vit_plus")
    assert result["type"] == "strided" and result["pattern"] == ["strided", 4, False]
    torch.testing.assert_close(torch.tensor(result["encoded"]).view_as(expected), expected, atol=1e-6, rtol=1e-6)
    assert result["generated"] == expected_generated.tolist()
