"""A text-to-text generation pipeline (translation, number -> words, ...) for encoder-decoder models.

transformers 5 removed its `text2text-generation`, `translation` and `summarization` pipelines: `pipeline(task)`
raises `KeyError` for those names unless the checkpoint itself declares the task in `config.custom_pipelines`.
This module is that declaration's implementation. `save_text2text_pipeline(model, tokenizer, folder)` saves the
model, the tokenizer and the generation config, records both task names in `config.json` and copies this file
next to them; afterwards

    pipeline("text2text-generation", model=folder, trust_remote_code=True)("4021")
    # [{"generated_text": "four thousand twenty-one"}]

works, as does `task="translation"` (results under "translation_text", as transformers' translation pipeline
returned them). Without `trust_remote_code`, pass the class instead:
`pipeline("translation", model=folder, pipeline_class=Text2TextGenerationPipeline)`.

One switch picks the engine that decodes (`engine=...` when the pipeline is built):

    pipeline("translation", model=folder, trust_remote_code=True)                      # model.generate (eager)
    pipeline("translation", model=folder, trust_remote_code=True, engine="fast")       # FastDecoding, float32
    pipeline("translation", model=folder, trust_remote_code=True, engine="fast", precision="int8")
    pipeline("translation", model=folder, trust_remote_code=True, engine="ctranslate2",
             ctranslate2_model="folder-ct2", compute_type="int8")   # `hf-vit-plus export ctranslate2` output

"fast" is `generate(custom_generate=FastDecoding(precision))` (`fast_decoding.py`: one compiled graph per token,
the tokens of eager `generate` in float32). "ctranslate2" runs the exported model with `ctranslate2.Translator`
(`CTranslate2Generator`), the tokenizer staying this pipeline's.

The file imports only torch, transformers and its siblings `decoding_rules`, `fast_decoding` (with `fast_layers`
and `fast_steps`), `fast_kernels`, `step_cache` and `cpu_isa` (shipped next to it), so it also runs as remote code
where the hf_vit_plus package is not installed.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import torch
from transformers import GenerationConfig, Pipeline

from .decoding_rules import DecodingRules

logger = logging.getLogger(__name__)

TEXT2TEXT_TASKS = ("text2text-generation", "translation")
ENGINES = ("generate", "fast", "ctranslate2")
CTRANSLATE2_FILE = "model.bin"


def is_ctranslate2_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a CTranslate2 model (its `model.bin`), as `hf-vit-plus export ctranslate2` writes."""
    return (Path(folder) / CTRANSLATE2_FILE).is_file()


def _read_vocabulary(folder: Path, side: str) -> list[str]:
    """A CTranslate2 model's source or target tokens, in id order (shared_vocabulary.json, or the side's own file;
    .txt: one token a line, in older CTranslate2 releases)."""
    for name in ("shared_vocabulary", f"{side}_vocabulary"):
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        if (folder / f"{name}.txt").is_file():
            return (folder / f"{name}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    raise FileNotFoundError(f"No vocabulary file in {folder}: not a CTranslate2 model folder.")


class CTranslate2Generator:
    """`model.generate` for token ids, run by `ctranslate2.Translator` on a CTranslate2 model folder: the same
    arguments (greedy or beam search: `num_beams`, `num_return_sequences`, `max_new_tokens` / `max_length`,
    `min_new_tokens` / `min_length`, `length_penalty`, `eos_token_id`, `bad_words_ids`, `repetition_penalty`,
    `no_repeat_ngram_size`) and the same layout of the result: the decoder start token, the new tokens (the eos
    token included), the pad token after. Defaults come from the folder's generation_config.json.

    Greedy decoding gives the tokens of our float32 model (the export is the same network; tested). Beam search
    ranks finished hypotheses with CTranslate2's own length normalisation, which may pick other beams than
    transformers'. `forced_eos_token_id` (forcing eos at the maximum length) has no CTranslate2 equivalent and is
    ignored; `forced_bos_token_id` and sampling are refused."""

    def __init__(
        self,
        folder: str | Path,
        device: str = "cpu",
        compute_type: str = "default",
        intra_threads: int = 0,
        inter_threads: int = 1,
    ):
        try:
            import ctranslate2
        except ImportError as error:
            raise ImportError(
                'The ctranslate2 engine needs ctranslate2 (not installed): pip install "hf_vit_plus[export]"'
            ) from error
        folder = Path(folder)
        if not is_ctranslate2_folder(folder):
            raise FileNotFoundError(
                f"{folder} holds no CTranslate2 model ({CTRANSLATE2_FILE}): write one with "
                "`hf-vit-plus export ctranslate2 CHECKPOINT OUT_DIR`."
            )
        self.folder = folder
        self.translator = ctranslate2.Translator(
            str(folder),
            device=device,
            compute_type=compute_type,
            intra_threads=intra_threads,
            inter_threads=inter_threads,
        )
        self.source_tokens = _read_vocabulary(folder, "source")
        self.target_tokens = _read_vocabulary(folder, "target")
        self.target_ids = {token: i for i, token in enumerate(self.target_tokens)}
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.decoder_start_token_id = self.target_ids[config["decoder_start_token"]]
        self.generation_config = (
            GenerationConfig.from_pretrained(folder)
            if (folder / "generation_config.json").is_file()
            else GenerationConfig(eos_token_id=self.target_ids[config["eos_token"]])
        )

    def _options(self, settings: GenerationConfig) -> dict:
        if settings.do_sample:
            raise ValueError("The ctranslate2 engine runs greedy decoding and beam search (do_sample=False).")
        if settings.forced_bos_token_id is not None:
            raise ValueError("The ctranslate2 engine cannot force a first token (forced_bos_token_id).")
        if settings.forced_eos_token_id is not None:
            logger.info("forced_eos_token_id is ignored by the ctranslate2 engine (only sequences that reach the "
                        "maximum length could differ)")  # fmt: skip
        rules = DecodingRules.from_generation_config(settings)  # the lengths and tokens as generate reads them
        min_new, max_new = rules.new_token_bounds()
        options = dict(
            beam_size=rules.num_beams,
            num_hypotheses=rules.num_return_sequences,
            length_penalty=rules.length_penalty,
            max_decoding_length=max_new,
            min_decoding_length=min_new,
            return_end_token=True,
            max_input_length=0,  # no silent truncation
            repetition_penalty=settings.repetition_penalty or 1.0,
            no_repeat_ngram_size=settings.no_repeat_ngram_size or 0,
        )
        eos = rules.eos_token_ids
        if eos:
            options["end_token"] = [self.target_tokens[i] for i in eos]
        if settings.bad_words_ids:
            options["suppress_sequences"] = [[self.target_tokens[i] for i in s] for s in settings.bad_words_ids]
        return options

    def generate(self, input_ids, attention_mask=None, generation_config: GenerationConfig | None = None, **kwargs):
        """Token ids (batch, source length) and their padding mask -> (batch x num_return_sequences, length) ids,
        as `model.generate` returns them."""
        settings = copy.deepcopy(generation_config or self.generation_config)  # `update` changes it
        unused = settings.update(**kwargs)
        if unused:
            raise ValueError(f"The ctranslate2 engine does not take {sorted(unused)}.")
        rows = input_ids.tolist()
        if attention_mask is not None:
            rows = [[t for t, keep in zip(row, mask) if keep] for row, mask in zip(rows, attention_mask.tolist())]
        source = [[self.source_tokens[t] for t in row] for row in rows]
        results = self.translator.translate_batch(source, **self._options(settings))
        rules = DecodingRules.from_generation_config(settings)
        pad = rules.beam_fill_value if rules.num_beams > 1 else rules.pad_token_id
        sequences = [
            [self.decoder_start_token_id] + [self.target_ids[token] for token in hypothesis]
            for result in results
            for hypothesis in result.hypotheses
        ]
        length = max(map(len, sequences))
        return torch.tensor([sequence + [pad] * (length - len(sequence)) for sequence in sequences])


# The key of a result per task, as transformers' own translation and summarization pipelines returned them (and as
# `evaluate`'s translation evaluator reads them); "generated_text" for text2text-generation.
OUTPUT_KEYS = {"translation": "translation_text", "summarization": "summary_text"}


class Text2TextGenerationPipeline(Pipeline):
    """Encode the input text, `model.generate` (with the model's generation config: beam search, length penalty,
    ... unless overridden by call arguments), decode. Returns `[{"generated_text": str}, ...]` per input,
    `num_return_sequences` entries each; `translation_text` for the translation task, `summary_text` for
    summarization, as transformers' pipelines of those tasks.

    engine: "generate" (transformers' loop), "fast" (`FastDecoding(precision)`, see fast_decoding.py) or
    "ctranslate2" (`CTranslate2Generator(ctranslate2_model, compute_type=..., intra_threads=threads)`: the exported
    model in `ctranslate2_model` runs instead of `model`)."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(
        self,
        *args,
        engine: str = "generate",
        precision: str = "float32",
        ctranslate2_model: str | Path | None = None,
        compute_type: str = "default",
        threads: int = 0,
        **kwargs,
    ):
        if engine not in ENGINES:
            raise ValueError(f"Unknown engine {engine!r}: expected one of {', '.join(map(repr, ENGINES))}.")
        if engine == "ctranslate2" and ctranslate2_model is None:
            raise ValueError(
                "engine='ctranslate2' needs ctranslate2_model=<folder>: the output of "
                "`hf-vit-plus export ctranslate2 CHECKPOINT OUT_DIR`."
            )
        super().__init__(*args, **kwargs)
        self.engine = engine
        self.decoder = None
        if engine == "fast":
            from .fast_decoding import FastDecoding

            self.decoder = FastDecoding(precision=precision)
        elif engine == "ctranslate2":
            self.decoder = CTranslate2Generator(ctranslate2_model, compute_type=compute_type, intra_threads=threads)

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
        if self.engine == "ctranslate2":
            return {"output_ids": self.decoder.generate(**model_inputs, **generate_kwargs)}
        if self.engine == "fast":
            generate_kwargs = {**generate_kwargs, "custom_generate": self.decoder}
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        if not hasattr(output_ids, "shape"):  # return_dict_in_generate=True gives a ModelOutput
            output_ids = output_ids.sequences
        return {"output_ids": output_ids}

    def postprocess(self, model_outputs, skip_special_tokens: bool = True):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=skip_special_tokens)
        return [{self.output_key: text.strip()} for text in texts]

    @property
    def output_key(self) -> str:
        """The key of each result, as transformers' pipeline of the task named it: "translation_text" for
        "translation" (and "translation_xx_to_yy"), "summary_text" for "summarization", else "generated_text"."""
        task = getattr(self, "task", "") or ""
        return next((key for prefix, key in OUTPUT_KEYS.items() if task.startswith(prefix)), "generated_text")


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
    # The pipeline's own imports and engine="fast"'s (the model code already ships its own imports).
    engine = ("fast_decoding.py", "fast_layers.py", "fast_steps.py", "fast_kernels.py", "step_cache.py", "cpu_isa.py")
    for name in ("decoding_rules.py", *engine):
        shutil.copyfile(Path(__file__).with_name(name), save_directory / name)
    return save_directory
