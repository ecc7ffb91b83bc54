"""Bad inputs at the model boundary (forward, `generate`, the image processor, `from_pretrained`, the tokenizer
trainer) are a `ValueError` / `TypeError` naming the argument: one regression test per root cause that fuzzing
found (tests/test_fuzz_boundaries.py draws many more)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_plus import SparseTransformerForCausalLM, ViTPlusForImageClassification, ViTPlusImageProcessor
from hf_vit_plus.tokenization import train_bpe_tokenizer
from tests.conftest import MODEL_CASES

CASES = {case.id: case for case in MODEL_CASES}
IDS = torch.tensor([[3, 4, 5]])


@pytest.fixture(params=["sparse-lm-dense", "seq2seq-dense"])
def generator(request):
    return CASES[request.param].model()


@pytest.mark.parametrize(
    "arguments,error,message",
    [
        (dict(num_beams=0), ValueError, r"`num_beams` of `generate` must be an integer >= 1, got 0"),  # ZeroDivision
        (dict(num_beams=-1), ValueError, r"`num_beams` .* got -1"),  # "negative dimension"
        (dict(max_new_tokens="2"), TypeError, r"`max_new_tokens` .* got '2'"),  # '<=' between str and int
        (dict(num_return_sequences=0), ValueError, r"`num_return_sequences` .* got 0"),  # ran or crashed in max()
        (dict(num_beams=2.0), TypeError, r"`num_beams` .* got 2.0"),
        (dict(temperature=float("nan"), do_sample=True), ValueError, r"`temperature` .* finite positive"),
        (dict(top_p=1.5, do_sample=True), ValueError, r"`top_p` .* \(0, 1\], got 1.5"),
    ],
)
def test_generate_arguments_are_checked(generator, arguments, error, message):
    with pytest.raises(error, match=message):
        generator.generate(IDS, **{"max_new_tokens": 2, **arguments})


def test_generate_takes_a_tensor(generator):
    with pytest.raises(TypeError, match=r"`input_ids` of `generate` must be a torch.Tensor .*got list"):
        generator.generate([[3, 4, 5]], max_new_tokens=2)  # 'list' object has no attribute 'shape'


@pytest.mark.parametrize(
    "position_ids,error,message",
    [
        (torch.tensor([[-1, 0, 1]]), ValueError, r"`position_ids` must be >= 0, got -1"),  # IndexError in embedding
        (torch.tensor([[0.0, 1.0, 2.0]]), TypeError, r"`position_ids` must hold integer positions"),
        (torch.tensor([[0, 1]]), ValueError, r"`position_ids` must have shape \(1, 3\) or \(1, 3\).*got \(1, 2\)"),
        ([[0, 1, 2]], TypeError, r"`position_ids` must be a torch.Tensor, got list"),
    ],
)
def test_sparse_lm_position_ids_are_checked(position_ids, error, message):
    model = CASES["sparse-lm-dense"].model()
    with pytest.raises(error, match=message):
        model(IDS, position_ids=position_ids)
    torch.testing.assert_close(model(IDS, position_ids=torch.tensor([[0, 1, 2]])).logits, model(IDS).logits)


@pytest.mark.parametrize("case_id", ["sparse-lm-dense", "sparse-lm-strided-heads", "image-lm-dense"])
def test_an_empty_sequence_with_positions_names_both_lengths(case_id):
    """Zero tokens with one position each once ended in "RuntimeError: setStorage: sizes [2, 1] ... out of bounds"."""
    model = CASES[case_id].model()
    empty = torch.randint(3, 20, (2, 0))
    with pytest.raises(ValueError, match=r"`input_ids` is empty: shape \(2, 0\), 2 sequences of 0 tokens; "
                       r"`position_ids` has 1 per row \(shape \(2, 1\)\)"):  # fmt: skip
        model(input_ids=empty, position_ids=torch.arange(1).expand(2, -1))
    with pytest.raises(ValueError, match=r"`inputs_embeds` is empty: shape \(2, 0, 32\).*`position_ids` has 1"):
        model(inputs_embeds=torch.randn(2, 0, 32), position_ids=torch.arange(1).expand(2, -1))


def test_generate_refuses_an_empty_prompt(generator):
    """transformers indexed the last token of each prompt: "IndexError: index -1 is out of bounds"."""
    with pytest.raises(ValueError, match=r"`input_ids` of `generate` is empty: shape \(2, 0\), 2 prompts of 0"):
        generator.generate(torch.randint(3, 20, (2, 0)), max_new_tokens=2)


def test_vit_labels_follow_transformers():
    model = CASES["vit-dense"].model()
    pixels = torch.randn(3, 3, 32, 32)
    long = model(pixels, labels=torch.tensor([0, 1, 2])).loss
    torch.testing.assert_close(model(pixels, labels=torch.tensor([0, 1, 2], dtype=torch.int32)).loss, long)
    # -100 is ignored, as in transformers' ViT: the loss of the other two images
    ignored = model(pixels, labels=torch.tensor([0, -100, 2])).loss
    logits = model(pixels).logits
    torch.testing.assert_close(ignored, torch.nn.functional.cross_entropy(logits[[0, 2]], torch.tensor([0, 2])))
    with pytest.raises(ValueError, match=r"Label 7 is outside \[0, num_labels=3\)"):
        model(pixels, labels=torch.tensor([0, 7, 2]))


def test_vit_refuses_an_empty_batch_and_non_finite_pixels():
    model = CASES["vit-dense"].model()
    with pytest.raises(ValueError, match=r"`pixel_values` is an empty batch: shape \(0, 3, 32, 32\)"):
        model(torch.randn(0, 3, 32, 32))  # was an sdpa/reshape RuntimeError
    with pytest.raises(ValueError, match=r"`pixel_values` holds NaN or infinite values"):
        model(torch.full((1, 3, 32, 32), float("nan")))


@pytest.mark.parametrize(
    "images,error,message",
    [
        (None, ValueError, r"`images` is None"),
        ([], ValueError, r"`images` is an empty list"),  # IndexError
        (np.zeros((0, 5, 3), dtype=np.uint8), ValueError, r"`images` is empty: shape \(0, 5, 3\)"),
        (np.zeros((5, 5, 2), dtype=np.uint8), ValueError, r"neither its first nor its last axis holds 1"),
        (np.array([[object()]]), TypeError, r"`images` is an array of object values"),
        (np.full((5, 5, 3), np.nan, dtype=np.float32), ValueError, r"`images` holds NaN or infinite pixel values"),
        ([Image.new("RGB", (4, 4)), np.zeros((2, 2, 2, 2))], ValueError, r"`images\[1\]` has shape \(2, 2, 2, 2\)"),
    ],
)
def test_the_image_processor_names_bad_images(images, error, message):
    processor = ViTPlusImageProcessor.from_model_config(CASES["vit-dense"].config())
    with pytest.raises(error, match=message):
        processor(images=images, return_tensors="pt")


@pytest.fixture(scope="module")
def saved_vit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vit")
    CASES["vit-dense"].model().save_pretrained(folder)
    return folder


def test_weights_of_another_shape_are_named(saved_vit, tmp_path):
    config = json.loads((saved_vit / "config.json").read_text())
    shutil.copytree(saved_vit, tmp_path / "wider")
    (tmp_path / "wider" / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"6 tensor\(s\) of another shape: .*mlp.fc1.weight: checkpoint \(64, 32\) vs "
                       r"model \(96, 32\)"):  # fmt: skip
        ViTPlusForImageClassification.from_pretrained(tmp_path / "wider")


def test_a_folder_without_or_with_a_bad_config_json_is_named(saved_vit, tmp_path):
    (tmp_path / "weights_only").mkdir()
    shutil.copy(saved_vit / "model.safetensors", tmp_path / "weights_only")
    with pytest.raises(ValueError, match=r"has no config.json"):
        ViTPlusForImageClassification.from_pretrained(tmp_path / "weights_only")  # loaded paper defaults silently
    shutil.copytree(saved_vit, tmp_path / "number")
    (tmp_path / "number" / "config.json").write_text("3")
    with pytest.raises(ValueError, match=r"config.json' must hold a JSON object .*got a int"):
        ViTPlusForImageClassification.from_pretrained(tmp_path / "number")  # "argument of type 'int' is not iterable"


def test_a_foreign_model_type_is_refused_by_a_concrete_class(saved_vit):
    with pytest.raises(ValueError, match=r"holds a 'vit_plus' model, not a 'sparse_transformer' one"):
        SparseTransformerForCausalLM.from_pretrained(saved_vit)


@pytest.mark.parametrize(
    "vocab_size,error,message",
    [
        (2**40, ValueError, r"to 4,194,304, got 1099511627776"),  # tokenizers aborted the process (SIGABRT)
        ("300", TypeError, r"vocab_size must be an int"),
        (True, TypeError, r"vocab_size must be an int"),
    ],
)
def test_the_tokenizer_trainer_bounds_its_vocabulary(vocab_size, error, message):
    with pytest.raises(error, match=message):
        train_bpe_tokenizer(["some text"] * 4, vocab_size=vocab_size)
