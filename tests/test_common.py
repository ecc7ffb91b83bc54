"""The common model suite: every family, head and attention variant (tests/conftest.py `MODEL_CASES`) through the
entry points a transformers user takes, as transformers' `ModelTesterMixin` does for its own models.

Each test takes the `model_case` fixture (one tiny config per cell of the matrix) and skips where a check does not
apply (generation for the ViT, for instance). The README's "Entry points" matrix names the test of each cell.
"""

from __future__ import annotations

import collections
import copy
import json
import re

import pytest
import torch
import transformers
from transformers import AutoConfig

from hf_vit_plus.models.compat import enable_activation_checkpointing
from hf_vit_plus.models.configuration_sparse_transformer import PIXEL_LEVELS
from tests.conftest import MODEL_CASES, ModelCase
from tests.utils import TINY_VIT_OVERRIDES, run_without_package


def _logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _real_rows(case: ModelCase, inputs: dict, logits: torch.Tensor) -> torch.Tensor:
    """Logits of the positions that are real tokens: padded positions of an LM are not defined by the contract. An
    image model's logit of its start token is -inf by design (never drawn): compare the 256 intensities'."""
    if case.family == "sparse-lm":
        return logits[inputs["attention_mask"].bool()]
    if case.family == "image-lm":
        return logits[..., :PIXEL_LEVELS]
    return logits


# ------------------------------------------------------------------------------------------ save / load


@pytest.mark.parametrize("head", [True, False], ids=["head", "base"])
def test_save_and_auto_load_give_equal_outputs(model_case, head, tmp_path):
    model = model_case.model(head=head)
    inputs = model_case.inputs() if head else model_case.base_inputs()
    model.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" in files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl"))], files
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is model_case.config_class
    auto = getattr(transformers, model_case.auto_head if head else "AutoModel")
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    torch.testing.assert_close(_logits(loaded, inputs), _logits(model, inputs), rtol=0, atol=0)


def test_remote_code_loads_every_case_without_the_package_and_refuses_without_trust(tmp_path_factory):
    """One fresh process without hf_vit_plus loads every case's folder with trust_remote_code=True (same outputs) and
    refuses each without it."""
    root = tmp_path_factory.mktemp("remote")
    expected = {}
    for case in MODEL_CASES:
        model = case.model()
        folder = root / case.id
        model.save_pretrained(folder)
        inputs = case.inputs()
        torch.save(inputs, folder / "inputs.pt")
        expected[case.id] = _logits(model, inputs)
    code = f"""
        import json, torch, transformers
        results = {{}}
        for case_id, auto_name in {json.dumps({c.id: c.auto_head for c in MODEL_CASES})}.items():
            folder = {str(root)!r} + "/" + case_id
            auto = getattr(transformers, auto_name)
            try:
                auto.from_pretrained(folder)
                refused = False
            except ValueError as err:
                refused = "trust_remote_code" in str(err)
            model = auto.from_pretrained(folder, trust_remote_code=True).eval()
            inputs = torch.load(folder + "/inputs.pt", weights_only=True)
            with torch.no_grad():
                out = model(**inputs)
            torch.save(out.logits, folder + "/remote_logits.pt")
            results[case_id] = {{"refused": refused, "module": type(model).__module__}}
        print()  # the refusals leave transformers' unanswered prompt on the current line
        print(json.dumps(results))
        """
    results = run_without_package(code, cwd=root, timeout=600)
    for case in MODEL_CASES:
        assert results[case.id]["refused"], case.id
        assert not results[case.id]["module"].startswith("hf_vit_plus"), results[case.id]
        remote = torch.load(root / case.id / "remote_logits.pt", weights_only=True)
        torch.testing.assert_close(remote, expected[case.id], rtol=0, atol=0, msg=case.id)


def test_a_checkpoint_without_weights_reports_every_parameter_missing(model_case, tmp_path):
    """transformers' `test_model_weights_reload_no_missing_tied_weights`, for every class of the case: a folder whose
    weights file holds none of the model's tensors reloads with each parameter in `missing_keys` (none silently
    taken as loaded) and none named there that the model lacks, tied copies aside; and every parameter is
    initialised on the CPU. The seq2seq model's shared embedding was left out of the missing keys and on the meta
    device ("ignores keys {'shared.weight'} but they look like real parameters")."""
    from safetensors.torch import save_file

    classes = {model_case.base_class, *model_case.record.model_classes.values()}
    for model_class in sorted(classes, key=lambda cls: cls.__name__):
        folder = tmp_path / model_class.__name__
        torch.manual_seed(0)
        model_class(model_case.config()).save_pretrained(folder)
        save_file({"tensor": torch.tensor([1, 2])}, folder / "model.safetensors", metadata={"format": "pt"})
        reloaded, info = model_class.from_pretrained(folder, output_loading_info=True)
        tensors = dict(reloaded.named_parameters()) | dict(reloaded.named_buffers())
        missing = set(info["missing_keys"])
        # the names of one tensor (tied weights, a shared module): one of them missing stands for all
        aliases = collections.defaultdict(set)
        for name, tensor in reloaded.state_dict().items():
            aliases[tensor.untyped_storage().data_ptr()].add(name)
        extra = missing - tensors.keys()
        for group in (group for group in aliases.values() if len(group) > 1):
            if group - extra:
                extra -= group
        assert extra == set(), (model_class.__name__, extra)
        persistent = {name for name in tensors if name in reloaded.state_dict()}
        ignored = {
            name
            for name in persistent
            for pattern in reloaded._keys_to_ignore_on_load_missing or ()
            if re.search(pattern, name)
        }
        assert persistent - missing == ignored, f"{model_class.__name__} ignores {persistent - missing - ignored}"
        placed = {name: t.device.type for name, t in tensors.items() if t.device.type != "cpu"}
        assert not placed, (model_class.__name__, placed)


# ------------------------------------------------------------------------------------------ Auto classes from a config


def test_every_auto_class_builds_the_family_from_a_fresh_config(model_case):
    """What run_clm.py and every from-scratch script do: `AutoModelForX.from_config(Config(...))`, with and without
    `trust_remote_code`. The Sparse Transformer's AutoModelForCausalLM holds two classes (text and image) and a fresh
    config had `architectures=None`: transformers raised "TypeError: 'NoneType' object is not iterable"."""
    for auto_name, model_class in model_case.record.model_classes.items():
        for trust in (None, True):
            model = getattr(transformers, auto_name).from_config(model_case.config(), trust_remote_code=trust)
            assert type(model) is model_class, (auto_name, trust)


def test_a_saved_config_names_every_auto_class_and_carries_their_code(tmp_path_factory):
    """`Config(...).save_pretrained(dir)`, then, where the package is not installed, what transformers' example
    scripts do with `--config_name dir --trust_remote_code`: AutoConfig, then every Auto class's `from_config`. The
    folder had only `AutoConfig` in its auto_map and only the configuration's modules: "Unrecognized configuration
    class"."""
    root = tmp_path_factory.mktemp("configs")
    cases = {case.family: case for case in reversed(MODEL_CASES)}  # one case per family
    expected = {}
    for family, case in cases.items():
        case.config().save_pretrained(root / family)
        auto_map = json.loads((root / family / "config.json").read_text())["auto_map"]
        expected[family] = {name: cls.__name__ for name, cls in case.record.model_classes.items()}
        assert {"AutoConfig", *expected[family]} <= set(auto_map), auto_map
        for auto_name, class_name in expected[family].items():
            assert auto_map[auto_name].endswith(f".{class_name}")
            assert (root / family / (auto_map[auto_name].split(".")[0] + ".py")).is_file()
    code = f"""
        import json, transformers
        built = {{}}
        for family, autos in {json.dumps(expected)}.items():
            config = transformers.AutoConfig.from_pretrained({str(root)!r} + "/" + family, trust_remote_code=True)
            for auto_name in autos:
                model = getattr(transformers, auto_name).from_config(config, trust_remote_code=True)
                built[family + " " + auto_name] = [type(model).__name__, type(model).__module__]
        print(json.dumps(built))
        """
    built = run_without_package(code, cwd=root, timeout=300)
    for family, autos in expected.items():
        for auto_name, class_name in autos.items():
            name, module = built[f"{family} {auto_name}"]
            assert name == class_name and not module.startswith("hf_vit_plus"), (family, auto_name, module)


def test_meta_device_construction(model_case):
    with torch.device("meta"):
        model = model_case.head_class(model_case.config())
    params = dict(model.named_parameters())
    assert params and all(p.device.type == "meta" for p in params.values())
    reference = model_case.model()
    assert {n: p.shape for n, p in params.items()} == {n: p.shape for n, p in reference.named_parameters()}


# ------------------------------------------------------------------------------------------ attention kernels

DENSE_IMPLEMENTATIONS = ["eager", "sdpa", "sparse_dense", "sparse_block", "sparse_flex"]


@pytest.mark.parametrize("implementation", DENSE_IMPLEMENTATIONS)
def test_every_attention_implementation_matches_eager(model_case, implementation):
    """Dense models accept the sparse kernel names (and run dense attention); sparse models run their pattern with
    every kernel (eager and sdpa mean "the default sparse kernel" there)."""
    inputs = model_case.inputs()
    reference = model_case.model()
    reference.set_attn_implementation("eager")
    model = copy.deepcopy(reference)
    model.set_attn_implementation(implementation)
    expected = _real_rows(model_case, inputs, _logits(reference, inputs))
    got = _real_rows(model_case, inputs, _logits(model, inputs))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_flex_attention_matches_eager(model_case):
    """flex_attention compiles on first use (tens of seconds on CPU per shape): slow. Families that do not declare
    flex support refuse it with transformers' clear ValueError instead of running something else."""
    inputs = model_case.inputs()
    reference = model_case.model()
    model = copy.deepcopy(reference)
    if not model._supports_flex_attn:
        with pytest.raises(ValueError, match="flex_attention"):
            model.set_attn_implementation("flex_attention")
        return
    model.set_attn_implementation("flex_attention")
    expected = _real_rows(model_case, inputs, _logits(reference, inputs))
    got = _real_rows(model_case, inputs, _logits(model, inputs))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ padding-free packing


def _packed_rows(case: ModelCase, lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of sequences of `lengths` packed into one row, and their restarting `position_ids` (what
    `DataCollatorWithFlattening` makes)."""
    vocab = case.config().vocab_size
    g = torch.Generator().manual_seed(3)
    ids = torch.cat([torch.randint(3, vocab, (n,), generator=g) for n in lengths])[None]  # (1, sum)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]  # (1, sum): 0..12, 0..19, 0..5
    return ids, positions


@pytest.mark.parametrize("implementation", DENSE_IMPLEMENTATIONS)
def test_packed_sequences_give_the_outputs_of_each_sequence_alone(model_case, implementation):
    """Padding-free packing: position_ids that restart inside a row separate the sequences in every kernel, dense and
    sparse patterns alike (each pattern on the sequence's own positions), as transformers' decoders read them. The
    tokens attended across the boundary (logits off by 0.05-0.08). The seq2seq model numbers its positions itself and
    refuses position_ids; the ViT has none. The packed row is longer than `max_position_embeddings` (39 > 32 or 35):
    only the positions must fit."""
    if model_case.vision:
        pytest.skip("the ViT has no token positions to pack by")
    if model_case.family == "seq2seq":
        model = model_case.model()
        with pytest.raises(ValueError, match="padding-free packing .* is not supported"):
            model(**model_case.inputs(), position_ids=torch.arange(11)[None].expand(2, -1))
        return
    lengths = (13, 20, 6)
    model = model_case.model(head=model_case.family == "sparse-lm")  # the image model's body reads token ids
    model.set_attn_implementation(implementation)
    ids, positions = _packed_rows(model_case, lengths)
    with torch.no_grad():
        packed = _logits(model, {"input_ids": ids, "position_ids": positions, "use_cache": False})[0]
        alone = [_logits(model, {"input_ids": part[None], "use_cache": False})[0] for part in ids[0].split(lengths)]
    torch.testing.assert_close(packed, torch.cat(alone), rtol=1e-5, atol=1e-5)


def test_left_padding_changes_no_output_of_a_right_padded_batch(model_case):
    """transformers' test_left_padding_compatibility: left-padding a batch (its right-padded rows included) changes no
    logit, the last position's included, which is padding in a right-padded row. Padding slots after the last real
    token took the last real token's position on the masked path but their own index on the natural-order one, so a
    sparse pattern gave those rows other logits."""
    if model_case.family != "sparse-lm":
        pytest.skip("decoder-only LMs batch prompts with padding")
    model = model_case.model()
    inputs = model_case.inputs()  # one full row, one right-padded row

    def run(ids, mask):
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # what generate passes
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits

    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    plain = run(ids, mask)
    pad = torch.zeros(ids.shape[0], 4, dtype=ids.dtype)
    left = run(torch.cat([pad, ids], 1), torch.cat([pad, mask], 1))[:, 4:]
    torch.testing.assert_close(left, plain, rtol=1e-5, atol=1e-5)


def test_a_custom_4d_mask_gives_each_continuation_of_a_shared_prefix_its_own_outputs(model_case):
    """A custom 4-D mask (transformers' decoders take one; its common tests run this case): three continuations of a
    shared prefix in one row, each seeing the prefix and itself, at repeated positions, give the logits of the three
    sequences run separately, for every pattern. It was refused ("needs a padding mask of shape (1, 6)")."""
    if model_case.family not in ("sparse-lm", "image-lm"):
        pytest.skip("only the decoder-only LM takes position_ids and a 4-D mask")
    model = model_case.model(head=model_case.family == "sparse-lm")
    g = torch.Generator().manual_seed(5)
    prefix, ends = torch.randint(3, 40, (5,), generator=g), torch.randint(3, 40, (3,), generator=g)
    separate = torch.stack([torch.cat([prefix, end[None]]) for end in ends])  # (3, 6)
    shared = torch.cat([prefix, ends])[None]  # (1, 8)
    allowed = torch.ones(8, 8).tril().bool()
    allowed[5:, 5:] = torch.eye(3, dtype=torch.bool)  # the continuations do not see one another
    additive = torch.zeros(1, 1, 8, 8).masked_fill(~allowed, torch.finfo(torch.float32).min)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 5, 5]])
    with torch.no_grad():
        expected = _logits(model, {"input_ids": separate, "use_cache": False})[:, -1]
        for mask in (additive, allowed[None, None]):  # additive float or boolean
            got = _logits(model, {"input_ids": shared, "attention_mask": mask, "position_ids": positions,
                                  "use_cache": False})[0, -3:]  # fmt: skip
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ outputs


def test_hidden_states_and_attentions_have_the_documented_count_and_shapes(model_case):
    model = model_case.model()
    config = model.config
    inputs = model_case.inputs()
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
    batch = 2
    if model_case.vision:
        tokens = config.sequence_length  # the patches, the class token (and DeiT's distillation token)
        stacks = {"": (config.num_hidden_layers, config.num_attention_heads, tokens, tokens)}
        width = config.hidden_size
    elif model_case.family == "seq2seq":
        src, tgt = inputs["input_ids"].shape[1], inputs["decoder_input_ids"].shape[1]
        stacks = {
            "encoder_": (config.encoder_layers, config.encoder_attention_heads, src, src),
            "decoder_": (config.decoder_layers, config.decoder_attention_heads, tgt, tgt),
        }
        width = config.d_model
        cross = out.cross_attentions
        assert len(cross) == config.decoder_layers
        assert all(a.shape == (batch, config.decoder_attention_heads, tgt, src) for a in cross)
    else:
        tokens = config.pixels_per_image if model_case.family == "image-lm" else inputs["input_ids"].shape[1]
        stacks = {"": (config.num_hidden_layers, config.num_attention_heads, tokens, tokens)}
        width = config.hidden_size
    for prefix, (layers, heads, tq, tk) in stacks.items():
        hidden = getattr(out, f"{prefix}hidden_states")
        attentions = getattr(out, f"{prefix}attentions")
        assert len(hidden) == layers + 1, prefix
        assert all(h.shape == (batch, tq, width) for h in hidden), prefix
        assert len(attentions) == layers, prefix
        assert all(a.shape == (batch, heads, tq, tk) for a in attentions), prefix
        for a in attentions:  # probabilities: rows of real queries sum to one
            torch.testing.assert_close(a.sum(-1)[0], torch.ones(heads, tq), rtol=0, atol=1e-5)


def test_activation_checkpointing_gives_the_same_gradients(model_case):
    model = model_case.model()
    model.train()  # dropout is 0 in the tiny configs: train mode only switches checkpointing on
    inputs = model_case.inputs(labels=True)

    def grads(m):
        m.zero_grad()
        m(**inputs).loss.backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    plain = grads(model)
    checkpointed = copy.deepcopy(model)
    enable_activation_checkpointing(checkpointed, {"use_reentrant": False})
    assert any(getattr(module, "gradient_checkpointing", False) for module in checkpointed.modules())
    recomputed = grads(checkpointed)
    assert plain.keys() == recomputed.keys() and len(plain) > 0
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------ the hooks users put on the embeddings
def test_a_hook_on_the_input_embeddings_sees_every_forward(model_case):
    """What `get_input_embeddings()` returns is the module the forward runs: a forward hook on it (NEFTune,
    `enable_input_require_grads`, attribution tools) is called, and what it returns is what the model goes on with.
    (The seq2seq model's encoder and decoder once ran two other modules that only shared its weight.)"""
    model = model_case.model().eval()
    inputs = model_case.inputs()
    plain = _logits(model, inputs)
    calls = []

    def shift(module, args, output):  # noise: a constant shift or scale would vanish in the next LayerNorm
        calls.append(tuple(output.shape))
        return output + torch.randn(output.shape, generator=torch.Generator().manual_seed(0))

    handle = model.get_input_embeddings().register_forward_hook(shift)
    try:
        shifted = _logits(model, inputs)
    finally:
        handle.remove()
    expected_calls = 2 if model_case.family == "seq2seq" else 1  # the seq2seq encoder and decoder share it
    assert len(calls) == expected_calls, calls
    assert not torch.allclose(_real_rows(model_case, inputs, shifted), _real_rows(model_case, inputs, plain))


def test_neftune_noise_changes_training_logits_and_leaves_evaluation_alone(model_case):
    """NEFTune as transformers' Trainer installs it (`activate_neftune`: a forward hook on `get_input_embeddings()`):
    noise in training mode, none in evaluation."""
    from transformers.integrations.neftune import activate_neftune

    model = model_case.model()
    inputs = model_case.inputs()
    clean_eval = _logits(model.eval(), inputs)
    # a copy for the clean training forward: a training forward moves BatchNorm's statistics (the hybrid's stem)
    clean_train = _logits(copy.deepcopy(model).train(), inputs)
    handle = activate_neftune(model, 5.0)  # what Trainer(args=TrainingArguments(neftune_noise_alpha=5)) does
    try:
        noisy_eval = _logits(model.eval(), inputs)
        torch.manual_seed(0)
        noisy_train = _logits(model.train(), inputs)
    finally:
        handle.remove()
    assert not torch.allclose(_real_rows(model_case, inputs, noisy_train), _real_rows(model_case, inputs, clean_train))
    torch.testing.assert_close(noisy_eval, clean_eval, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21's read
def test_lora_with_reentrant_checkpointing_and_input_require_grads_trains(model_case):
    """PEFT's recipe for memory-bound fine-tuning: `enable_input_require_grads()`, reentrant activation checkpointing
    and LoRA on the attention's q/v projections. Reentrant checkpointing passes gradients only through inputs that
    require them: the embeddings' output must, or no LoRA matrix gets a gradient (the seq2seq model failed with
    "element 0 of tensors does not require grad")."""
    peft = pytest.importorskip("peft")

    model = model_case.model()
    model.enable_input_require_grads()
    enable_activation_checkpointing(model, {"use_reentrant": True})
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.train()
    model(**model_case.inputs(labels=True)).loss.backward()
    lora = {name: p for name, p in model.named_parameters() if "lora_" in name}
    assert lora and all(p.grad is not None for p in lora.values()), [n for n, p in lora.items() if p.grad is None]
    # B starts at zero, so A's first gradient is zero; B's is not
    assert all(p.grad.abs().sum() > 0 for name, p in lora.items() if "lora_B" in name)


def test_bf16_forward_is_finite_and_close_to_fp32(model_case):
    model = model_case.model()
    inputs = model_case.inputs()
    expected = _real_rows(model_case, inputs, _logits(model, inputs))
    low = copy.deepcopy(model).to(torch.bfloat16)
    got = _real_rows(model_case, inputs, _logits(low, inputs)).float()
    assert torch.isfinite(got).all()
    scale = expected.abs().max().item()
    assert (got - expected).abs().max().item() <= 0.05 * scale + 0.05
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = _real_rows(model_case, inputs, _logits(model, inputs)).float()
    assert torch.isfinite(autocast).all()
    assert (autocast - expected).abs().max().item() <= 0.05 * scale + 0.05


# ------------------------------------------------------------------------------------------ compile / export


def test_compile_fullgraph_has_no_graph_break_and_equal_outputs(model_case):
    """Dynamo traces the whole forward as one graph (fullgraph=True raises on any graph break). The eager backend
    keeps this fast; inductor code generation is exercised by the slow test below."""
    torch._dynamo.reset()
    model = model_case.model()
    inputs = model_case.inputs()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    expected = _real_rows(model_case, inputs, _logits(model, inputs))
    got = _real_rows(model_case, inputs, _logits(compiled, inputs))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", ["vit-dense", "seq2seq-dense", "sparse-lm-strided-merged"])
def test_compile_inductor_equal_outputs(case_id):
    case = next(c for c in MODEL_CASES if c.id == case_id)
    torch._dynamo.reset()
    model = case.model()
    inputs = case.inputs()
    compiled = torch.compile(model, fullgraph=True)
    expected = _real_rows(case, inputs, _logits(model, inputs))
    torch.testing.assert_close(_real_rows(case, inputs, _logits(compiled, inputs)), expected, rtol=1e-4, atol=1e-5)


def _encoder_and_inputs(case: ModelCase):
    model = case.model()
    inputs = case.inputs()
    if case.vision or case.family == "image-lm":  # the image models' own entry point: pixels in, logits out
        return model, inputs
    if case.family == "seq2seq":
        return model.get_encoder(), {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    return model.model, {**inputs, "use_cache": False}  # the decoder-only LM's stack, without a KV cache


@pytest.mark.parametrize(
    "case_id",
    [
        "vit-dense",
        "vit-strided",
        "vit-fixed",
        "vit-distilled",
        "vit-hybrid",
        "vit-mpp",
        "seq2seq-dense",
        "seq2seq-strided",
        "seq2seq-fixed",
        "sparse-lm-dense",
        "sparse-lm-strided-merged",
        "sparse-lm-fixed-heads",
        "image-lm-dense",
        "image-lm-strided-heads",
        "image-lm-fixed-heads",
    ],
)
def test_torch_export_of_the_classifier_and_the_encoders(case_id):
    case = next(c for c in MODEL_CASES if c.id == case_id)
    module, inputs = _encoder_and_inputs(case)
    exported = torch.export.export(module, args=(), kwargs=inputs, strict=False)
    with torch.no_grad():
        expected = module(**inputs)
        got = exported.module()(**inputs)
    key = "logits" if case.vision or case.family == "image-lm" else "last_hidden_state"
    torch.testing.assert_close(
        _real_rows(case, inputs, got[key]), _real_rows(case, inputs, expected[key]), rtol=1e-5, atol=1e-6
    )
    other = case.inputs(seed=7)  # the exported program is not specialised to the values it was traced with
    if case.family == "seq2seq":
        other = {"input_ids": other["input_ids"], "attention_mask": other["attention_mask"]}
    elif case.family == "sparse-lm":
        other["use_cache"] = False
    with torch.no_grad():
        torch.testing.assert_close(
            _real_rows(case, other, exported.module()(**other)[key]),
            _real_rows(case, other, module(**other)[key]),
            rtol=1e-5,
            atol=1e-6,
        )


# ------------------------------------------------------------------------------------------ Trainer


def _trainer(case: ModelCase, output_dir, batch_size: int = 2, accumulation: int = 1, train_dataset=None, **settings):
    """A transformers `Trainer` of a fresh tiny model: one plain SGD step (no decay, clipping or schedule)."""
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=0.1,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        dataloader_drop_last=False,
        seed=0,
        disable_tqdm=True,
        average_tokens_across_devices=False,
        **settings,
    )
    return transformers.Trainer(model=case.model(), args=args, train_dataset=train_dataset)


def _accumulated_and_single_step(case: ModelCase, inputs: dict, tmp_path) -> tuple[dict, dict]:
    """The weights after one step of 2 micro-batches of 2 (gradient_accumulation_steps=2) and after one step on the
    batch of 4, with transformers' `Trainer`."""
    from datasets import Dataset

    rows = Dataset.from_dict({k: v.tolist() for k, v in inputs.items()}).with_format("torch")

    def train(batch_size: int, accumulation: int):
        trainer = _trainer(case, tmp_path / f"run{batch_size}", batch_size, accumulation, train_dataset=rows)
        trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(rows)
        trainer.train()
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    accumulated, single = train(2, 2), train(4, 1)
    before = dict(case.model().named_parameters())
    assert any(not torch.equal(single[n], before[n]) for n in single), "the step changed nothing"
    return accumulated, single


def test_trainer_gradient_accumulation_equals_one_step_on_the_double_batch(model_case, tmp_path):
    """Two micro-batches of 2 with gradient_accumulation_steps=2 give the weights of one step on the batch of 4. The
    image model's labels leave micro-batches with different counts of labelled pixels: before the fix its loss
    ignored Trainer's `num_items_in_batch` (a mean per micro-batch, not divided by the accumulation steps), so
    accumulation doubled the gradient."""
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model_case.model().modules()):
        pytest.skip(
            "BatchNorm (the hybrid's stem) normalises each micro-batch by its own statistics, as in any CNN "
            "(transformers' ResNet too): two micro-batches of 2 are not one batch of 4 by design"
        )
    accumulated, single = _accumulated_and_single_step(model_case, model_case.inputs(batch=4, labels=True), tmp_path)
    for name in single:
        torch.testing.assert_close(accumulated[name], single[name], rtol=1e-5, atol=1e-6, msg=name)


def test_trainer_trains_the_image_model_on_pixel_values_alone(tmp_path):
    """A batch of images alone (no `labels`): Trainer trains on the head's own loss, accumulation included."""
    case = next(c for c in MODEL_CASES if c.id == "image-lm-strided-heads")
    inputs = case.inputs(batch=4)
    assert set(inputs) == {"pixel_values"}
    accumulated, single = _accumulated_and_single_step(case, inputs, tmp_path)
    for name in single:
        torch.testing.assert_close(accumulated[name], single[name], rtol=1e-5, atol=1e-6, msg=name)


def _self_supervised(case: ModelCase) -> bool:
    return bool(getattr(case.head_class, "loss_inputs", ()))


SELF_SUPERVISED_CASES = [case for case in MODEL_CASES if _self_supervised(case)]


def _model_loss(case: ModelCase, inputs: dict, batch_size: int = 2) -> float:
    """The model's loss as Trainer's evaluation averages it: the mean of the losses of batches of equal size."""
    model = case.model()
    with torch.no_grad():
        losses = [
            model(**{k: v[i : i + batch_size] for k, v in inputs.items()}).loss.item()
            for i in range(0, len(next(iter(inputs.values()))), batch_size)
        ]
    return sum(losses) / len(losses)


def _evaluated_loss(case: ModelCase, inputs: dict, output_dir, **settings) -> float:
    from datasets import Dataset

    rows = Dataset.from_dict({k: v.tolist() for k, v in inputs.items()}).with_format("torch")
    metrics = _trainer(case, output_dir, **settings).evaluate(rows)
    assert "eval_loss" in metrics, f"no eval_loss in {sorted(metrics)}"
    return metrics["eval_loss"]


@pytest.mark.parametrize("model_case", SELF_SUPERVISED_CASES, ids=[c.id for c in SELF_SUPERVISED_CASES])
def test_trainer_evaluates_the_self_supervised_heads_without_labels(model_case, tmp_path):
    """`Trainer.evaluate()` with default `TrainingArguments` on batches without `labels` reports the model's own
    loss as `eval_loss` for the heads that compute it from their inputs (`loss_inputs`: the image model's pixels,
    masked patch prediction's pixels and masked positions). Before `hf_vit_plus.training.trainer_hooks` it reported
    no `eval_loss` unless `label_names` named those inputs (Trainer's default label names, `labels`, were not in the
    batch). Batches with `labels` and explicit `label_names` are evaluated as before."""
    inputs = model_case.inputs(batch=4)
    assert "labels" not in inputs and set(inputs) == set(model_case.head_class.loss_inputs)
    expected = _model_loss(model_case, inputs)
    assert _evaluated_loss(model_case, inputs, tmp_path / "default") == pytest.approx(expected, rel=1e-5)
    names = list(model_case.head_class.loss_inputs)
    named = _evaluated_loss(model_case, inputs, tmp_path / "named", label_names=names)
    assert named == pytest.approx(expected, rel=1e-5)

    labelled = model_case.inputs(batch=4, labels=True)  # some targets -100: a loss other than the inputs' own
    assert _model_loss(model_case, labelled) != pytest.approx(expected, rel=1e-5)
    expected = _model_loss(model_case, labelled)
    assert _evaluated_loss(model_case, labelled, tmp_path / "labels") == pytest.approx(expected, rel=1e-5)


def test_trainer_evaluation_of_other_models_is_unchanged(tmp_path):
    """The hook leaves the heads that need labels alone: a classifier's batch without labels has no loss."""
    case = next(c for c in MODEL_CASES if c.family == "vit")
    assert not _self_supervised(case)
    from datasets import Dataset

    rows = Dataset.from_dict({k: v.tolist() for k, v in case.inputs(batch=4).items()}).with_format("torch")
    metrics = _trainer(case, tmp_path).evaluate(rows)
    assert "eval_loss" not in metrics and "eval_runtime" in metrics


# ------------------------------------------------------------------------------------------ generation


def _prompt(case: ModelCase) -> dict:
    if case.family == "image-lm":  # images are drawn from the start token
        return {"input_ids": torch.full((2, 1), case.config().bos_token_id)}
    inputs = case.inputs()
    if case.family == "seq2seq":
        return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    # Left padding, as decoder-only generation expects.
    ids = case.inputs(batch=2)["input_ids"][:, :6].clone()
    mask = torch.ones_like(ids)
    ids[1, :2] = case.config().pad_token_id
    mask[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


GENERATION_MODES = {
    "greedy": dict(do_sample=False, num_beams=1),
    "beam": dict(do_sample=False, num_beams=3, num_return_sequences=2, length_penalty=0.6),
    "sample": dict(do_sample=True, num_beams=1, top_k=8),
}


@pytest.mark.parametrize("mode", list(GENERATION_MODES))
def test_generate_with_and_without_cache_and_with_a_static_cache_give_the_same_tokens(generative_case, mode):
    model = generative_case.model()
    prompt = _prompt(generative_case)
    # an image model draws whole images: every step of the pattern, the padded tails of the strides included
    length = generative_case.config().pixels_per_image if generative_case.family == "image-lm" else 8
    settings = dict(GENERATION_MODES[mode], max_new_tokens=length, min_new_tokens=length)

    def run(**extra):
        torch.manual_seed(123)
        with torch.no_grad():
            return model.generate(**prompt, **settings, **extra)

    cached = run(use_cache=True)
    assert cached.shape[-1] >= length
    torch.testing.assert_close(run(use_cache=False), cached, rtol=0, atol=0)
    # Eager steps on the static cache; the compiled ones (the default) are tests/models/test_compiled_decoding.py's.
    static = run(use_cache=True, cache_implementation="static", disable_compile=True)
    torch.testing.assert_close(static, cached, rtol=0, atol=0)


def test_transformers_compiled_static_cache_generate_gives_the_eager_tokens_and_logits(generative_case):
    """The flag transformers' generation tests read (`_can_compile_fullgraph`, true for both generative families)
    holds: `generate(cache_implementation="static", compile_config=CompileConfig(fullgraph=True, dynamic=False))`
    forced onto the CPU, as those tests run it, compiles the decoding step without a graph break and gives the
    tokens and logits of eager decoding with a dynamic cache, for two batches of the same shape and with every
    output (scores, attentions, hidden states), greedy as they run it (beam search:
    tests/models/test_compiled_decoding.py). The graphs stay far below torch's recompile limit (the sparse LM
    exceeded it before) and a repeated call compiles nothing. Dynamo's eager backend checks the graph; inductor
    gives the same tokens (measured: 40-50 s per family, too slow here)."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    model = generative_case.model()
    assert type(model)._can_compile_fullgraph
    if generative_case.family == "image-lm":  # images are drawn from the start token
        batch = {"input_ids": torch.full((4, 1), generative_case.config().bos_token_id)}
    else:
        batch = {k: v for k, v in generative_case.inputs(batch=4).items() if k != "decoder_input_ids"}
    halves = [{k: v[:2] for k, v in batch.items()}, {k: v[2:] for k, v in batch.items()}]
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    for outputs in ({}, {"output_attentions": True, "output_hidden_states": True, "output_scores": True}):
        config = CompileConfig(fullgraph=True, dynamic=False, backend="eager", mode=None)
        config._compile_all_devices = True  # as transformers' tests force it on CPU
        settings = dict(do_sample=False, num_beams=1, max_new_tokens=5, min_new_tokens=5, return_dict_in_generate=True,
                        output_logits=True, **outputs)  # fmt: skip
        with torch.no_grad():
            eager = [model.generate(**half, **settings) for half in halves]
            compiled = [model.generate(**half, **settings, cache_implementation="static", compile_config=config)
                        for half in halves]  # fmt: skip
            static = [model.generate(**half, **settings, cache_implementation="static", disable_compile=True)
                      for half in halves]  # fmt: skip
        for want, got, eager_static in zip(eager, compiled, static):
            torch.testing.assert_close(got.sequences, want.sequences, rtol=0, atol=0)
            torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), rtol=1e-5, atol=1e-5)
            if outputs:  # one entry per new token
                key = "decoder_attentions" if generative_case.family == "seq2seq" else "attentions"
                assert len(getattr(got, key)) == len(getattr(want, key)) == 5
                # on a static cache every step's attentions span the whole cache, as transformers' models give
                # them (transformers' test_generate_compilation_all_outputs): the eager static steps' shapes
                shapes = [[tuple(layer.shape) for layer in step] for step in getattr(got, key)]
                assert shapes == [[tuple(layer.shape) for layer in step] for step in getattr(eager_static, key)]
                assert len({layer[-1] for step in shapes for layer in step}) == 1, shapes  # one cache length
    made = counters["stats"]["unique_graphs"] - graphs
    assert 1 <= made <= 4 < torch._dynamo.config.recompile_limit, made
    with torch.no_grad():
        model.generate(**halves[0], **settings, cache_implementation="static", compile_config=config)
    assert counters["stats"]["unique_graphs"] - graphs == made
    torch._dynamo.reset()


def test_resize_token_embeddings_keeps_the_tied_matrices_tied(generative_case):
    if generative_case.family == "image-lm":
        pytest.skip("an image model's vocabulary is fixed (the 256 intensities and the start token), untied")
    model = generative_case.model()
    old = model.config.vocab_size
    model.resize_token_embeddings(old + 5)
    embedding = model.get_input_embeddings().weight
    assert embedding.shape[0] == old + 5 and model.config.vocab_size == old + 5
    assert model.get_output_embeddings().weight is embedding
    if generative_case.family == "seq2seq":
        assert model.get_decoder().embed_tokens.weight is embedding
        assert model.get_encoder().embed_tokens.weight is embedding
    inputs = generative_case.inputs()
    inputs["input_ids"][0, 0] = old + 4  # a new token is a valid input
    logits = _logits(model, inputs)
    assert logits.shape[-1] == old + 5 and torch.isfinite(logits).all()


# ------------------------------------------------------------------------------------------ malformed inputs


def _malformed_inputs(case: ModelCase) -> list[tuple[str, dict, str]]:
    """(what, inputs, a fragment the error message must contain) for one case."""
    good = case.inputs()
    if case.vision:
        pixels = good["pixel_values"]
        return [
            ("channels", {"pixel_values": pixels[:, :1]}, "channels"),
            ("size", {"pixel_values": pixels[..., :16, :16]}, "16x16"),
            ("rank", {"pixel_values": pixels[0]}, "(batch, channels, height, width)"),
            ("dtype", {"pixel_values": pixels.to(torch.int64)}, "floating-point"),
        ]
    if case.family == "image-lm":
        pixels = good["pixel_values"]  # (2, 1, 5, 7) uint8
        too_bright, negative = pixels.long(), pixels.long()
        too_bright[1, 0, 2, 3] = 300
        negative[0, 0, 1, 1] = -7
        labels = case.inputs(labels=True)["labels"]  # (2, 35), aligned with the pixels
        start_label, wide_label = labels.clone(), labels.clone()
        start_label[0, 4] = case.config().bos_token_id  # the start token is no pixel: a loss of inf
        wide_label[1, 0] = 300
        return [
            ("float pixels", {"pixel_values": pixels / 255}, "torch.float32"),
            ("intensity > 255", {"pixel_values": too_bright}, "300"),
            ("negative intensity", {"pixel_values": negative}, "-7"),
            ("size", {"pixel_values": pixels[..., :4, :]}, "(2, 1, 4, 7)"),
            ("channels", {"pixel_values": pixels.expand(2, 3, 5, 7)}, "num_channels=1"),
            ("not a tensor", {"pixel_values": pixels.tolist()}, "torch.Tensor"),
            ("empty", {"pixel_values": pixels[:0]}, "(0, 1, 5, 7)"),
            ("both inputs", {"pixel_values": pixels, "input_ids": torch.zeros(2, 35, dtype=torch.long)}, "not both"),
            ("labels shape", {"pixel_values": pixels, "labels": labels[:, 1:]}, "(2, 34)"),
            ("label > 255", {"pixel_values": pixels, "labels": wide_label}, "300"),
            ("start-token label", {"pixel_values": pixels, "labels": start_label}, "256"),
            ("float labels", {"pixel_values": pixels, "labels": labels.float()}, "labels"),
            ("token id >= vocab_size", {"input_ids": torch.full((2, 3), 257)}, "257"),
        ]
    vocab = case.config().vocab_size
    ids, mask = good["input_ids"], good["attention_mask"]
    too_big = ids.clone()
    too_big[1, 4] = vocab + 3
    negative = ids.clone()
    negative[0, 2] = -7
    extra = {k: v for k, v in good.items() if k not in ("input_ids", "attention_mask")}
    cases = [
        ("id >= vocab_size", {**good, "input_ids": too_big}, str(vocab + 3)),
        ("negative id", {**good, "input_ids": negative}, "-7"),
        ("float ids", {**good, "input_ids": ids.float()}, "input_ids"),
        ("empty", {**extra, "input_ids": ids[:1, :0], "attention_mask": mask[:1, :0]}, "(1, 0)"),
        ("mask length", {**good, "attention_mask": mask[:, :-2]}, "attention_mask"),
    ]
    labels = ids.clone() if case.family == "sparse-lm" else good["decoder_input_ids"].clone()
    labels[0, 1] = vocab
    cases.append(("label >= vocab_size", {**good, "labels": labels}, "labels"))
    if case.family == "seq2seq":
        bad_decoder = good["decoder_input_ids"].clone()
        bad_decoder[0, 0] = vocab + 1
        cases.append(("decoder id", {**good, "decoder_input_ids": bad_decoder}, "decoder_input_ids"))
    return cases


def test_malformed_inputs_end_in_a_value_error_naming_them(model_case):
    model = model_case.model()
    for what, inputs, fragment in _malformed_inputs(model_case):
        with pytest.raises((ValueError, TypeError)) as info:
            model(**inputs)
        assert fragment in str(info.value), (what, str(info.value))


# ------------------------------------------------------------------------------------------ the command line

CLI_TINY = {
    "vit": TINY_VIT_OVERRIDES,
    "seq2seq": "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64",
    "sparse-lm": "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,"
    "max_position_embeddings=64,sparse_stride=8,sparse_summary_size=2",
    "image-lm": TINY_VIT_OVERRIDES,  # the same width and depth; 8 x 8 digits
    "vit-mpp": TINY_VIT_OVERRIDES,
}
CLI_ATTENTION = {
    "vit": ["attention_type=dense", "attention_type=strided", "attention_type=fixed"],
    "seq2seq": [
        "encoder_attention_type=dense",
        "encoder_attention_type=strided,encoder_sparse_stride=4",
        "encoder_attention_type=fixed,encoder_sparse_stride=4,encoder_sparse_summary_size=1",
    ],
    "sparse-lm": ["attention_type=dense", "attention_type=strided", "attention_type=fixed"],
    "image-lm": ["attention_type=dense", "attention_type=strided", "attention_type=fixed"],
    "vit-mpp": ["attention_type=dense"],  # the encoder's variants are the classifier's
}
CLI_RUNS = [(family, attention) for family, options in CLI_ATTENTION.items() for attention in options]


@pytest.mark.parametrize(
    ("family", "attention"), CLI_RUNS, ids=[f"{f}-{a.split(',')[0].split('=')[1]}" for f, a in CLI_RUNS]
)
def test_cli_train_ends_with_weights_card_and_figures(family, attention, tmp_path, fresh_accelerate_state):
    from hf_vit_plus.cli import main
    from hf_vit_plus.hub.card import validate_card_metadata

    output_dir = tmp_path / "run"
    argv = ["train", family, "--output_dir", str(output_dir), "--max_steps", "2",
            "--max_train_samples", "32", "--max_eval_samples", "16", "--per_device_train_batch_size", "8",
            "--report_to", "none", "--save_steps", "none",
            "--config_overrides", f"{CLI_TINY[family]},{attention}"]  # fmt: skip
    if family == "sparse-lm":
        argv += ["--block_size", "64"]
    assert main(argv) == 0
    written = {p.name for p in output_dir.iterdir()}
    assert {"model.safetensors", "config.json", "README.md", "training_curves.png"} <= written, sorted(written)
    # the built-in data sets are not on the Hub: no `datasets` key (and no model-index) is right
    assert not validate_card_metadata(output_dir / "README.md", require_datasets=False)
    card = (output_dir / "README.md").read_text()
    assert "training_curves.png" in card and "\ndatasets:" not in card.split("\n---\n")[0]
    if "dense" not in attention:
        assert "sparse_attention_pattern.png" in written and "sparse_attention_pattern.png" in card
    reloaded = getattr(transformers, ModelCase("", family).auto_head).from_pretrained(output_dir)
    key, value = attention.split(",")[0].split("=")
    assert getattr(reloaded.config, key) == value
    if family == "image-lm":  # scored on the test images in bits per dim
        assert "eval_bits_per_dim" in json.loads((output_dir / "eval_results.json").read_text())
