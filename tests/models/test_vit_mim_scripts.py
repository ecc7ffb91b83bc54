"""transformers' masked-image scripts (`examples/pytorch/image-pretraining/run_mim.py` with `Trainer`,
`run_mim_no_trainer.py` with a plain loop) on our ViT: the calls they make, on our own images, from scratch (a config
of `model_type` "vit_plus" or a `--config_name_or_path` folder) and from a masked-patch checkpoint, with the package
imported and as remote code. Both read `config.encoder_stride` and write it back with `config.update` (they stopped
with "'ViTPlusConfig' object has no attribute 'encoder_stride'")."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_plus import ViTPlusConfig, ViTPlusForMaskedImageModeling
from tests.utils import run_without_package

TINY = "image_size=16,patch_size=4,hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"
MASK_PATCH_SIZE = 8  # the scripts' --mask_patch_size: masked squares of 2 x 2 patches here


def _images(count: int = 4) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (20 + i, 18, 3), dtype=np.uint8)) for i in range(count)]


def _masks(config, count: int, seed: int = 0) -> torch.Tensor:
    """The scripts' mask generator: a random half of the `MASK_PATCH_SIZE` squares, each spread over the model's
    patches (its side in patches: mask patch size / `config.encoder_stride`), flattened to one flag per patch."""
    cells = config.image_size // MASK_PATCH_SIZE
    scale = MASK_PATCH_SIZE // config.encoder_stride
    g = torch.Generator().manual_seed(seed)
    masks = []
    for _ in range(count):
        cell = torch.zeros(cells * cells, dtype=torch.long)
        cell[torch.randperm(cells * cells, generator=g)[: (cells * cells + 1) // 2]] = 1
        grid = cell.view(cells, cells).repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        masks.append(grid.flatten())
    return torch.stack(masks)  # (count, patches)


def _adapt(config) -> None:
    """What both scripts do with a config before building the model (no --image_size/--patch_size/--encoder_stride
    flags: the config's own values, written back)."""
    config.update(
        {"image_size": config.image_size, "patch_size": config.patch_size, "encoder_stride": config.encoder_stride}
    )


def _batch(config, processor) -> dict[str, torch.Tensor]:
    from torchvision.transforms import Compose, Normalize, RandomResizedCrop, ToTensor

    transforms = Compose(
        [RandomResizedCrop(config.image_size), ToTensor(), Normalize(processor.image_mean, processor.image_std)]
    )
    images = _images()
    return {
        "pixel_values": torch.stack([transforms(image) for image in images]),
        "bool_masked_pos": _masks(config, len(images)),
    }


def test_encoder_stride_is_the_patch_size_saved_and_loaded_silently(tmp_path, caplog):
    from transformers import CONFIG_MAPPING, AutoConfig

    assert CONFIG_MAPPING["vit_plus"]().encoder_stride == 16
    config = ViTPlusConfig(image_size=16, patch_size=4)
    assert config.encoder_stride == 4
    config.update_from_string("image_size=32,patch_size=8")  # the scripts' --config_overrides: the stride follows
    assert config.encoder_stride == 8
    with caplog.at_level(logging.WARNING):
        ViTPlusConfig(image_size=16, patch_size=4, encoder_stride=4).save_pretrained(tmp_path)
        loaded = AutoConfig.from_pretrained(tmp_path)
    assert loaded.encoder_stride == 4 and "did you mean" not in caplog.text and "encoder_stride" not in caplog.text
    # set to another value, it stays, and masked image modeling names the mismatch
    config.update({"patch_size": 4, "encoder_stride": 8})
    assert config.encoder_stride == 8
    with pytest.raises(ValueError, match=r"`encoder_stride`=8 must equal `patch_size`=4"):
        ViTPlusForMaskedImageModeling(config)
    with pytest.raises(TypeError, match="encoder_stride"):
        ViTPlusConfig(encoder_stride=2.5)


def test_run_mim_from_scratch_and_from_the_checkpoint_with_the_package(tmp_path):
    from transformers import (
        CONFIG_MAPPING,
        AutoConfig,
        AutoImageProcessor,
        AutoModelForMaskedImageModeling,
        Trainer,
        TrainingArguments,
    )
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING

    # from scratch: --model_type vit_plus --config_overrides ...
    config = CONFIG_MAPPING["vit_plus"]()
    config.update_from_string(TINY)
    _adapt(config)
    processors = {conf.model_type: cls for conf, cls in IMAGE_PROCESSOR_MAPPING.items()}["vit_plus"]
    processor = (next(iter(processors.values())) if isinstance(processors, dict) else processors)()
    torch.manual_seed(0)
    model = AutoModelForMaskedImageModeling.from_config(config)
    assert type(model) is ViTPlusForMaskedImageModeling
    batch = _batch(config, processor)
    assert batch["bool_masked_pos"].shape == (4, config.num_patches)

    # run_mim.py: a Trainer step on the collated examples, then save_model
    examples = [{k: v[i] for k, v in batch.items()} for i in range(4)]
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=1, per_device_train_batch_size=4, report_to=[], use_cpu=True,
        save_strategy="no", learning_rate=1e-2,
    )  # fmt: skip
    collate = lambda items: {k: torch.stack([item[k] for item in items]) for k in items[0]}  # noqa: E731
    before = model.mpp_head.weight.detach().clone()
    trainer = Trainer(model=model, args=arguments, train_dataset=examples, data_collator=collate)
    result = trainer.train()
    assert np.isfinite(result.training_loss) and not torch.equal(model.mpp_head.weight, before)
    trainer.save_model(str(tmp_path / "mpp"))
    processor.save_pretrained(tmp_path / "mpp")

    # run_mim_no_trainer.py from the masked-patch checkpoint: --model_name_or_path, a plain loop step
    config = AutoConfig.from_pretrained(tmp_path / "mpp")
    _adapt(config)
    processor = AutoImageProcessor.from_pretrained(tmp_path / "mpp")
    model = AutoModelForMaskedImageModeling.from_pretrained(tmp_path / "mpp", config=config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(**_batch(config, processor)).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and config.encoder_stride == config.patch_size == 4


def test_run_mim_as_remote_code(tmp_path):
    torch.manual_seed(0)
    model = ViTPlusForMaskedImageModeling(
        ViTPlusConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64)
    )  # fmt: skip
    model.save_pretrained(tmp_path / "mpp")
    result = run_without_package(
        f"""
        import json, logging, torch
        from transformers import AutoConfig, AutoModelForMaskedImageModeling
        from transformers.utils import logging as hf_logging

        records = []
        hf_logging.get_logger().addHandler(logging.Handler())
        hf_logging.get_logger().handlers[-1].emit = lambda record: records.append(record.getMessage())
        path = {str(tmp_path / "mpp")!r}
        out = {{}}
        for how in ("scratch", "checkpoint"):
            config = AutoConfig.from_pretrained(path, trust_remote_code=True)
            config.update({{"image_size": config.image_size, "patch_size": config.patch_size,
                           "encoder_stride": config.encoder_stride}})
            if how == "scratch":  # --config_name_or_path: a new model of that config
                model = AutoModelForMaskedImageModeling.from_config(config, trust_remote_code=True)
            else:
                model = AutoModelForMaskedImageModeling.from_pretrained(path, config=config, trust_remote_code=True)
            torch.manual_seed(0)
            pixels = torch.rand(2, 3, 16, 16) * 2 - 1
            mask = torch.zeros(2, 16, dtype=torch.long)
            mask[:, ::3] = 1
            loss = model(pixel_values=pixels, bool_masked_pos=mask).loss
            loss.backward()
            torch.optim.AdamW(model.parameters(), lr=1e-2).step()
            out[how] = [config.encoder_stride, float(loss), type(model).__module__]
        out["warned"] = [r for r in records if "did you mean" in r or "encoder_stride" in r]
        print(json.dumps(out))
        """,
        cwd=tmp_path,
    )
    for how in ("scratch", "checkpoint"):
        stride, loss, module = result[how]
        assert stride == 4 and np.isfinite(loss) and not module.startswith("hf_vit_plus"), result
    assert result["warned"] == []
