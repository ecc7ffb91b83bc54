"""One definition of sparse attention across the families: the same config fields, resolved and validated in one
place (`sparse_layouts.pattern_from_config`), and one rule for the kernel (`attention.select_attention_kernel`)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_vit_plus import Seq2SeqTransformerConfig, SparseTransformerConfig, ViTPlusConfig
from hf_vit_plus.models.attention import select_attention_kernel
from hf_vit_plus.models.sparse_layouts import SparsePattern, pattern_from_config
from tests.utils import REPO_ROOT

SPARSE_FIELDS = ("attention_type", "sparse_stride", "sparse_summary_size", "sparse_num_summary_blocks",
                 "sparse_pattern_mode")  # fmt: skip
TINY = {
    "vit": (ViTPlusConfig, dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
                                image_size=16, patch_size=4)),  # fmt: skip
    "seq2seq": (Seq2SeqTransformerConfig, dict(vocab_size=20, d_model=16, encoder_layers=2, decoder_layers=1,
                                               encoder_attention_heads=4, decoder_attention_heads=2,
                                               encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)),
    "sparse-lm": (SparseTransformerConfig, dict(vocab_size=20, hidden_size=16, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=32,
                                                max_position_embeddings=32, sparse_stride=4, sparse_summary_size=1)),
}  # fmt: skip
PREFIX = {"vit": "", "seq2seq": "encoder_", "sparse-lm": ""}


def tiny(family: str, **sparse):
    """A tiny config of `family` with the unprefixed sparse settings `sparse` (prefixed for the seq2seq encoder)."""
    config_class, fields = TINY[family]
    return config_class(**{**fields, **{PREFIX[family] + name: value for name, value in sparse.items()}})


# ------------------------------------------------------------------------------------------------------ the fields
@pytest.mark.parametrize("family", list(TINY))
def test_every_family_spells_the_sparse_settings_alike(family):
    config_class = TINY[family][0]
    parameters = set(inspect.signature(config_class.__init__).parameters)
    sparse = {name for name in parameters if "sparse" in name or name.endswith("attention_type")}
    assert sparse == {PREFIX[family] + name for name in SPARSE_FIELDS}
    assert config_class.sparse_fields.prefix == PREFIX[family]


@pytest.mark.parametrize(
    ("family", "causal"), [("vit", False), ("seq2seq", False), ("sparse-lm", True)]
)  # fmt: skip
def test_pattern_from_config_of_every_family(family, causal):
    assert pattern_from_config(tiny(family, attention_type="dense")) is None
    config = tiny(family, attention_type="fixed", sparse_stride=4, sparse_summary_size=1, sparse_num_summary_blocks=2,
                  sparse_pattern_mode="heads")  # fmt: skip
    assert pattern_from_config(config) == SparsePattern("fixed", 4, 1, 2, causal, "heads")
    # The strided pattern drops the summary settings.
    config = tiny(family, attention_type="strided", sparse_stride=4, sparse_summary_size=3,
                  sparse_num_summary_blocks=2)  # fmt: skip
    assert pattern_from_config(config) == SparsePattern("strided", 4, 0, 1, causal, "merged")


def test_vit_defaults_are_resolved_in_the_config_and_saved_as_numbers(tmp_path):
    config = tiny("vit", attention_type="fixed")  # a 4 x 4 grid of patches
    assert (config.sparse_stride, config.sparse_summary_size) == (4, 1)
    default = ViTPlusConfig()  # 224 / 16: 14 patches per row
    assert (tiny("vit").sparse_stride, default.sparse_stride, default.sparse_summary_size) == (4, 14, 3)
    assert (tiny("vit", sparse_stride=8).sparse_summary_size, tiny("vit", sparse_summary_size=3).sparse_stride) == (
        2, 4,
    )  # fmt: skip
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["sparse_stride"], saved["sparse_summary_size"]) == (4, 1)
    # A config file saved by version 0.1.0 (commit ded34c8) holds null: it resolves the same way.
    old = json.loads((REPO_ROOT / "tests/fixtures/release_0_1/vit/config.json").read_text())
    assert old["sparse_stride"] is None and old["sparse_summary_size"] is None
    loaded = ViTPlusConfig.from_dict(old)
    assert (loaded.sparse_stride, loaded.sparse_summary_size) == (4, 1)  # image_size 16, patch_size 4
    assert pattern_from_config(loaded) == SparsePattern("strided", 4, 0, 1, False, "merged")


BAD_SETTINGS = [
    (dict(attention_type="banded"), "Unknown `{p}attention_type` 'banded'"),
    (dict(attention_type="strided", sparse_pattern_mode="stacked"), "Unknown `{p}sparse_pattern_mode` 'stacked'"),
    (dict(attention_type="strided", sparse_stride=0), "`{p}sparse_stride` must be a positive integer, got 0"),
    (dict(attention_type="dense", sparse_stride="4"), "`{p}sparse_stride` must be a positive integer, got '4'"),
    (dict(attention_type="strided", sparse_stride=64), r"`{p}sparse_stride` \(64\) is longer than the sequence"),
    (dict(attention_type="fixed", sparse_stride=4, sparse_summary_size=5), "`{p}sparse_summary_size`=5 and"),
    (
        dict(attention_type="fixed", sparse_stride=4, sparse_summary_size=3, sparse_num_summary_blocks=2),
        r"`{p}sparse_summary_size` \(3\) x `{p}sparse_num_summary_blocks` \(2\) = 6",
    ),
    (dict(attention_type="strided", sparse_num_summary_blocks=0), "`{p}sparse_num_summary_blocks` must be"),
]


@pytest.mark.parametrize("family", list(TINY))
@pytest.mark.parametrize(("sparse", "message"), BAD_SETTINGS)
def test_bad_settings_are_value_errors_naming_the_config_field(family, sparse, message):
    with pytest.raises(ValueError, match=message.format(p=PREFIX[family])):
        tiny(family, **sparse)


@pytest.mark.parametrize("family", list(TINY))
def test_heads_mode_needs_an_even_head_count_named_by_its_field(family):
    heads = {"vit": "num_attention_heads", "seq2seq": "encoder_attention_heads", "sparse-lm": "num_attention_heads"}
    config_class, fields = TINY[family]
    fields = {**fields, heads[family]: 1}
    sparse = {PREFIX[family] + "attention_type": "strided", PREFIX[family] + "sparse_pattern_mode": "heads"}
    with pytest.raises(ValueError, match=rf"'heads'.*`{heads[family]}` \(1\) must be divisible by 2"):
        config_class(**{**fields, **sparse})
    config_class(**{**fields, **sparse, PREFIX[family] + "sparse_pattern_mode": "merged"})  # fine outside "heads"


@pytest.mark.parametrize("family", list(TINY))
def test_dense_attention_does_not_range_check_the_sparse_settings(family):
    assert pattern_from_config(tiny(family, attention_type="dense", sparse_stride=1000)) is None


# ------------------------------------------------------------------------------------------------------ the kernel
KERNEL_CASES = [
    # requested, sparse, device, output_attentions -> kernel
    ("sdpa", False, "cpu", False, "sdpa"),
    ("eager", False, "cpu", False, "eager"),
    ("flex_attention", False, "cuda", False, "flex_attention"),
    ("sdpa", False, "cpu", True, "eager"),
    (None, False, "cpu", False, "eager"),
    ("sparse_block", False, "cpu", False, "sdpa"),  # a dense layer of a model asked for a sparse kernel
    ("sparse_flex", False, "cuda", True, "eager"),
    ("sdpa", True, "cpu", False, "sparse_block"),
    ("sdpa", True, "cuda", False, "sparse_flex"),
    ("eager", True, "mps", False, "sparse_block"),
    (None, True, "cuda", False, "sparse_flex"),
    ("sparse_dense", True, "cuda", False, "sparse_dense"),
    ("sparse_flex", True, "cpu", False, "sparse_flex"),
    ("sparse_block", True, "cuda", False, "sparse_block"),
    ("sparse_block", True, "cpu", True, "sparse_dense"),
    ("sdpa", True, "cuda", True, "sparse_dense"),
]


@pytest.mark.parametrize(("requested", "sparse", "device", "output_attentions", "expected"), KERNEL_CASES)
def test_select_attention_kernel(requested, sparse, device, output_attentions, expected):
    pattern = SparsePattern("strided", 4) if sparse else None
    assert select_attention_kernel(requested, pattern, device, output_attentions) == expected


@pytest.mark.parametrize(
    ("requested", "device", "queries", "keys", "expected"),
    [
        ("sdpa", "cpu", 17, 17, "eager"),  # a Fashion-MNIST ViT's tokens: sdpa's CPU kernel is 2.5-4.3x slower there
        ("sdpa", "cpu", 128, 128, "eager"),
        ("sdpa", "cpu", 129, 129, "sdpa"),
        ("sdpa", "cpu", 197, 197, "sdpa"),  # ViT-B/16 at 224
        ("sdpa", "cuda", 17, 17, "sdpa"),
        ("sdpa", "cpu", 1, 17, "sdpa"),  # a decoding step outside torch.compile: unchanged
        ("sdpa", "cpu", 17, None, "sdpa"),  # lengths unknown: the requested kernel
        ("flex_attention", "cpu", 17, 17, "flex_attention"),
        ("sparse_block", "cpu", 17, 17, "eager"),  # a dense layer of a model asked for a sparse kernel
    ],
)
def test_short_cpu_sequences_take_the_reference_kernel(requested, device, queries, keys, expected):
    assert select_attention_kernel(requested, None, device, False, query_length=queries, key_length=keys) == expected
    assert select_attention_kernel(requested, SparsePattern("strided", 4), "cpu", False, queries, keys) != "eager"


@pytest.mark.parametrize(
    ("requested", "device", "head_dim", "expected"),
    [
        (None, "cuda", 8, "sparse_block"),  # flex's CUDA kernels refuse heads under 16 dimensions
        ("sdpa", "cuda", 15, "sparse_block"),
        ("sdpa", "cuda", 16, "sparse_flex"),
        ("sdpa", "cuda", 64, "sparse_flex"),
        ("sdpa", "cpu", 64, "sparse_block"),
        ("sparse_flex", "cuda", 8, "sparse_flex"),  # asked for by name: the kernel itself falls back (below)
    ],
)
def test_the_automatic_sparse_kernel_respects_flex_head_sizes(requested, device, head_dim, expected):
    pattern = SparsePattern("strided", 4)
    assert select_attention_kernel(requested, pattern, device, False, 64, 64, head_dim=head_dim) == expected


def test_flex_attention_refusal_names_the_head_size():
    from hf_vit_plus.models.attention_reference import FLEX_MIN_HEAD_DIM, flex_attention_refusal

    assert FLEX_MIN_HEAD_DIM == 16
    assert "at least 16 dimensions, these have 8" in flex_attention_refusal("cuda", 8, needs_grad=False)
    assert flex_attention_refusal("cuda", 16, needs_grad=True) is None
    assert flex_attention_refusal("cpu", 8, needs_grad=False) is None  # the CPU kernel takes any size, forward only
    assert "no backward on CPU" in flex_attention_refusal("cpu", 64, needs_grad=True)


def test_sparse_flex_falls_back_to_the_block_kernel_where_flex_refuses(monkeypatch, caplog):
    """`sparse_flex` asked for by name on inputs flex cannot run (a CUDA device with 8-dimensional heads, faked here
    on the CPU by the device check): it runs `sparse_block`, says so once, and never calls flex_attention."""
    from hf_vit_plus.models import sparse_attention as sa

    def no_flex(*args, **kwargs):
        raise AssertionError("flex_attention was called")

    monkeypatch.setattr(sa, "flex_sparse_attention", no_flex)
    monkeypatch.setattr(sa, "flex_attention_refusal", lambda device, head_dim, grad: f"refused {head_dim}")
    module = torch.nn.Module()
    module.sparse_pattern, module.layer_idx = SparsePattern("strided", 4), 0
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    with caplog.at_level("WARNING", logger=sa.logger.name):
        out, _ = sa.sparse_flex_attention_forward(module, q, k, v, None, scaling=8**-0.5)
    expected, _ = sa.sparse_block_attention_forward(module, q, k, v, None, scaling=8**-0.5)
    torch.testing.assert_close(out, expected)
    assert "sparse_flex: refused 8, falling back to sparse_block." in caplog.text


def test_the_block_kernel_uses_the_cpu_flash_ops_only_for_cpu_tensors(monkeypatch):
    """The private flash ops have only a CPU kernel: other devices take the public path (meta tensors stand in)."""
    from hf_vit_plus.models import sparse_attention as sa

    def cpu_only(*args, **kwargs):
        raise AssertionError("the CPU flash op was called with non-CPU tensors")

    monkeypatch.setattr(sa, "_FLASH", (cpu_only, cpu_only))
    monkeypatch.setattr(sa, "FLASH_OPS_AVAILABLE", True)
    q, k, v = (torch.empty(1, 2, 20, 8, device="meta") for _ in range(3))
    for kind in ("strided", "fixed"):
        out = sa.block_sparse_attention(q, k, v, SparsePattern(kind, 8, 2 if kind == "fixed" else 0))
        assert out.shape == q.shape and out.device.type == "meta"


# ------------------------------------------------------------------------------- what a dense model's forward loads
LOADS = """
import sys, torch
from tests.models.test_sparse_settings import tiny
from hf_vit_plus import SparseTransformerForCausalLM, Seq2SeqTransformerModel, ViTPlusModel
models = {"vit": ViTPlusModel, "seq2seq": Seq2SeqTransformerModel, "sparse-lm": SparseTransformerForCausalLM}
inputs = {"vit": dict(pixel_values=torch.randn(1, 3, 16, 16)),
          "seq2seq": dict(input_ids=torch.tensor([[3, 4, 5]]), decoder_input_ids=torch.tensor([[1, 3]])),
          "sparse-lm": dict(input_ids=torch.tensor([[3, 4, 5]]))}
for family, model in models.items():
    with torch.no_grad():
        model(tiny(family, attention_type="dense"))(**inputs[family])
assert "hf_vit_plus.models.sparse_attention" not in sys.modules, "a dense forward imported the sparse kernels"
with torch.no_grad():
    model = ViTPlusModel(tiny("vit", attention_type="strided"))
    model(**inputs["vit"])
assert "hf_vit_plus.models.sparse_attention" in sys.modules
"""


def test_a_dense_forward_does_not_load_the_sparse_kernels():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", LOADS], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_sparse_kernels_ship_with_a_sparse_or_dense_checkpoint(tmp_path):
    """The shims' function-level import is enough for save_pretrained to copy sparse_attention.py (remote code)."""
    from hf_vit_plus import ViTPlusModel

    ViTPlusModel(tiny("vit")).save_pretrained(tmp_path)
    assert {"attention.py", "sparse_attention.py", "sparse_layouts.py"} <= {p.name for p in Path(tmp_path).iterdir()}


REMOTE_WITH_PACKAGE_CONFIG = """
import sys, torch
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from hf_vit_plus.models.sparse_layouts import SparsePattern
from tests.models.test_sparse_settings import tiny
remote_class = get_class_from_dynamic_module("modeling_vit_plus.ViTPlusModel", sys.argv[1])
model = remote_class(tiny("vit", attention_type="fixed")).eval()  # the package's config, the checkpoint's code
pattern = model.layers[0].attention.sparse_pattern
assert type(model).__module__.startswith("transformers_modules") and type(pattern) is not SparsePattern
with torch.no_grad():
    assert torch.isfinite(model(pixel_values=torch.randn(1, 3, 16, 16)).last_hidden_state).all()
"""


def test_remote_model_code_builds_its_own_pattern_from_a_package_config(tmp_path):
    """Under trust_remote_code the config may come from the package and the model from the checkpoint: the model
    builds its pattern with its own `sparse_layouts`, whose class its kernels check."""
    from hf_vit_plus import ViTPlusModel

    ViTPlusModel(tiny("vit", attention_type="fixed")).save_pretrained(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run([sys.executable, "-c", REMOTE_WITH_PACKAGE_CONFIG, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


PACKAGE_AFTER_REMOTE = """
import sys, torch
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from hf_vit_plus import ViTPlusModel
from tests.models.test_sparse_settings import tiny
remote_class = get_class_from_dynamic_module("modeling_vit_plus.ViTPlusModel", sys.argv[1])
remote = remote_class(tiny("vit", attention_type="fixed")).eval()  # registers the copy's kernels by their names
package = ViTPlusModel(tiny("vit", attention_type="fixed")).eval()
package.load_state_dict(remote.state_dict())
with torch.no_grad():
    x = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(package(pixel_values=x).last_hidden_state, remote(pixel_values=x).last_hidden_state)
"""


def test_the_package_models_run_after_a_remote_code_copy_registered_its_kernels(tmp_path):
    """A remote-code copy of the model code, loaded in a process that imports the package, registers its sparse
    kernels under the same names: the package's own models then run the copy's kernels with their own patterns and
    layouts, which the kernels tell apart by class name (an isinstance check refused them)."""
    from hf_vit_plus import ViTPlusModel

    ViTPlusModel(tiny("vit", attention_type="fixed")).save_pretrained(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    proc = subprocess.run([sys.executable, "-c", PACKAGE_AFTER_REMOTE, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
