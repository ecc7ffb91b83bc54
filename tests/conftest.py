"""Fixtures shared by the tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

# Deprecation notices that the ecosystem logs (instead of a FutureWarning, which pyproject's filterwarnings turns into
# an error): transformers 5.24 announced the rename of `past_key_values` to `cache` only this way. Each test fails on
# one that our code causes, so that the next rename is found while the old name still works. A notice that cannot be
# avoided goes here by its exact text, with the reason.
ECOSYSTEM_LOGGERS = ("transformers", "accelerate", "huggingface_hub", "datasets", "torch")
ALLOWED_DEPRECATION_NOTICES: dict[str, str] = {}
# The same, by the notice's beginning, where the rest of its text varies from run to run (a set's order).
ALLOWED_DEPRECATION_NOTICE_PREFIXES: dict[str, str] = {
    "Passing `generation_config` together with generation-related arguments=": (
        "transformers 5.17's TextGenerationPipeline._forward adds the pipeline's own generation_config to the call's "
        "generation arguments (later releases pass only the arguments): any pipeline('text-generation') call with "
        "max_new_tokens and the like logs it on the oldest supported release"
    ),
}


class _DeprecationNotices(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deprecat" not in message.lower() or message in ALLOWED_DEPRECATION_NOTICES:
            return
        if not message.startswith(tuple(ALLOWED_DEPRECATION_NOTICE_PREFIXES)):
            self.messages.append(f"{record.name}: {message}")


@pytest.fixture(scope="session", autouse=True)
def package_logs_reach_caplog():
    """hf_vit_plus's root logger has its own handler and does not propagate (hf_vit_plus.utils.logging), as
    transformers' does: let its records through to the root logger, where pytest's `caplog` listens."""
    from hf_vit_plus.utils import logging as package_logging

    package_logging.enable_propagation()
    yield
    package_logging.disable_propagation()


@pytest.fixture(scope="session", autouse=True)
def step_cache_of_the_session(tmp_path_factory):
    """FastDecoding keeps its compiled steps in a folder of the session (HF_VIT_PLUS_STEP_CACHE), not in the user's
    cache: a step that a test compiles is not there for the next run, whose counts of compilations it would change.
    Subprocesses inherit it."""
    import os

    folder = tmp_path_factory.mktemp("compiled_steps")
    previous = os.environ.get("HF_VIT_PLUS_STEP_CACHE")
    os.environ["HF_VIT_PLUS_STEP_CACHE"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("HF_VIT_PLUS_STEP_CACHE", None)
    else:
        os.environ["HF_VIT_PLUS_STEP_CACHE"] = previous


@pytest.fixture(autouse=True)
def no_deprecation_notices():
    """Fails the test when transformers, accelerate, huggingface_hub, datasets or torch logs a deprecation notice."""
    warning_once = getattr(logging.Logger, "warning_once", None)  # transformers' once-per-process cache
    if warning_once is not None and hasattr(warning_once, "cache_clear"):
        warning_once.cache_clear()
    handler = _DeprecationNotices()
    loggers = [logging.getLogger(name) for name in ECOSYSTEM_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    if handler.messages:
        pytest.fail("deprecation notices logged during the test:\n" + "\n".join(handler.messages), pytrace=False)


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory):
    """A loopback Hub server (tests/hub_server.py) for the whole session; stopped at the end of it.

    Point a subprocess at it with `hub_server.env()` (HF_ENDPOINT, HF_HUB_OFFLINE=0, HF_HUB_DISABLE_XET=1).
    """
    from tests.hub_server import HubServer

    server = HubServer(tmp_path_factory.mktemp("hub_server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_accelerate_state():
    """Each `train` call builds its own Accelerator, and forked workers must not inherit this process's: Accelerate
    keeps process-wide singletons, so reset them before and after the test."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# ------------------------------------------------------------------------------------------------------------------
# The model matrix of the common suite (tests/test_common.py): every family, head and attention variant as a tiny
# config. Each case builds its config, its model classes and a batch of inputs; checks that do not apply to a case
# (generation for the ViT, image size for the LMs) ask the case and skip.


@dataclass(frozen=True)
class ModelCase:
    """One cell of the family x variant matrix."""

    id: str
    family: str  # a family id of `hf_vit_plus.families.FAMILIES`: "vit", "vit-mpp", "seq2seq", "sparse-lm", "image-lm"
    config_fields: dict = field(default_factory=dict)

    @property
    def record(self):
        """The family's record (`hf_vit_plus.families`): the classes come from there."""
        from hf_vit_plus.families import get_family

        return get_family(self.family)

    @property
    def config_class(self):
        return self.record.config_class

    @property
    def head_class(self):
        return self.record.head_class

    @property
    def base_class(self):
        return self.record.base_class

    @property
    def auto_head(self) -> str:
        return self.record.head

    @property
    def vision(self) -> bool:
        """A ViT encoder (image classifier or masked patch prediction): pixels in, no token positions."""
        return self.family in ("vit", "vit-mpp")

    @property
    def generative(self) -> bool:
        return self.head_class.can_generate()

    @property
    def sparse(self) -> bool:
        kind = self.config_fields.get("attention_type", self.config_fields.get("encoder_attention_type", "dense"))
        return kind != "dense"

    def config(self, **overrides):
        fields = {**TINY_CONFIGS[self.family], **self.config_fields, **overrides}
        if self.family == "image-lm":  # the fields the image size fixes, then the case's
            height, width = fields.pop("image_size")
            return self.config_class.for_images(height, width, **fields)
        return self.config_class(**fields)

    def model(self, head: bool = True, seed: int = 0, **overrides):
        """A tiny model in eval mode with non-trivial weights everywhere (the ViT's heads large enough to matter)."""
        import torch

        torch.manual_seed(seed)
        model = (self.head_class if head else self.base_class)(self.config(**overrides))
        if head and self.family == "vit":
            for name in ("classifier", "distillation_classifier"):  # small at init: logits nearly alike
                if isinstance(getattr(model, name, None), torch.nn.Linear):
                    torch.nn.init.normal_(getattr(model, name).weight, std=0.5)
        return model.eval()

    def inputs(self, batch: int = 2, seed: int = 1, labels: bool = False) -> dict:
        """A batch of valid model inputs; seq2seq and LM batches include a right-padded row."""
        import torch

        g = torch.Generator().manual_seed(seed)
        if self.family == "image-lm":
            height, width = TINY_CONFIGS["image-lm"]["image_size"]
            pixels = torch.randint(0, 256, (batch, 1, height, width), generator=g, dtype=torch.uint8)
            out = {"pixel_values": pixels}
            if labels:  # the head's own loss needs none; given, they are aligned with the pixels
                out["labels"] = pixels.reshape(batch, -1).long()
                out["labels"][-1, -9:] = -100  # micro-batches of unequal label counts (Trainer's accumulation)
            return out
        if self.family == "vit":
            fields = TINY_CONFIGS["vit"]
            out = {"pixel_values": torch.randn(batch, 3, fields["image_size"], fields["image_size"], generator=g)}
            if labels:
                out["labels"] = torch.randint(0, fields["num_labels"], (batch,), generator=g)
            return out
        if self.family == "vit-mpp":  # images with half of their patches corrupted, as `corrupt_patches` makes them
            from hf_vit_plus import corrupt_patches

            size = TINY_CONFIGS["vit-mpp"]["image_size"]
            inputs = corrupt_patches(torch.randn(batch, 3, size, size, generator=g), self.config(), generator=g)
            return inputs if labels else {k: v for k, v in inputs.items() if k != "labels"}
        vocab = TINY_CONFIGS[self.family]["vocab_size"]
        length = 11  # not a multiple of the sparse strides: the kernels pad
        ids = torch.randint(3, vocab, (batch, length), generator=g)
        mask = torch.ones(batch, length, dtype=torch.long)
        if batch > 1:
            ids[-1, -3:] = 0
            mask[-1, -3:] = 0
        if self.family == "seq2seq":
            tgt = torch.randint(3, vocab, (batch, 7), generator=g)
            out = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": tgt}
            if labels:
                out = {"input_ids": ids, "attention_mask": mask, "labels": tgt}
            return out
        out = {"input_ids": ids, "attention_mask": mask}
        if labels:
            out["labels"] = ids.masked_fill(mask == 0, -100)
        return out

    def base_inputs(self, batch: int = 2, seed: int = 1) -> dict:
        """The inputs of the base model (`base_class`): the head's, except for the image model, whose body reads the
        pixels as tokens shifted right by the start token, and masked patch prediction's (no masked patches)."""
        import torch

        inputs = self.inputs(batch=batch, seed=seed)
        if self.family == "vit-mpp":  # the bare encoder (AutoModel) has no [mask] embedding: the images alone
            return {"pixel_values": inputs["pixel_values"]}
        if self.family != "image-lm":
            return inputs
        tokens = inputs["pixel_values"].reshape(batch, -1).long()  # (B, H*W): grey, raster order
        start = torch.full((batch, 1), self.config().bos_token_id)
        return {"input_ids": torch.cat([start, tokens[:, :-1]], dim=1)}


TINY_CONFIGS = {
    "vit": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=4,  # an 8 x 8 grid: 65 tokens, not a multiple of the stride
        num_labels=3,
    ),
    # the same encoder pre-trained by masked patch prediction (8 x 8 patches of 3 channels: 512 colour classes)
    "vit-mpp": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=4,
    ),  # fmt: skip
    "seq2seq": dict(
        vocab_size=20,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        dropout=0.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    ),
    "sparse-lm": dict(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        sparse_stride=4,
        sparse_summary_size=1,
    ),
    # `SparseTransformerConfig.for_images(5, 7, ...)`: 35 grey pixels, a stride of one row (7) unless a case sets one
    "image-lm": dict(
        image_size=[5, 7],
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    ),
}

MODEL_CASES = [
    ModelCase("vit-dense", "vit"),
    ModelCase("vit-strided", "vit", {"attention_type": "strided"}),
    ModelCase("vit-fixed", "vit", {"attention_type": "fixed"}),
    # sliding window of one patch row, the class token global (the default of `sparse_summary_size` for "local")
    ModelCase("vit-local", "vit", {"attention_type": "local"}),
    # DeiT's distillation token and head (the model's logits: the mean of the two heads)
    ModelCase("vit-distilled", "vit", {"use_distillation_token": True}),
    # the paper's hybrid (sec. 3.1): a convolutional stem of two stride-2 layers brings 32 px to the 8 x 8 patch grid
    ModelCase("vit-hybrid", "vit", {"conv_stem_layers": 2, "conv_stem_channels": 8}),
    # masked patch prediction (sec. 4.6), its own head on the same encoder
    ModelCase("vit-mpp", "vit-mpp"),
    ModelCase("seq2seq-dense", "seq2seq"),
    # What a converted opus-mt checkpoint uses (hf_vit_plus.conversion.seq2seq_from_marian).
    ModelCase(
        "seq2seq-marian",
        "seq2seq",
        {
            "activation_function": "swish",
            "sinusoid_layout": "halves",
            "add_final_logits_bias": True,
            "decoder_start_token_id": 0,
        },
    ),
    ModelCase(
        "seq2seq-strided",
        "seq2seq",
        {"encoder_attention_type": "strided", "encoder_sparse_stride": 4, "encoder_sparse_summary_size": 1},
    ),
    ModelCase(
        "seq2seq-fixed",
        "seq2seq",
        {"encoder_attention_type": "fixed", "encoder_sparse_stride": 4, "encoder_sparse_summary_size": 1},
    ),
    ModelCase(
        "seq2seq-local",
        "seq2seq",
        {"encoder_attention_type": "local", "encoder_sparse_stride": 3, "encoder_sparse_summary_size": 1},
    ),
    ModelCase("sparse-lm-dense", "sparse-lm", {"attention_type": "dense"}),
    *(
        ModelCase(f"sparse-lm-{kind}-{mode}", "sparse-lm", {"attention_type": kind, "sparse_pattern_mode": mode})
        for kind in ("strided", "fixed")
        for mode in ("merged", "interleaved", "heads")
    ),
    # a window of 5 tokens and 2 global tokens (attention sinks), each head one part
    ModelCase(
        "sparse-lm-local-heads",
        "sparse-lm",
        {"attention_type": "local", "sparse_pattern_mode": "heads", "sparse_stride": 5, "sparse_summary_size": 2},
    ),
    ModelCase("image-lm-dense", "image-lm", {"attention_type": "dense"}),
    # what `hf-vit-plus train image-lm` builds: strided, a stride of one image row, one part per head
    ModelCase("image-lm-strided-heads", "image-lm", {"attention_type": "strided", "sparse_pattern_mode": "heads"}),
    # strides that do not divide the 35 pixels: the block kernels pad the sequence to 36
    ModelCase(
        "image-lm-strided-merged",
        "image-lm",
        {"attention_type": "strided", "sparse_pattern_mode": "merged", "sparse_stride": 4},
    ),
    ModelCase(
        "image-lm-fixed-heads",
        "image-lm",
        {"attention_type": "fixed", "sparse_pattern_mode": "heads", "sparse_stride": 4, "sparse_summary_size": 1},
    ),
    # a window of one image row plus the start token as a global token, merged
    ModelCase("image-lm-local-merged", "image-lm", {"attention_type": "local", "sparse_summary_size": 1}),
]


@pytest.fixture(params=MODEL_CASES, ids=[case.id for case in MODEL_CASES])
def model_case(request) -> ModelCase:
    return request.param


@pytest.fixture(
    params=[case for case in MODEL_CASES if case.generative],
    ids=[case.id for case in MODEL_CASES if case.generative],
)
def generative_case(request) -> ModelCase:
    return request.param


# The files that take longest, longest first (`--durations` of a full run): `make test` hands whole files to its two
# pytest-xdist workers (`--dist loadfile`) in collection order, and a long file handed out last kept one worker busy
# while the other had finished. Started first, they run beside the short files, which then fill both workers.
LONGEST_FILES = (
    "tests/test_doc_examples.py",
    "tests/test_common.py",
    "tests/models/test_fast_decoding.py",
    "tests/scripts/test_bench_result_files.py",
    "tests/models/test_compiled_decoding.py",
    "tests/training/test_training_loop.py",
    "tests/hub/test_space.py",
    "tests/test_light_package.py",
    "tests/training/test_seq2seq_training.py",
    "tests/models/test_export.py",
    "tests/training/test_vit_learning.py",
    "tests/training/test_image_lm.py",
    "tests/scripts/test_gpu_check.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(LONGEST_FILES)}
    # a stable sort: the other files, and the tests within each file, keep their order
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
