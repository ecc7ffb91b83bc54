"""A saved ViTPlus checkpoint loads where hf_vit_plus is not installed, with trust_remote_code=True only."""

from __future__ import annotations

import json

import numpy as np
import torch
from PIL import Image

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor
from tests.utils import run_without_package


def test_remote_code_load_in_a_fresh_process_without_the_package(tmp_path):
    torch.manual_seed(0)
    config = ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=3,
        id2label={0: "cat", 1: "dog", 2: "owl"},
        label2id={"cat": 0, "dog": 1, "owl": 2},
    )
    model = ViTPlusForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=0.5)
    processor = ViTPlusImageProcessor.from_model_config(config)
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)

    image = Image.fromarray((np.random.default_rng(0).random((40, 50, 3)) * 255).astype(np.uint8))
    image.save(tmp_path / "image.png")
    pixel_values = processor(images=image, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected = model(pixel_values).logits[0].tolist()
        expected_pooled = model.vit(pixel_values).pooler_output[0].tolist()

    result = run_without_package(
        f"""
        import json
        import torch
        from PIL import Image
        from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification, pipeline

        try:
            import hf_vit_plus  # noqa: F401
            blocked = False
        except ModuleNotFoundError:
            blocked = True
        refusals = 0
        for cls in (AutoConfig, AutoModelForImageClassification):
            try:
                cls.from_pretrained({str(checkpoint)!r}, trust_remote_code=False)
            except Exception:
                refusals += 1
        path = {str(checkpoint)!r}
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        model = AutoModelForImageClassification.from_pretrained(path, trust_remote_code=True).eval()
        body = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
        processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=True)
        image = Image.open({str(tmp_path / "image.png")!r})
        pixel_values = processor(images=image, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            logits = model(pixel_values).logits[0].tolist()
            pooled = body(pixel_values).pooler_output[0].tolist()
        top = pipeline("image-classification", model=path, trust_remote_code=True)(image, top_k=1)[0]["label"]
        print(json.dumps(dict(
            blocked=blocked, refusals=refusals, config_class=type(config).__name__,
            model_module=type(model).__module__,
            model_class=type(model).__name__, body_class=type(body).__name__,
            processor_class=type(processor).__name__, logits=logits, pooled=pooled, top=top,
        )))
        """,
        cwd=tmp_path,
    )
    assert result["blocked"], "the subprocess could import hf_vit_plus"
    assert result["refusals"] == 2, "loading without trust_remote_code must refuse"
    assert result["config_class"] == "ViTPlusConfig"
    assert result["model_class"] == "ViTPlusForImageClassification"
    assert result["model_module"].startswith("transformers_modules"), result["model_module"]
    assert result["body_class"] == "ViTPlusModel"
    assert result["processor_class"] == "ViTPlusImageProcessor"
    np.testing.assert_allclose(result["logits"], expected, atol=1e-5)
    np.testing.assert_allclose(result["pooled"], expected_pooled, atol=1e-5)
    assert result["top"] == config.id2label[int(np.argmax(expected))]
    saved = json.loads((checkpoint / "config.json").read_text())
    assert set(saved["auto_map"]) >= {"AutoConfig", "AutoModel", "AutoModelForImageClassification"}


def test_remote_code_pipeline_turns_rgb_files_grey_for_a_one_channel_model(tmp_path):
    """The grey conversion lives in the processor shipped with the checkpoint, so it works without the package."""
    torch.manual_seed(0)
    config = ViTPlusConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=8,
        patch_size=4,
        num_channels=1,
        num_labels=3,
    )
    model = ViTPlusForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=1.0)
    processor = ViTPlusImageProcessor.from_model_config(config)
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)
    image = Image.fromarray((np.random.default_rng(0).random((20, 24, 3)) * 255).astype(np.uint8))
    image.save(tmp_path / "image.png")
    with torch.no_grad():
        grey = processor(images=image.convert("L"), return_tensors="pt")["pixel_values"]
        expected = model(grey).logits.softmax(-1)[0].tolist()

    result = run_without_package(
        f"""
        import json
        from transformers import AutoVideoProcessor, pipeline

        classifier = pipeline("image-classification", model={str(checkpoint)!r}, trust_remote_code=True)
        predictions = classifier({str(tmp_path / "image.png")!r}, top_k=3)
        try:
            AutoVideoProcessor.from_pretrained({str(checkpoint)!r}, trust_remote_code=True)
            video = "loaded"
        except ValueError as err:
            video = str(err)
        print(json.dumps(dict(
            processor_module=type(classifier.image_processor).__module__,
            scores={{p["label"]: p["score"] for p in predictions}},
            video=video,
        )))
        """,
        cwd=tmp_path,
    )
    assert result["processor_module"].startswith("transformers_modules"), result["processor_module"]
    assert "has no video processor" in result["video"], result["video"]  # the remote code says so too
    got = [result["scores"][config.id2label[i]] for i in range(3)]
    np.testing.assert_allclose(got, expected, atol=1e-6)
