"""A text-to-text generation pipeline (translation, number -> words, ...) for encoder-decoder models.

transformers 5 removed its `text2text-generation`, `translation` and `summarization` pipelines: `pipeline(task)`
raises `KeyError` for those names unless the checkpoint itself declares the task in `config.custom_pipelines`.
This module is that declaration's implementation. `save_text2text_pipeline(model, tokenizer, folder)` saves the
model, the tokenizer and the generation config, records both task names in `config.json` and copies this file
next to them; afterwards

    pipeline("text2text-generation", model=folder, trust_remote_code=True)("4021")
    # [{"generated_text": "four thousand twenty-one"}]

works, as does `task="translation"`. Without `trust_remote_code`, pass the class instead:
`pipeline("translation", model=folder, pipeline_class=Text2TextGenerationPipeline)`.

The file imports nothing from hf_vit_plus, so it also runs as remote code where the package is not installed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import Pipeline

TEXT2TEXT_TASKS = ("text2text-generation", "translation")


class Text2TextGenerationPipeline(Pipeline):
    """Encode the input text, `model.generate` (with the model's generation config: beam search, length penalty,
    ... unless overridden by call arguments), decode. Returns `[{"generated_text": str}, ...]` per input,
    `num_return_sequences` entries each."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, truncation=None, max_length=None, skip_special_tokens=None, **generate_kwargs):
        # Every other keyword (at construction or per call) goes to `generate`, on top of the generation config.
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        if max_length is not None:
            # `max_length` bounds the output, as in `generate`.
            generate_kwargs["max_length"] = max_length
        postprocess_params = {} if skip_special_tokens is None else {"skip_special_tokens": skip_special_tokens}
        return preprocess_params, generate_kwargs, postprocess_params

    def preprocess(self, inputs, truncation: bool = True):
        if not isinstance(inputs, str):
            raise TypeError(f"{type(self).__name__} takes a string or a list of strings, got {type(inputs).__name__}")
        return self.tokenizer(inputs, return_tensors="pt", truncation=truncation)

    def _forward(self, model_inputs, **generate_kwargs):
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        if not hasattr(output_ids, "shape"):  # return_dict_in_generate=True gives a ModelOutput
            output_ids = output_ids.sequences
        return {"output_ids": output_ids}

    def postprocess(self, model_outputs, skip_special_tokens: bool = True):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=skip_special_tokens)
        return [{"generated_text": text.strip()} for text in texts]


def save_text2text_pipeline(model, tokenizer, save_directory: str | Path, tasks: tuple[str, ...] = TEXT2TEXT_TASKS):
    """Save `model` (with its generation config) and `tokenizer` so that `pipeline(task, model=save_directory,
    trust_remote_code=True)` serves each of `tasks` with `Text2TextGenerationPipeline`."""
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{type(model).__name__} is not an encoder-decoder model (config.is_encoder_decoder=False)")
    if isinstance(tasks, str) or not tasks:
        raise ValueError(f"tasks must be a non-empty tuple of task names, got {tasks!r}")
    save_directory = Path(save_directory)
    module = Path(__file__).stem
    previous = getattr(model.config, "custom_pipelines", None)
    model.config.custom_pipelines = {
        task: {"impl": f"{module}.{Text2TextGenerationPipeline.__name__}", "pt": ["AutoModelForSeq2SeqLM"]}
        for task in tasks
    }
    try:
        model.save_pretrained(save_directory)
    finally:  # the declaration belongs to this folder, not to the model in memory
        if previous is None:
            del model.config.custom_pipelines
        else:
            model.config.custom_pipelines = previous
    tokenizer.save_pretrained(save_directory)
    shutil.copyfile(__file__, save_directory / f"{module}.py")
    return save_directory
