"""Learning on real data: Trainer fine-tunes a small ViTPlus on scikit-learn's handwritten digits, and the
image-classification pipeline on the saved folder predicts held-out digits."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Trainer, TrainingArguments, pipeline

from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor
from hf_vit_plus.data import DIGIT_NAMES, load_digits_dataset


def test_trainer_fine_tunes_on_digits_and_pipeline_predicts(tmp_path):
    digits = load_digits_dataset(test_size=0.2, seed=0)  # stratified by label
    held_out_images, held_out_labels = digits["test"]["image"], digits["test"]["label"]
    config = ViTPlusConfig(
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=16,
        patch_size=4,
        num_labels=10,
        id2label=dict(enumerate(DIGIT_NAMES)),
        label2id={name: i for i, name in enumerate(DIGIT_NAMES)},
    )
    processor = ViTPlusImageProcessor.from_model_config(config)

    def preprocess(batch):
        pixel_values = processor(images=batch["image"], return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixel_values, "labels": batch["label"]}

    encoded = digits.map(preprocess, batched=True, remove_columns=["image", "label"]).with_format("torch")
    torch.manual_seed(0)
    model = ViTPlusForImageClassification(config)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=32,
        num_train_epochs=10,
        learning_rate=2e-3,
        weight_decay=0.05,
        warmup_steps=30,
        lr_scheduler_type="cosine",
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=encoded["train"],
        eval_dataset=encoded["test"],
        compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())},
    )
    trainer.train()
    accuracy = trainer.evaluate()["eval_accuracy"]
    assert accuracy >= 0.95, f"held-out accuracy {accuracy:.3f} < 0.95"

    saved = tmp_path / "digits-vit"
    trainer.save_model(saved)
    processor.save_pretrained(saved)
    classifier = pipeline("image-classification", model=str(saved), device="cpu")
    predictions = classifier(held_out_images[:60], top_k=1)
    predicted = [p[0]["label"] for p in predictions]
    truth = [DIGIT_NAMES[i] for i in held_out_labels[:60]]
    pipeline_accuracy = float(np.mean([p == t for p, t in zip(predicted, truth)]))
    assert pipeline_accuracy >= 0.93, f"pipeline accuracy {pipeline_accuracy:.3f} on held-out digits"
    assert set(predicted) <= set(DIGIT_NAMES)  # labels come from id2label
