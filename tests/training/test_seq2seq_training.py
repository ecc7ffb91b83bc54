"""Learning test of the encoder-decoder Transformer: `Seq2SeqTrainer` with the paper's Adam + Noam schedule learns
number -> English words on held-out numbers, and the saved folder serves `pipeline("text2text-generation")`."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    pipeline,
    set_seed,
)

from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
from hf_vit_plus.data.number_words import load_number_words_dataset, number_to_words
from hf_vit_plus.models.pipeline_text2text_generation import Text2TextGenerationPipeline, save_text2text_pipeline
from hf_vit_plus.tokenization import train_bpe_tokenizer
from hf_vit_plus.training.schedules import get_noam_schedule, paper_adam
from tests.utils import run_without_package


def test_number_to_words_examples():
    assert number_to_words(0) == "zero"
    assert number_to_words(4021) == "four thousand twenty-one"
    assert number_to_words(700012) == "seven hundred thousand twelve"
    assert number_to_words(1_000_000_101) == "one billion one hundred one"
    assert number_to_words(90) == "ninety"
    with pytest.raises(ValueError, match="-1"):
        number_to_words(-1)
    with pytest.raises(TypeError, match="str"):
        number_to_words("12")


def test_number_words_dataset_is_deterministic_and_disjoint():
    a = load_number_words_dataset(max_number=999, num_test=100, seed=3)
    b = load_number_words_dataset(max_number=999, num_test=100, seed=3)
    assert a["test"]["source"][:] == b["test"]["source"][:]
    train, test = set(a["train"]["source"]), set(a["test"]["source"])
    assert len(test) == 100 and len(train) == 900 and not train & test
    assert all(number_to_words(int(s)) == t for s, t in zip(a["test"]["source"], a["test"]["target"]))
    with pytest.raises(ValueError, match="num_test"):
        load_number_words_dataset(max_number=99, num_test=100)


def test_seq2seq_trainer_learns_number_words_and_pipeline_serves_it(tmp_path):
    set_seed(0)
    torch.manual_seed(0)
    data = load_number_words_dataset(max_number=9999, num_test=200, seed=0)
    # Shared vocabulary trained on both sides of the training split only.
    tokenizer = train_bpe_tokenizer(
        list(data["train"]["source"]) + list(data["train"]["target"]), vocab_size=320, split_digits=True
    )

    def encode(batch):
        return tokenizer(batch["source"], text_target=batch["target"])

    encoded = data.map(encode, batched=True, remove_columns=["source", "target"])
    config = Seq2SeqTransformerConfig(
        vocab_size=len(tokenizer),
        d_model=128,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        dropout=0.0,
        max_position_embeddings=64,
        label_smoothing=0.1,  # smoothing in the model config: Seq2SeqTrainingArguments' would drop the labels
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    model = Seq2SeqTransformerForConditionalGeneration(config)
    model.generation_config = Seq2SeqTransformerForConditionalGeneration.paper_generation_config(
        config, max_new_tokens=16
    )
    # The paper's curve itself (factor 1): twice it reached 98.5% with one thread but diverged (0%) with two, where
    # the matmul sums in another order; factor 1 gives 99% / 96.5% on 1 / 2 threads.
    optimizer = paper_adam(model.parameters(), lr=1.0)
    scheduler = get_noam_schedule(optimizer, d_model=config.d_model, warmup_steps=150)

    def exact_match(eval_pred):
        predictions = tokenizer.batch_decode(eval_pred.predictions, skip_special_tokens=True)
        labels = [[t for t in row if t != -100] for row in eval_pred.label_ids.tolist()]
        references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"exact_match": sum(p.strip() == r.strip() for p, r in zip(predictions, references)) / len(references)}

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=64,
        per_device_eval_batch_size=100,
        num_train_epochs=6,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=50,
        predict_with_generate=True,
        generation_num_beams=1,  # greedy for the in-training evaluation: faster; the pipeline below uses beam 4
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=encoded["train"],
        eval_dataset=encoded["test"],
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        compute_metrics=exact_match,
    )
    trainer.train()
    metrics = trainer.evaluate()
    assert metrics["eval_exact_match"] >= 0.9, metrics

    # Save model + tokenizer + generation config (+ the pipeline module) and serve held-out numbers from the folder.
    folder = save_text2text_pipeline(trainer.model, tokenizer, tmp_path / "number_words")
    assert (folder / "generation_config.json").is_file() and (folder / "tokenizer.json").is_file()
    translator = pipeline("text2text-generation", model=str(folder), trust_remote_code=True)
    sources = list(data["test"]["source"][:20])
    outputs = translator(sources)
    predicted = [out[0]["generated_text"] for out in outputs]
    correct = sum(p == number_to_words(int(s)) for p, s in zip(predicted, sources))
    assert correct >= 18, list(zip(sources, predicted))
    same = pipeline("translation", model=str(folder), pipeline_class=Text2TextGenerationPipeline)
    # the translation task's key, as transformers' translation pipeline (and evaluate's evaluator) name it
    assert same(sources[0]) == [{"translation_text": predicted[0]}]

    # A user without the package: the same folder gives the same token ids, the same generated ids and the same
    # pipeline output through the code shipped in it (trust_remote_code), and is refused without it.
    batch = tokenizer(sources[:8], return_tensors="pt", padding=True)
    expected_ids = trainer.model.generate(**batch, num_beams=4, max_new_tokens=16).tolist()
    code = f"""
        import json, os, sys
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        path, sources = {str(folder)!r}, {sources[:8]!r}
        sys.stdin = open(os.devnull)
        try:
            AutoModelForSeq2SeqLM.from_pretrained(path)
            refused = False
        except ValueError as error:
            refused = "trust_remote_code" in str(error)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=True).eval()
        batch = tokenizer(sources, return_tensors="pt", padding=True)
        generated = model.generate(**batch, num_beams=4, max_new_tokens=16)
        translator = pipeline("translation", model=path, trust_remote_code=True)
        print()
        print(json.dumps({{
            "refused": refused,
            "module": type(model).__module__,
            "input_ids": batch["input_ids"].tolist(),
            "generated": generated.tolist(),
            "decoded": tokenizer.batch_decode(generated, skip_special_tokens=True),
            "pipeline": [out[0]["translation_text"] for out in translator(sources)],
        }}))
    """
    remote = run_without_package(code, cwd=tmp_path)
    assert remote["refused"] is True and not remote["module"].startswith("hf_vit_plus")
    assert remote["input_ids"] == batch["input_ids"].tolist()
    assert remote["generated"] == expected_ids
    assert remote["decoded"] == tokenizer.batch_decode(expected_ids, skip_special_tokens=True)
    assert remote["pipeline"] == predicted[:8]


def test_noam_schedule_values_and_peak():
    d_model, warmup = 512, 4000
    optimizer = paper_adam([torch.nn.Parameter(torch.zeros(1))])
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    scheduler = get_noam_schedule(optimizer, d_model=d_model, warmup_steps=warmup)
    rates = []
    for _ in range(12000):
        rates.append(optimizer.param_groups[0]["lr"])  # the rate the next update uses
        optimizer.step()
        scheduler.step()

    def paper(step):  # lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    for step in (1, 100, 3999, 4000, 4001, 8000, 12000):
        assert rates[step - 1] == pytest.approx(paper(step), rel=1e-12)
    assert rates[0] == pytest.approx(512**-0.5 * 4000**-1.5)
    peak = max(range(len(rates)), key=rates.__getitem__) + 1
    assert peak == warmup
    assert rates[warmup - 1] == pytest.approx(512**-0.5 * 4000**-0.5)  # about 7.0e-4
    # Warmup is linear, decay is inverse square root.
    assert rates[1999] == pytest.approx(rates[999] * 2)
    assert rates[11999] == pytest.approx(paper(4000) * (4000 / 12000) ** 0.5)
    # The scheduler's state survives a round trip (Trainer checkpoints save it).
    state = scheduler.state_dict()
    other = get_noam_schedule(paper_adam([torch.nn.Parameter(torch.zeros(1))]), d_model=8, warmup_steps=1)
    other.load_state_dict(state)
    assert other.lr_lambdas[0].d_model == d_model and other.get_last_lr() == scheduler.get_last_lr()


def test_noam_schedule_rejects_bad_values():
    optimizer = paper_adam([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="warmup_steps"):
        get_noam_schedule(optimizer, d_model=512, warmup_steps=0)
    with pytest.raises(ValueError, match="d_model"):
        get_noam_schedule(optimizer, d_model=-3, warmup_steps=10)


def test_warmup_cosine_schedule():
    from hf_vit_plus.training.schedules import get_warmup_cosine_schedule

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = get_warmup_cosine_schedule(optimizer, warmup_steps=10, total_steps=110)
    rates = []
    for _ in range(110):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 0.0 and rates[10] == pytest.approx(0.1)
    assert rates[60] == pytest.approx(0.05) and rates[-1] < 1e-3
    with pytest.raises(ValueError, match="total_steps=5"):
        get_warmup_cosine_schedule(optimizer, warmup_steps=10, total_steps=5)
