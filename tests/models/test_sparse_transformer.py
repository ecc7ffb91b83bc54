"""The Sparse Transformer family: config checks, the sparse kernels against the dense reference, the paper's
initialisation and activation checkpointing, save/load and remote code, cached generation, and learning on real
text (the standard library's sources, bits per byte against the unigram entropy)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM, SparseTransformerModel
from hf_vit_plus.data.text import BYTE_VOCAB_SIZE, byte_tokenizer, load_stdlib_text, random_windows, sequential_windows
from hf_vit_plus.models.compat import enable_activation_checkpointing, output_cache
from hf_vit_plus.models.sparse_layouts import allowed_key_indices
from tests.utils import run_without_package

CONTEXT = 64
PATTERNS = [
    ("strided", "interleaved"),
    ("strided", "merged"),
    ("strided", "heads"),
    ("fixed", "interleaved"),
    ("fixed", "merged"),
    ("fixed", "heads"),
]


def tiny_config(**overrides) -> SparseTransformerConfig:
    fields = dict(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=CONTEXT,
        attention_type="fixed",
        sparse_stride=8,
        sparse_summary_size=2,
        sparse_pattern_mode="merged",
    )
    fields.update(overrides)
    return SparseTransformerConfig(**fields)


def lm_config(attention_type: str = "fixed", mode: str = "merged", **overrides) -> SparseTransformerConfig:
    """The size trained by the learning test; other patterns reuse its weights (same parameter shapes)."""
    fields = dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        attention_type=attention_type,
        sparse_stride=16,
        sparse_summary_size=4,
        sparse_pattern_mode=mode,
    )
    fields.update(overrides)
    return tiny_config(**fields)


@pytest.fixture(scope="module")
def stdlib_text():
    return load_stdlib_text(max_train_bytes=2_000_000, max_heldout_bytes=200_000)


@pytest.fixture(scope="module")
def trained_lm(stdlib_text):
    return train_tiny_lm(stdlib_text)


def train_tiny_lm(stdlib_text) -> tuple[SparseTransformerForCausalLM, float]:
    """A tiny fixed-pattern byte LM trained for a few hundred steps (about a minute on one core)."""
    torch.manual_seed(0)
    model = SparseTransformerForCausalLM(lm_config())
    steps, batch_size, lr = 400, 16, 5e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    model.train()
    for _ in range(steps):
        batch = random_windows(stdlib_text["train"], CONTEXT, batch_size, generator)
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.eval()
    return model, time.perf_counter() - start


def with_pattern(model: SparseTransformerForCausalLM, attention_type: str, mode: str, **overrides):
    other = SparseTransformerForCausalLM(lm_config(attention_type, mode, **overrides)).eval()
    other.load_state_dict(model.state_dict())
    return other


# ------------------------------------------------------------------------------------------------------ config
def test_config_rejects_bad_values_naming_them():
    with pytest.raises(ValueError, match="'banded'"):
        tiny_config(attention_type="banded")
    with pytest.raises(ValueError, match="'stacked'"):
        tiny_config(sparse_pattern_mode="stacked")
    with pytest.raises(ValueError, match=r"`sparse_stride` \(100\).*`max_position_embeddings` \(64\)"):
        tiny_config(attention_type="strided", sparse_stride=100)
    with pytest.raises(ValueError, match=r"`num_attention_heads` \(3\)"):
        tiny_config(sparse_pattern_mode="heads", num_attention_heads=3, hidden_size=24)
    with pytest.raises(ValueError, match=r"\[4, 4, 3\] is 48.*64"):
        tiny_config(position_embedding_type="factorized", factorized_shape=[4, 4, 3])
    with pytest.raises(ValueError, match="= 12 summary positions"):
        tiny_config(sparse_summary_size=4, sparse_num_summary_blocks=3)
    with pytest.raises(ValueError, match=r"`hidden_size` \(30\).*\(4\)"):
        tiny_config(hidden_size=30)
    # Dense attention ignores the stride.
    assert tiny_config(attention_type="dense", sparse_stride=1000).sparse_stride == 1000


def test_sequence_longer_than_max_positions_raises_naming_both():
    model = SparseTransformerForCausalLM(tiny_config()).eval()
    with pytest.raises(ValueError, match=rf"{CONTEXT + 1} tokens.*\({CONTEXT}\)"):
        model(torch.ones(1, CONTEXT + 1, dtype=torch.long))
    # Through the cache: 60 cached tokens plus 10 new ones.
    out = model(torch.ones(1, 60, dtype=torch.long), use_cache=True)
    with pytest.raises(ValueError, match=rf"70 positions.*\({CONTEXT}\)"):
        model(torch.ones(1, 10, dtype=torch.long), cache=output_cache(out), use_cache=True)


# ------------------------------------------------------------------------------------------- attention kernels
@pytest.mark.parametrize("attention_type,mode", PATTERNS)
def test_sparse_kernel_matches_masked_dense_reference(attention_type, mode):
    torch.manual_seed(0)
    config = tiny_config(
        attention_type=attention_type,
        sparse_pattern_mode=mode,
        sparse_num_summary_blocks=2 if attention_type == "fixed" else 1,
    )
    model = SparseTransformerForCausalLM(config)
    ids = torch.randint(3, BYTE_VOCAB_SIZE, (2, 50))

    def run(implementation):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), [p.grad.clone() for p in model.parameters()]

    fast_logits, fast_grads = run("sdpa")  # the default routes sparse layers to the block kernel
    ref_logits, ref_grads = run("sparse_dense")
    torch.testing.assert_close(fast_logits, ref_logits, atol=1e-5, rtol=1e-5)
    for fast, ref in zip(fast_grads, ref_grads):
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)

    # Left padding: positions come from the mask, so real tokens get the same logits as without padding.
    padded = torch.cat([torch.zeros(2, 5, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(2, 5, dtype=torch.long), torch.ones_like(ids)], dim=1)
    mask[0, :5] = 1  # row 0: 5 real tokens of another text in front
    padded[0, :5] = 7
    with torch.no_grad():
        padded_logits = model(padded, attention_mask=mask).logits
    torch.testing.assert_close(padded_logits[1, 5:], ref_logits[1], atol=1e-5, rtol=1e-5)
    # Right padding goes to the sparse kernel as a 2-D mask; real tokens are unaffected.
    model.set_attn_implementation("sdpa")
    right = torch.cat([ids, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    right_mask = torch.cat([torch.ones_like(ids), torch.zeros(2, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        right_logits = model(right, attention_mask=right_mask).logits
    torch.testing.assert_close(right_logits[:, :50], ref_logits, atol=1e-5, rtol=1e-5)


def test_attention_follows_the_pattern():
    """One merged fixed layer: logits at position i move when a token in A_i changes, not when one outside does."""
    torch.manual_seed(0)
    model = SparseTransformerForCausalLM(tiny_config(num_hidden_layers=1)).eval()
    ids = torch.randint(3, BYTE_VOCAB_SIZE, (1, 40))
    query = 37  # block [32, 40); summary columns 6, 7 (mod 8)
    pattern = model.model.layers[0].self_attn.sparse_pattern
    seen = set(allowed_key_indices(pattern, query).tolist())
    assert seen == {6, 7, 14, 15, 22, 23, 30, 31, 32, 33, 34, 35, 36, 37}
    with torch.no_grad():
        base = model(ids).logits[0, query]
        for j in (3, 12, 33, 14, 7):
            changed = ids.clone()
            changed[0, j] = (changed[0, j] + 1 - 3) % 256 + 3
            moved = not torch.allclose(model(changed).logits[0, query], base, atol=1e-6)
            assert moved == (j in seen), j


def test_decoding_step_attends_only_to_allowed_cache_entries():
    torch.manual_seed(0)
    model = SparseTransformerForCausalLM(tiny_config(attention_type="strided", sparse_pattern_mode="heads")).eval()
    ids = torch.randint(3, BYTE_VOCAB_SIZE, (1, 30))
    with torch.no_grad():
        prefill = model(ids[:, :29], use_cache=True)
        step = model(ids[:, 29:], cache=output_cache(prefill), output_attentions=True)
        full = model(ids, output_attentions=True)
    attention = model.model.layers[0].self_attn
    for head, part in enumerate(attention.head_parts):
        allowed = allowed_key_indices(attention.sparse_pattern, 29, head=head, part_index=part)
        nonzero = step.attentions[0][0, head, 0].nonzero().flatten()
        assert nonzero.tolist() == allowed.tolist()
    torch.testing.assert_close(step.logits[0, -1], full.logits[0, -1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step.attentions[1][0, :, 0], full.attentions[1][0, :, -1], atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------- architecture (sec. 5 of the paper)
def test_residual_output_projections_start_with_std_scaled_by_sqrt_2n():
    torch.manual_seed(0)
    config = tiny_config(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=8)
    model = SparseTransformerModel(config)
    expected = config.initializer_range / math.sqrt(2 * config.num_hidden_layers)  # 0.005
    o_proj = torch.cat([layer.self_attn.o_proj.weight.flatten() for layer in model.layers])
    fc2 = torch.cat([layer.mlp.fc2.weight.flatten() for layer in model.layers])
    q_proj = torch.cat([layer.self_attn.q_proj.weight.flatten() for layer in model.layers])
    assert o_proj.std().item() == pytest.approx(expected, rel=0.03)
    assert fc2.std().item() == pytest.approx(expected, rel=0.03)
    assert q_proj.std().item() == pytest.approx(config.initializer_range, rel=0.03)


def test_factorized_position_embeddings_sum_one_table_per_axis():
    config = tiny_config(position_embedding_type="factorized", factorized_shape=[4, 4, 4])
    embeddings = SparseTransformerModel(config).embeddings
    assert [table.num_embeddings for table in embeddings.position_embeddings] == [4, 4, 4]
    position = torch.tensor([[1 * 16 + 2 * 4 + 3]])  # (row 1, column 2, channel 3)
    rows, cols, channels = embeddings.position_embeddings
    expected = rows.weight[1] + cols.weight[2] + channels.weight[3]
    torch.testing.assert_close(embeddings.embed_positions(position)[0, 0], expected)


def test_activation_checkpointing_recomputes_and_gives_the_same_gradients():
    torch.manual_seed(0)
    model = SparseTransformerForCausalLM(tiny_config(attention_type="strided")).train()
    ids = torch.randint(3, BYTE_VOCAB_SIZE, (2, 48))
    calls = []
    # a pre-hook: the recomputation stops early once it has rebuilt the saved tensors, before forward hooks run
    model.model.layers[0].self_attn.register_forward_pre_hook(lambda *args: calls.append(1))

    def grads():
        model.zero_grad()
        calls.clear()
        model(ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters()], len(calls)

    plain, plain_calls = grads()
    enable_activation_checkpointing(model)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    checkpointed, checkpointed_calls = grads()
    assert (plain_calls, checkpointed_calls) == (1, 2)  # the backward pass ran the block again
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_loss_is_shifted_cross_entropy_ignoring_minus_100():
    torch.manual_seed(0)
    model = SparseTransformerForCausalLM(tiny_config()).eval()
    ids = torch.randint(3, BYTE_VOCAB_SIZE, (2, 20))
    labels = ids.clone()
    labels[0, :5] = -100
    out = model(ids, labels=labels)
    logits = out.logits[:, :-1].reshape(-1, BYTE_VOCAB_SIZE)
    targets = labels[:, 1:].reshape(-1)
    keep = targets != -100
    expected = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(out.loss, expected)
    summed = model(ids, labels=labels, num_items_in_batch=torch.tensor(100)).loss
    torch.testing.assert_close(summed, expected * keep.sum() / 100)


# ----------------------------------------------------------------------------------------------- save and load
def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    config = tiny_config(position_embedding_type="factorized", factorized_shape=[4, 4, 4], attention_type="strided")
    model = SparseTransformerForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    files = {path.name for path in tmp_path.iterdir()}
    assert "model.safetensors" in files and not any(name.endswith(".bin") for name in files)
    assert {"configuration_sparse_transformer.py", "modeling_sparse_transformer.py"} <= files
    assert {"sparse_layouts.py", "sparse_attention.py", "attention.py"} <= files
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"]["AutoModelForCausalLM"] == "modeling_sparse_transformer.SparseTransformerForCausalLM"

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, SparseTransformerForCausalLM)
    assert AutoConfig.from_pretrained(tmp_path).factorized_shape == [4, 4, 4]
    assert loaded.lm_head.weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer("def f(x):\n    return x", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
        body = SparseTransformerModel.from_pretrained(tmp_path)(ids).last_hidden_state
        torch.testing.assert_close(body, model.model(ids).last_hidden_state)


def test_byte_tokenizer_matches_the_byte_ids_and_adds_no_end_of_document(tmp_path):
    """ByT5's tokenizer appended `</s>` (end of document) to every prompt; the saved tokenizer must not."""
    text = "def f(x):\n    return x  # é 漢字 🙂 \t\x00"
    byte_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer(text)["input_ids"]
    assert ids == [b + 3 for b in text.encode()]
    assert tokenizer.decode(ids) == text
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id, len(tokenizer)) == (0, 1, 2, 259)


def test_text_generation_pipeline_continues_the_prompt(tmp_path):
    """`pipeline("text-generation")` encodes with the tokenizer's defaults: it must give generate()'s continuation
    of the prompt itself (it continued "prompt + </s>" with ByT5's tokenizer)."""
    from transformers import pipeline

    torch.manual_seed(0)
    model = SparseTransformerForCausalLM(tiny_config(attention_type="strided")).eval()
    model.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    settings = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, suppress_tokens=[0, 1, 2])
    generator = pipeline("text-generation", model=str(tmp_path))
    text = generator("def f(x):", **settings)[0]["generated_text"]
    prompt = torch.tensor([[b + 3 for b in b"def f(x):"]])
    with torch.no_grad():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), **settings)[0]
    assert text == byte_tokenizer().decode(expected.tolist())
    assert text.startswith("def f(x):") and len(text.encode("utf-8", "replace")) > len("def f(x):")


# ------------------------------------------------------------------------------------------------- generation
def _generate(model, ids, mask, **kwargs):
    torch.manual_seed(1234)
    return model.generate(ids, attention_mask=mask, max_new_tokens=40, min_new_tokens=40, pad_token_id=0, **kwargs)


def _prompts():
    tokenizer = byte_tokenizer()
    tokenizer.padding_side = "left"
    batch = tokenizer(
        ["import os\n", "class Foo:\n    def __"],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    return batch["input_ids"], batch["attention_mask"]


@pytest.mark.parametrize("attention_type,mode", [("fixed", "merged"), ("strided", "interleaved"), ("fixed", "heads")])
def test_cached_generation_equals_uncached(trained_lm, attention_type, mode):
    model, _ = trained_lm
    extra = {"sparse_num_summary_blocks": 2} if mode == "heads" else {}
    model = with_pattern(model, attention_type, mode, **extra)
    ids, mask = _prompts()
    assert (mask == 0).any()  # the shorter prompt is left-padded
    for settings in (
        # A model this small loops on spaces, greedily and (with some seeds and releases) when sampling: n-gram
        # blocking keeps the output varied.
        {"do_sample": False, "no_repeat_ngram_size": 4},
        {"num_beams": 3, "num_return_sequences": 2, "do_sample": False, "no_repeat_ngram_size": 4},
        {"do_sample": True, "top_k": 20, "no_repeat_ngram_size": 4},
    ):
        cached = _generate(model, ids, mask, use_cache=True, **settings)
        uncached = _generate(model, ids, mask, use_cache=False, **settings)
        static = _generate(
            model, ids, mask, use_cache=True, cache_implementation="static", disable_compile=True, **settings
        )
        assert torch.equal(cached, uncached), settings
        assert torch.equal(cached, static), settings
        new_tokens = cached[:, ids.shape[1] :]
        assert all(len(set(row.tolist())) >= 5 for row in new_tokens), "degenerate output makes the check weak"

    # Left padding changes nothing: each prompt alone gives the same greedy continuation.
    batched = _generate(model, ids, mask, do_sample=False, no_repeat_ngram_size=4)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = _generate(model, ids[row : row + 1, real], None, do_sample=False, no_repeat_ngram_size=4)
        assert torch.equal(alone[0, -40:], batched[row, -40:])


# --------------------------------------------------------------------------------------------------- remote code
def test_remote_code_in_a_fresh_process_without_the_package(trained_lm, tmp_path):
    model, _ = trained_lm
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    byte_tokenizer().save_pretrained(checkpoint)
    ids, mask = _prompts()
    with torch.no_grad():
        expected_logits = model(ids, attention_mask=mask).logits
    expected_generated = _generate(model, ids, mask, do_sample=False, no_repeat_ngram_size=4)

    result = run_without_package(
        f"""
        import json
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        try:
            import hf_vit_plus  # noqa: F401
            blocked = False
        except ModuleNotFoundError:
            blocked = True
        path = {str(checkpoint)!r}
        refusals = 0
        for cls in (AutoConfig, AutoModelForCausalLM):
            try:
                cls.from_pretrained(path, trust_remote_code=False)
            except Exception:
                refusals += 1
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
        # AutoTokenizer reads config.json too, whose auto_map needs the same consent.
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        tokenizer.padding_side = "left"
        batch = tokenizer(
            ["import os\\n", "class Foo:\\n    def __"],
            add_special_tokens=False, padding=True, return_tensors="pt",
        )
        with torch.no_grad():
            logits = model(**batch).logits
        torch.manual_seed(1234)
        generated = model.generate(
            **batch, max_new_tokens=40, min_new_tokens=40, pad_token_id=0, do_sample=False, no_repeat_ngram_size=4
        )
        print(json.dumps({{
            "blocked": blocked,
            "refusals": refusals,
            "class": type(model).__name__,
            "module": type(model).__module__,
            "ids": batch["input_ids"].tolist(),
            "logits": logits.flatten().tolist(),
            "generated": generated.tolist(),
        }}))
        """,
        cwd=tmp_path,
    )
    assert result["blocked"] and result["refusals"] == 2
    assert result["class"] == "SparseTransformerForCausalLM"
    assert not result["module"].startswith("hf_vit_plus")
    assert result["ids"] == ids.tolist()
    torch.testing.assert_close(torch.tensor(result["logits"]), expected_logits.flatten(), atol=1e-5, rtol=1e-5)
    assert result["generated"] == expected_generated.tolist()


# ------------------------------------------------------------------------------------------------------ learning
def test_learns_standard_library_text_below_the_unigram_entropy(trained_lm, stdlib_text):
    model, seconds = trained_lm
    heldout = stdlib_text["heldout"]
    counts = np.bincount(heldout, minlength=BYTE_VOCAB_SIZE).astype(np.float64)
    probs = counts[counts > 0] / counts.sum()
    unigram_bits = float(-(probs * np.log2(probs)).sum())  # the best model that ignores context
    windows = sequential_windows(heldout, CONTEXT, max_windows=256)
    with torch.no_grad():
        bits_per_byte = model(windows, labels=windows).loss.item() / math.log(2)
    print(f"held-out {bits_per_byte:.3f} bits/byte vs unigram entropy {unigram_bits:.3f} ({seconds:.0f} s training)")
    assert 4.0 < unigram_bits < 5.5
    assert bits_per_byte < unigram_bits - 1.0
