"""LoRA adapters (PEFT) on every family, trained through transformers' `Trainer`: the module names the README lists,
adapter save, reload onto a freshly loaded base with the trained logits, and `merge_and_unload`."""

from __future__ import annotations

import pytest
import torch

peft = pytest.importorskip("peft")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from hf_vit_plus.training.lora import LORA_TARGET_MODULES  # noqa: E402
from tests.conftest import MODEL_CASES  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("fresh_accelerate_state"),  # tests/conftest.py
    # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model (peft's, not ours)
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

# one case per family of the package (the first of each in the matrix)
FAMILY_CASES = {}
for _case in MODEL_CASES:
    FAMILY_CASES.setdefault(_case.family, _case)


class _Rows(torch.utils.data.Dataset):
    """The rows of one batch of inputs, one example each (Trainer's default collator stacks them back)."""

    def __init__(self, batch: dict):
        self.batch = batch

    def __len__(self) -> int:
        return len(next(iter(self.batch.values())))

    def __getitem__(self, i: int) -> dict:
        return {key: value[i] for key, value in self.batch.items()}


def _logits(model, inputs: dict) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**{k: v for k, v in inputs.items() if k != "labels"}, labels=inputs.get("labels")).logits


@pytest.mark.parametrize("family", sorted(FAMILY_CASES))
def test_lora_trains_through_trainer_saves_reloads_and_merges_with_the_same_logits(family, tmp_path):
    """The README's target modules (q_proj/k_proj/v_proj/o_proj in every family) adapt each family: three Trainer
    steps move the adapter; the saved adapter (adapter_model.safetensors + adapter_config.json naming the base folder)
    reloaded onto a base model loaded afresh gives the trained logits, and so does the merged model, which is a plain
    model of the family's class again."""
    case = FAMILY_CASES[family]
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    base = case.model()
    base.save_pretrained(base_dir)
    head_class = type(base)
    inputs = case.inputs(batch=4, labels=True)
    before = _logits(base, inputs)

    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(LORA_TARGET_MODULES), lora_dropout=0.0)
    model = get_peft_model(head_class.from_pretrained(base_dir), config)
    adapted = [name for name, module in model.named_modules() if name.endswith("q_proj") and hasattr(module, "lora_A")]
    assert adapted, f"no q_proj adapted in {family}"
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=2, learning_rate=5e-2,
        report_to=[], save_strategy="no", use_cpu=True, remove_unused_columns=False, logging_steps=1,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=_Rows(inputs))
    trainer.train()
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in trainer.state.log_history if "loss" in row)
    trained = _logits(model, inputs)
    finite = torch.isfinite(before)  # the image model gives its start token -inf
    assert (trained - before)[finite].abs().max() > 1e-3  # the adapter changed the model

    model.save_pretrained(adapter_dir)
    assert (adapter_dir / "adapter_model.safetensors").is_file() and (adapter_dir / "adapter_config.json").is_file()
    reloaded = PeftModel.from_pretrained(head_class.from_pretrained(base_dir), adapter_dir)
    assert reloaded.peft_config["default"].base_model_name_or_path == str(base_dir)
    torch.testing.assert_close(_logits(reloaded, inputs), trained, rtol=1e-5, atol=1e-5)

    merged = reloaded.merge_and_unload()
    assert type(merged) is head_class and not any("lora_" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, inputs), trained, rtol=1e-4, atol=1e-5)


def test_trainer_evaluates_an_adapted_image_model_on_pixel_values_alone(tmp_path):
    """The image model wrapped by PEFT: `Trainer.evaluate()` on images alone reports the model's loss (the hook of
    `hf_vit_plus.training.trainer_hooks` looks through the adapter to the base model's `loss_inputs`)."""
    case = FAMILY_CASES["image-lm"]
    inputs = case.inputs(batch=2)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(LORA_TARGET_MODULES), lora_dropout=0.0)
    model = get_peft_model(case.model(), config).eval()
    with torch.no_grad():
        expected = model(**inputs).loss.item()
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], use_cpu=True,
        remove_unused_columns=False,
    )  # fmt: skip
    metrics = Trainer(model=model, args=args).evaluate(_Rows(inputs))
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_the_guides_vit_target_modules_are_refused_by_peft_with_the_names_to_use():
    """`target_modules=["query", "value"]` (transformers' ViT names, as the image-classification LoRA guide writes
    them) match nothing here: PEFT refuses them. LORA_TARGET_MODULES lists what the README says to pass instead."""
    model = FAMILY_CASES["vit"].model()
    with pytest.raises(ValueError, match="query"):
        get_peft_model(model, LoraConfig(r=2, target_modules=["query", "value"]))
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    assert set(LORA_TARGET_MODULES) <= names


# ------------------------------------------------------------------------------------------ hf-vit-plus train --lora_r
def _tiny_digits_vit(folder):
    """A fresh tiny ViT for the built-in digits (8 x 8 grey, 10 classes) saved in `folder`: a base to adapt."""
    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
    from tests.utils import TINY_VIT_OVERRIDES

    overrides = dict(item.split("=") for item in TINY_VIT_OVERRIDES.split(","))
    config = ViTPlusConfig(**{k: int(v) if v.isdigit() else v for k, v in overrides.items()}, image_size=8,
                           patch_size=2, num_channels=1, num_labels=10)  # fmt: skip
    ViTPlusForImageClassification(config).save_pretrained(folder)
    return folder


def test_train_lora_saves_an_adapter_with_its_card_and_push_uploads_it(tmp_path, hub_server):
    """`hf-vit-plus train vit --model_name_or_path BASE --lora_r 4` trains only the adapter (and the new classifier)
    and leaves an adapter folder: adapter_model.safetensors + adapter_config.json naming BASE, no full weights, a
    card that names the base model and loads the adapter with the family's Auto class; reloaded onto BASE it gives
    the logits of the trained model. `hf-vit-plus push` uploads the folder (an adapter card rendered for a folder
    without README.md)."""
    import json

    from hf_vit_plus import ViTPlusForImageClassification
    from hf_vit_plus.cli import main
    from hf_vit_plus.hub.card import load_card_metadata
    from tests.utils import run_with_package

    base_dir, out = _tiny_digits_vit(tmp_path / "base"), tmp_path / "adapter"
    status = main(["train", "vit", "--model_name_or_path", str(base_dir), "--lora_r", "4", "--lora_target_modules",
                   "q_proj", "v_proj", "--output_dir", str(out), "--max_steps", "3", "--max_train_samples", "48",
                   "--max_eval_samples", "32", "--per_device_train_batch_size", "16", "--report_to", "none",
                   "--save_steps", "none"])  # fmt: skip
    assert status == 0
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and sorted(adapter_config["target_modules"]) == ["q_proj", "v_proj"]
    assert adapter_config["base_model_name_or_path"] == str(base_dir)
    assert adapter_config["modules_to_save"] == ["classifier"]
    card = (out / "README.md").read_text()
    assert str(base_dir) in card and "AutoModelForImageClassification" in card and "eval_accuracy" in card
    assert load_card_metadata(out / "README.md")["library_name"] == "peft"

    pixels = torch.rand(2, 1, 8, 8)
    tuned = PeftModel.from_pretrained(ViTPlusForImageClassification.from_pretrained(base_dir), out).eval()
    base = ViTPlusForImageClassification.from_pretrained(base_dir).eval()
    with torch.no_grad():
        assert (tuned(pixels).logits - base(pixels).logits).abs().max() > 1e-4

    result = run_with_package(
        f"""
        import contextlib, io, json, shutil
        from huggingface_hub import HfApi
        from hf_vit_plus.cli import main

        shutil.copytree({str(out)!r}, "bare", ignore=shutil.ignore_patterns("README.md"))
        with contextlib.redirect_stdout(io.StringIO()):
            codes = [main(["push", {str(out)!r}, "test-org/vit-lora", "--token", "hf_x"]),
                     main(["push", "bare", "test-org/vit-lora-bare", "--token", "hf_x"])]
        api = HfApi(token="hf_x")
        files = [sorted(api.list_repo_files(repo)) for repo in ("test-org/vit-lora", "test-org/vit-lora-bare")]
        readme = open(api.hf_hub_download("test-org/vit-lora-bare", "README.md")).read()
        print(json.dumps({{"codes": codes, "files": files, "readme": readme}}))
        """,
        cwd=tmp_path,
        env=hub_server.env(),
    )
    assert result["codes"] == [0, 0]
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(result["files"][0])
    assert "model.safetensors" not in result["files"][0]
    assert "library_name: peft" in result["readme"] and str(base_dir) in result["readme"]


def test_train_lora_stopped_and_resumed_saves_the_adapter_of_the_uninterrupted_run(tmp_path):
    """`train --lora_r` with dropout in the adapter, stopped after 4 of 12 updates and resumed from 'latest', logs
    the same losses and saves bitwise the adapter (and new classifier) of the run that was never stopped."""
    from safetensors.torch import load_file

    from hf_vit_plus.training.args import family_arguments
    from hf_vit_plus.training.loop import train

    base_dir = _tiny_digits_vit(tmp_path / "base")

    def run(name: str, **settings):
        return train(family_arguments(
            "vit", output_dir=str(tmp_path / name), model_name_or_path=str(base_dir), lora_r=4, lora_dropout=0.1,
            report_to="none", write_card=False, max_train_samples=96, max_eval_samples=32,
            per_device_train_batch_size=16, save_steps="100", logging_steps=1, num_train_epochs=2.0, **settings,
        ))  # fmt: skip

    full = run("full")
    stopped = run("split", stop_after_steps=4)
    assert stopped.interrupted and stopped.global_step == 4
    resumed = run("split", resume_from_checkpoint="latest")
    assert resumed.global_step == full.global_step == 12
    losses = [e["loss"] for e in full.log_history if "loss" in e]
    assert len(losses) == 12 and losses == [e["loss"] for e in resumed.log_history if "loss" in e]
    adapter, again = (load_file(tmp_path / run / "adapter_model.safetensors") for run in ("full", "split"))
    assert adapter.keys() == again.keys() and any("lora_A" in k for k in adapter)
    for key in adapter:
        assert torch.equal(adapter[key], again[key]), key


def test_adapter_card_puts_a_hub_base_model_in_the_metadata(tmp_path):
    """A Hub id as base model goes into the card's `base_model` (the Hub links adapter and base by it); a local
    folder stays in the text only (the Hub refuses a path there)."""
    from hf_vit_plus.hub.adapter import adapter_card

    (tmp_path / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}')
    card = adapter_card(tmp_path, family="sparse-lm", base_model="someone/sparse-lm-base")
    assert card.data.base_model == "someone/sparse-lm-base" and card.data.library_name == "peft"
    assert 'AutoModelForCausalLM.from_pretrained("someone/sparse-lm-base")' in card.text
    local = adapter_card(tmp_path, family="vit", base_model=str(tmp_path))
    assert local.data.base_model is None and str(tmp_path) in local.text


def test_lora_flags_are_checked_before_training(tmp_path):
    from hf_vit_plus.errors import UsageError
    from hf_vit_plus.training.args import family_arguments

    with pytest.raises(UsageError, match="--lora_r trains an adapter of a pre-trained model"):
        family_arguments("vit", output_dir=str(tmp_path), lora_r=4)
    with pytest.raises(UsageError, match="--lora_r must be a positive integer, got 0"):
        family_arguments("vit", output_dir=str(tmp_path), lora_r=0, model_name_or_path=str(tmp_path))
    with pytest.raises(UsageError, match="--lora_target_modules need --lora_r"):
        family_arguments("vit", output_dir=str(tmp_path), lora_target_modules=["q_proj"])
    model = FAMILY_CASES["vit"].model()
    from hf_vit_plus.training.lora import add_lora

    with pytest.raises(ValueError, match="--lora_target_modules query: no such linear layer .* q_proj"):
        add_lora(model, "vit", 2, target_modules=["query", "q_proj"])
    # `--lora_target_modules all-linear` arrives as a list: PEFT's keyword (it was refused as a layer name)
    adapted = add_lora(model, "vit", 2, target_modules=["all-linear"])
    adapted_layers = {name.rsplit(".", 1)[-1] for name in adapted.peft_config["default"].target_modules}
    assert {"q_proj", "fc1", "fc2"} <= adapted_layers


def test_adapter_card_links_figures_inside_its_folder_for_a_relative_output_dir(tmp_path, monkeypatch):
    """`--output_dir run` (relative): the curves are run/training_curves.png and the card, in run/, links
    training_curves.png (it linked run/training_curves.png, a broken image on the Hub)."""
    from hf_vit_plus.hub.adapter import adapter_card

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}')
    card = adapter_card("run", family="vit", base_model="someone/vit", figures=["run/training_curves.png"])
    assert "![training_curves](training_curves.png)" in card.text


@pytest.mark.parametrize(
    "family, auto_peft",
    [("seq2seq", "AutoPeftModelForSeq2SeqLM"), ("sparse-lm", "AutoPeftModelForCausalLM"),
     ("image-lm", "AutoPeftModelForCausalLM")],
)  # fmt: skip
def test_an_adapter_of_the_command_lines_loads_with_peft_auto_class(family, auto_peft, tmp_path):
    """The adapters `train --lora_r` saves name PEFT's task type of their family (`add_lora`, PEFT_TASK_TYPES), so
    `AutoPeftModelFor<Task>.from_pretrained(adapter)` loads the base through transformers' Auto class by itself,
    with the adapter's logits (without a task type PEFT refuses to import a base class outside its allowlist)."""
    import peft as peft_module

    from hf_vit_plus.training.lora import PEFT_TASK_TYPES, add_lora

    case = FAMILY_CASES[family]
    case.model().save_pretrained(tmp_path / "base")
    base_class = type(case.model())
    model = add_lora(base_class.from_pretrained(tmp_path / "base"), family, r=4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.1)  # a trained adapter (B starts at zero)
    model.save_pretrained(tmp_path / "adapter")
    saved = __import__("json").loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["task_type"] == PEFT_TASK_TYPES[family]
    inputs = case.inputs(labels=True)
    loaded = getattr(peft_module, auto_peft).from_pretrained(tmp_path / "adapter")
    assert type(loaded.get_base_model()) is base_class
    torch.testing.assert_close(_logits(loaded, inputs), _logits(model, inputs), rtol=1e-5, atol=1e-6)


def test_trainer_with_neftune_trains_the_seq2seq_model_on_noisy_embeddings(tmp_path):
    """`TrainingArguments(neftune_noise_alpha=5)`: Trainer hooks `get_input_embeddings()`, which is the module the
    seq2seq model runs, so the first training loss differs from a run without noise (same seed, same weights); the
    hook is gone after training."""
    case = FAMILY_CASES["seq2seq"]
    batch = case.inputs(batch=4, labels=True)
    losses = {}
    for alpha in (None, 5.0):
        model = case.model()
        args = TrainingArguments(
            str(tmp_path / f"run-{alpha}"), per_device_train_batch_size=4, max_steps=1, logging_steps=1,
            report_to="none", use_cpu=True, save_strategy="no", seed=0, neftune_noise_alpha=alpha,
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=_Rows(batch))
        trainer.train()
        losses[alpha] = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
        assert not model.get_input_embeddings()._forward_hooks  # NEFTune's hook removed after training
    assert losses[5.0] != losses[None], losses
