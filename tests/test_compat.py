"""The supported range of transformers (and torch) releases: what changed between them and the package relies on.

These run on whatever releases are installed: `make test` on the newest the registry offers, `make test-oldest` on
the lower bounds of pyproject.toml (.ci/constraints-oldest.txt). With HF_VIT_PLUS_OTHER_PYTHON set to the
interpreter of the other environment (`make test-oldest` sets it to .venv's), a checkpoint saved under one release
is also loaded and run through remote code under the other, both ways.
"""

from __future__ import annotations

import ast
import copy
import json
import logging
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainingArguments

from hf_vit_plus.models import compat
from hf_vit_plus.models.compat import CACHE_NAME, cache_from_kwargs, output_cache, resolve_cache
from tests.conftest import MODEL_CASES
from tests.test_common import _prompt
from tests.utils import REPO_ROOT, run_without_package

CASES = {case.id: case for case in MODEL_CASES}
# one case per generative family and attention kind
CACHED_CASES = [
    "seq2seq-dense",
    "seq2seq-strided",
    "sparse-lm-dense",
    "sparse-lm-strided-heads",
    "image-lm-fixed-heads",
]


def _first_and_next(case):
    """A prompt step that fills a cache, and the inputs of the next step on top of it (one new token per row)."""
    model = case.model()
    prompt = _prompt(case)
    if case.family == "seq2seq":
        start = torch.full((2, 1), model.config.decoder_start_token_id)
        first = dict(prompt, decoder_input_ids=start, use_cache=True)
        step = dict(prompt, decoder_input_ids=torch.full((2, 1), 5), use_cache=True)
    else:
        first = dict(prompt, use_cache=True)
        mask = prompt.get("attention_mask")
        step = dict(input_ids=torch.full((2, 1), 5), use_cache=True)
        if mask is not None:
            step["attention_mask"] = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
    return model, first, step


@pytest.mark.parametrize("case_id", CACHED_CASES)
def test_forward_takes_the_cache_under_either_name_and_returns_it_where_transformers_reads_it(case_id):
    model, first, step = _first_and_next(CASES[case_id])
    with torch.no_grad():
        out = model(**first)
        cache = output_cache(out)
        assert cache is not None and cache.get_seq_length() > 0
        assert CACHE_NAME in out.keys()  # generate reads `outputs[CACHE_NAME]`
        new = model(**step, cache=copy.deepcopy(cache))
        old = model(**step, past_key_values=copy.deepcopy(cache))
        same = model(**step, cache=cache, past_key_values=cache)  # the same object twice is no conflict
    torch.testing.assert_close(new.logits, old.logits, rtol=0, atol=0)
    torch.testing.assert_close(same.logits, new.logits, rtol=0, atol=0)
    assert output_cache(new).get_seq_length() == cache.get_seq_length()
    with pytest.raises(ValueError, match=r"Pass the cache once, as `cache`.*not both"):
        model(**step, cache=copy.deepcopy(cache), past_key_values=copy.deepcopy(cache))


def test_resolve_cache_and_cache_from_kwargs():
    marker = object()
    assert resolve_cache(None, None) is None
    assert resolve_cache(marker, None) is marker and resolve_cache(None, marker) is marker
    assert cache_from_kwargs({"cache": marker}) is marker and cache_from_kwargs({"past_key_values": marker}) is marker
    assert cache_from_kwargs({"cache": None, "past_key_values": marker}) is marker
    assert cache_from_kwargs({}) is None


@pytest.mark.parametrize("case_id", ["sparse-lm-dense", "sparse-lm-fixed-heads", "seq2seq-dense"])
def test_batched_generation_with_padding_equals_each_row_alone(case_id):
    """transformers 5.24 passes the cache as `cache=`: a forward that read only `past_key_values` saw no cache, and
    a left-padded batch failed with "attention_mask has shape (2, 7) but input_ids of shape (2, 1) needs ...". This
    is what `pipeline("text-generation")` does with a batch."""
    case = CASES[case_id]
    model = case.model()
    prompt = _prompt(case)
    settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1)
    with torch.no_grad():
        batched = model.generate(**prompt, **settings)
        for row in range(2):
            keep = prompt["attention_mask"][row].bool()
            alone = model.generate(input_ids=prompt["input_ids"][row : row + 1, keep], **settings)
            torch.testing.assert_close(batched[row, -6:], alone[0, -6:], rtol=0, atol=0)


@pytest.mark.parametrize("case_id", ["seq2seq-dense", "sparse-lm-strided-merged", "image-lm-dense"])
@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_generate_logs_no_deprecation_notice(case_id, cache_implementation, no_deprecation_notices):
    """On 5.24 the old cache names still work but log "`past_key_values`/`cache_params` are deprecated" on every
    call (a logged notice, not a warning): our code must not cause one, on any release."""
    case = CASES[case_id]
    model = case.model()
    extra = {"cache_implementation": "static", "disable_compile": True} if cache_implementation else {}
    with torch.no_grad():
        model.generate(**_prompt(case), max_new_tokens=4, min_new_tokens=4, do_sample=False, **extra)
    assert no_deprecation_notices.messages == []


def test_the_deprecation_guard_sees_notices_logged_by_transformers(no_deprecation_notices):
    logging.getLogger("transformers.generation.utils").warning("`past_key_values` is deprecated. Use `cache`.")
    assert no_deprecation_notices.messages == [
        "transformers.generation.utils: `past_key_values` is deprecated. Use `cache`."
    ]
    no_deprecation_notices.messages.clear()  # seen: the test itself passes


@pytest.mark.parametrize("case_id", ["seq2seq-dense", "sparse-lm-dense"])
def test_trainer_predictions_leave_the_cache_out(case_id, tmp_path):
    """Trainer drops the output fields the config lists in `keys_to_ignore_at_inference`; a cache left in the
    predictions breaks their concatenation (the field is `cache` from 5.24, `past_key_values` before)."""
    from datasets import Dataset

    case = CASES[case_id]
    model = case.model(use_cache=True)
    inputs = case.inputs(batch=4, labels=True)
    dataset = Dataset.from_dict({name: value.tolist() for name, value in inputs.items()}).with_format("torch")
    args = TrainingArguments(tmp_path, per_device_eval_batch_size=2, report_to="none", use_cpu=True)
    prediction = Trainer(model=model, args=args).predict(dataset)
    logits = prediction.predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    assert logits.shape[:2] == inputs["labels"].shape and logits.shape[-1] == model.config.vocab_size
    assert set(model.config.keys_to_ignore_at_inference) >= {"cache", "past_key_values"}


def test_version_dependent_code_lives_in_compat_only():
    """No module of the package but models/compat.py reads a release number or compares versions."""
    suspicious = ("__version__", "version.parse", "parse_version", "is_torch_greater", "packaging.version")
    allowed = {REPO_ROOT / "hf_vit_plus" / "models" / "compat.py", REPO_ROOT / "hf_vit_plus" / "__init__.py"}
    offenders = []
    for path in sorted((REPO_ROOT / "hf_vit_plus").rglob("*.py")):
        if path in allowed:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.Call, ast.Compare)) else ""
            if isinstance(node, ast.Compare) and any(name in text for name in suspicious):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {text}")
            elif isinstance(node, ast.Call) and any(name in text.split("(")[0] for name in suspicious[1:]):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {text}")
    assert offenders == []


def test_cpu_flash_ops_are_found_on_the_installed_torch_or_refused_for_a_public_fallback(monkeypatch):
    ops = compat.cpu_flash_attention_ops()
    assert ops is not None, "torch changed its flash-for-CPU ops: check the schemas in compat.py"
    monkeypatch.setattr(compat, "FLASH_FORWARD_SCHEMA", compat.FLASH_FORWARD_SCHEMA + " ")
    assert compat.cpu_flash_attention_ops() is None  # a changed schema is never called


# ------------------------------------------------------------------------------------ remote code, fresh processes
REMOTE_RUN = """
    import json, logging, warnings
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    import transformers

    notices = []
    class Notices(logging.Handler):
        def emit(self, record):
            if "deprecat" in record.getMessage().lower():
                notices.append(record.getMessage())
    logging.getLogger("transformers").addHandler(Notices())
    results = {{"transformers": transformers.__version__}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, auto in (("seq2seq", AutoModelForSeq2SeqLM), ("sparse-lm", AutoModelForCausalLM)):
            model = auto.from_pretrained({folder!r} + "/" + name, trust_remote_code=True).eval()
            ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 7, 8, 9, 10]])
            mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
            settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
            with torch.no_grad():
                results[name] = {{
                    "logits": model(input_ids=ids, attention_mask=mask, **({{"decoder_input_ids": ids[:, :2]}}
                                    if name == "seq2seq" else {{}})).logits.sum().item(),
                    "greedy": model.generate(input_ids=ids, attention_mask=mask, num_beams=1, **settings).tolist(),
                    "beam": model.generate(input_ids=ids, attention_mask=mask, num_beams=2, **settings).tolist(),
                    "static": model.generate(input_ids=ids, attention_mask=mask, num_beams=1, disable_compile=True,
                                             cache_implementation="static", **settings).tolist(),
                }}
    results["warnings"] = [f"{{w.category.__name__}}: {{w.message}}" for w in caught
                           if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    results["notices"] = notices
    print(json.dumps(results))
"""


def _save_checkpoints(folder: Path) -> None:
    """A seq2seq and a sparse LM checkpoint, each saved with its remote code."""
    for name, case_id in (("seq2seq", "seq2seq-dense"), ("sparse-lm", "sparse-lm-fixed-heads")):
        CASES[case_id].model().save_pretrained(folder / name)


def _check(result: dict, reference: dict | None = None) -> None:
    assert result["warnings"] == [] and result["notices"] == [], (result["warnings"], result["notices"])
    for name in ("seq2seq", "sparse-lm"):
        assert result[name]["greedy"] == result[name]["static"]
        assert len(result[name]["beam"]) == 2
        if reference is not None:
            assert result[name]["greedy"] == reference[name]["greedy"]
            assert result[name]["beam"] == reference[name]["beam"]
            assert result[name]["logits"] == pytest.approx(reference[name]["logits"], rel=1e-5, abs=1e-4)


def test_a_saved_checkpoint_generates_through_remote_code_without_warnings(tmp_path):
    _save_checkpoints(tmp_path / "checkpoints")
    result = run_without_package(REMOTE_RUN.format(folder=str(tmp_path / "checkpoints")), cwd=tmp_path)
    _check(result)


OTHER_PYTHON = os.environ.get("HF_VIT_PLUS_OTHER_PYTHON")


@pytest.mark.skipif(not OTHER_PYTHON, reason="HF_VIT_PLUS_OTHER_PYTHON names no second environment")
def test_a_checkpoint_saved_under_one_release_runs_under_the_other(tmp_path):
    """Saved here and run by the other environment's transformers through remote code, and the reverse; both runs
    give the tokens of this environment's run."""
    here_dir, there_dir = tmp_path / "saved_here", tmp_path / "saved_there"
    _save_checkpoints(here_dir)
    save_there = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from pathlib import Path
        from tests.test_compat import _save_checkpoints
        _save_checkpoints(Path({str(there_dir)!r}))
        """
    )
    subprocess.run([OTHER_PYTHON, "-c", save_there], check=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": ""})

    for folder in (here_dir, there_dir):
        code = REMOTE_RUN.format(folder=str(folder))
        here = run_without_package(code, cwd=tmp_path)
        there = run_without_package(code, cwd=tmp_path, python=OTHER_PYTHON)
        assert here["transformers"] != there["transformers"], "the other environment has the same transformers"
        _check(here)
        _check(there, reference=here)
    saved_by = json.loads((there_dir / "sparse-lm" / "config.json").read_text())["transformers_version"]
    assert saved_by == there["transformers"]
