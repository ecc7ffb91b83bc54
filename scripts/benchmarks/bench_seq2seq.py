"""Translation speed of hf_vit_plus's encoder-decoder Transformer against transformers' `MarianMTModel` and
CTranslate2, every engine holding the same weights.

One randomly initialised `MarianMTModel` with opus-mt's conventions (swish feed-forward, sines then cosines,
embeddings scaled by sqrt(d_model), an output bias, post-norm, tied embeddings, pad = decoder start token, eos 0) is
the reference. Our model is `hf_vit_plus.conversion.seq2seq_from_marian` of it; CTranslate2's models come from its
own converter (`ctranslate2.converters.TransformersConverter`) run on the same saved folder, and from our export
(`hf_vit_plus.export.export_ctranslate2` of our model). Engines (`--engines`):

- marian: transformers' MarianMTModel, eager (the reference of the ratios);
- ours: our model, eager `generate`, dynamic cache;
- ours-compiled: `generate(..., cache_implementation="static", compile_config=...)`: transformers' loop, the model's
  step compiled by torch.compile with fixed shapes (the static-cache compiled `generate` of
  `hf_vit_plus.generation.compiled_generation_config`);
- ours-int8: our model quantized by `hf_vit_plus.quantization.quantize(model, "int8-dynamic")` (torchao), decoded
  as ours-compiled; ours-int8-eager (not in the default set): the same, eager;
- ours-fast, ours-fast-bf16, ours-fast-int8, ours-fast-int8-wo: `generate(custom_generate=FastDecoding(precision))`
  (`hf_vit_plus.models.fast_decoding`): each token one AOTInductor-compiled graph (decoder, output projection,
  greedy / beam bookkeeping), in float32, bfloat16, int8 (dynamic: int8 products) or int8 weight-only; in float32,
  greedy steps of few rows choose through the output screen (a float16 pass, float32's token proven by a bound);
  ours-fast-full: float32 without the screen (all logits in float32);
- ct2-fp32, ct2-int8: CTranslate2 `Translator(compute_type="float32" / "int8")` of the Marian folder;
- ct2-export, ct2-export-int8: CTranslate2 running our export, through `CTranslate2Generator` (generate's
  arguments and output layout), float32 / int8.

Each engine generates exactly `--new_tokens` tokens (transformers: min = max new tokens; CTranslate2: min = max
decoding length), so that all do the same work whatever they predict. Cases: greedy and beam 4, at each batch size;
training (forward + backward + Adam step, dropout 0.1, on copies of the weights) for marian and ours only.

Each engine runs at every thread count of `--threads` (torch's threads, CTranslate2's `intra_threads`; default 1
and 2: on a 2-core machine CTranslate2 runs faster on one thread than on two) and is reported at its fastest, per
case, with that thread count in its row. Measurements rotate over the engines and thread counts, repetition by
repetition (each takes each place in the order in turn), on the same inputs, so that load on the machine affects
all alike; the table gives median rates and the median of the per-repetition ratios to marian (at its own best
thread count), with their range, and the 1-minute load average (`os.getloadavg`, the run's own threads included)
at the start of each repetition, lowest and highest. A summary line per case sets ours against CTranslate2 at the
same precision: ours-fast against ct2-fp32 and ours-fast-int8 against ct2-int8, each at its best thread count (the
median of the per-repetition ratios, with their range). A first untimed call of every engine and case warms up
(and compiles). The greedy tokens of the first batch are compared with Marian's and with ours-fast's (float32): the
float32 engines should agree, bf16 and int8 are expected to differ somewhat. torch keeps compiled kernels in an
on-disk cache: a second run compiles faster; `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1` measures a cold compilation.

`--profile` adds, for every fast engine and batch-1 case, where the time of a token goes: the decoder's projections
(GEMV), attention over the caches, the output projection (each compiled alone by AOTInductor on the step's shapes
and timed), the rest of the compiled step (norms, embeddings, logits processing, greedy / beam bookkeeping), the
encoder and `generate`'s set-up per token, and the Python loop and call overhead; with the bytes each part reads per
token and the rate achieved, and the floor: the step's bytes at the rate of a plain read of 256 MB (`torch.sum`).

`--quality MODEL_DIR` measures instead what the faster engines cost in quality, on a translation model trained by
`scripts/train_translation.py` (SWORD English -> Spanish): its held-out test verses (the training script's split) are
decoded greedily and with the paper's beam search (4 beams, length penalty 0.6, source length + 50 new tokens) by
`generate` in float32 (the reference), FastDecoding in each precision (`--quality_precisions`) and CTranslate2 (our
export, `--quality_ctranslate2`: float32 and int8), with sacreBLEU's BLEU and chrF, the share of verses decoded
exactly as the reference, and the token agreement (tokens equal at the same position, over the longer of the two
outputs).

`--output FILE` writes the rows of the run's table as CSV (`result_rows.write_rows`: each row followed by the command,
the date, the versions, the CPU or GPU and the threads): the speed table (case, engine, tokens/s, ratio to marian and
its range, compilation seconds, the model sizes, CTranslate2's version, the ratio to CTranslate2 at the same
precision and its range, the load average; `threads`: the engine's best thread count), replacing the file's rows of
the same preset and keeping the others (one file holds the small and the opus-mt run), or with `--quality` the
quality table (mode,
engine, BLEU, chrF, the shares of identical verses and equal tokens, seconds): the columns of
results/fast_decoding.csv and results/translation_quality.csv, which the docs' Results page shows.

    python scripts/benchmarks/bench_seq2seq.py                       # small sizes, every engine at 1 and 2 threads
    python scripts/benchmarks/bench_seq2seq.py --preset opus-mt      # opus-mt sizes
    python scripts/benchmarks/bench_seq2seq.py --threads 1           # one thread count only
    python scripts/benchmarks/bench_seq2seq.py --profile             # + the batch-1 profile tables
    python scripts/benchmarks/bench_seq2seq.py --quick               # a short check that every engine runs
    python scripts/benchmarks/bench_seq2seq.py --quality outputs/translation/model   # BLEU / chrF per engine
    python scripts/benchmarks/bench_seq2seq.py --output results/fast_decoding.csv    # + the rows as CSV
    python scripts/benchmarks/bench_seq2seq.py --isa avx2    # ours and CTranslate2 capped at AVX2 together

`--isa LEVEL` (generic, avx2, avx512) caps every library of the run at that instruction set: ours
(`HF_VIT_PLUS_CPU_ISA`), torch's ATen, MKL, oneDNN, FBGEMM and CTranslate2 (`CT2_FORCE_CPU_ISA`), through
`hf_vit_plus.models.cpu_isa.capped_environment`. The libraries read the caps when they load, so the script starts
again in a process capped so (`result_rows.run_capped`). The output names the level and its source, and each row
records `isa` and `isa_capped`: a capped run on a wider CPU executes the narrower set's instructions, not with a
narrower CPU's caches, clocks and memory bandwidth.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from transformers import CompileConfig, GenerationConfig, MarianConfig, MarianMTModel

from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.conversion import seq2seq_from_marian
from hf_vit_plus.models.decoding_rules import DecodingRules
from hf_vit_plus.models.fast_kernels import PRECISIONS, SMALL_ROWS

FAST = {
    "ours-fast": "float32",
    "ours-fast-full": "float32",
    "ours-fast-bf16": "bfloat16",
    "ours-fast-int8": "int8",
    "ours-fast-int8-wo": "int8-weight-only",
}
ENGINES = (
    "marian",
    "ours",
    "ours-compiled",
    "ours-int8",
    "ours-int8-eager",
    *FAST,
    "ct2-fp32",
    "ct2-int8",
    "ct2-export",
    "ct2-export-int8",
)
DEFAULT_ENGINES = (
    "marian",
    "ours-compiled",
    "ours-int8",
    "ours-fast",
    "ours-fast-full",
    "ours-fast-bf16",
    "ours-fast-int8",
    "ct2-fp32",
    "ct2-int8",
    "ct2-export",
)
TRAINABLE = ("marian", "ours")
COMPILED = ("ours-compiled", "ours-int8", *FAST)
EOS, UNK = 0, 1  # Marian's ids; the pad token (also the decoder start) is the last id
# Model sizes (and the thread counts each engine runs at) of `--preset`: small Marian-like sizes (the default), and
# the opus-mt checkpoints'.
PRESETS = {
    "small": dict(vocab_size=8000, d_model=256, layers=3, heads=4, ffn_dim=1024, threads=[1, 2], train_batch=16),
    "opus-mt": dict(vocab_size=58000, d_model=512, layers=6, heads=8, ffn_dim=2048, threads=[1, 2], train_batch=0),
}
# Ours against CTranslate2 at the same precision: the summary line of each case.
CTRANSLATE2_PEERS = (("ours-fast", "ct2-fp32"), ("ours-fast-int8", "ct2-int8"))


def _names(text: str) -> list[str]:
    """A comma-separated option as a list of names ('' -> [])."""
    return [name.strip() for name in text.split(",") if name.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model sizes and threads (small)")
    p.add_argument("--vocab_size", type=int, help="shared vocabulary size (preset)")
    p.add_argument("--d_model", type=int, help="model width (preset)")
    p.add_argument("--layers", type=int, help="encoder and decoder layers (preset)")
    p.add_argument("--heads", type=int, help="attention heads (preset)")
    p.add_argument("--ffn_dim", type=int, help="feed-forward width (preset)")
    p.add_argument(
        "--threads", type=int, nargs="+",
        help="torch and CTranslate2 (intra_threads) thread counts: each engine runs at each, reported at its fastest "
        "(preset: 1 2); --quality and --profile run at the first",
    )  # fmt: skip
    p.add_argument("--activation", default="swish", help="feed-forward activation (opus-mt: swish)")
    # Defaults of the full run; --quick replaces those not given.
    p.add_argument("--source_length", type=int, help="source tokens per sequence (32)")
    p.add_argument("--new_tokens", type=int, help="tokens generated per sequence, exactly (32)")
    p.add_argument("--batch_sizes", type=int, nargs="+", help="generation batch sizes (1 16)")
    p.add_argument("--beams", type=int, nargs="+", help="beam sizes, 1 = greedy (1 4)")
    p.add_argument("--train_batch", type=int, help="sequences per training step, 0 = no training case (preset)")
    p.add_argument("--repeats", type=int, help="timed repetitions per engine and case (3)")
    p.add_argument("--attn_implementation", default="sdpa", choices=["eager", "sdpa"], help="torch models' kernel")
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=f"comma-separated, from {', '.join(ENGINES)}")
    p.add_argument("--compile_mode", default="default", help="torch.compile mode of ours-compiled and ours-int8")
    p.add_argument("--fast_backend", default="aoti", choices=["aoti", "compile", "eager"], help="FastDecoding's")
    p.add_argument("--profile", action="store_true", help="profile tables of the fast engines at batch 1")
    p.add_argument("--quality", type=Path, default=None, help="a SWORD translation model: BLEU/chrF per engine")
    p.add_argument("--quality_batch", type=int, default=32, help="verses decoded together by --quality")
    p.add_argument("--quality_limit", type=int, default=None, help="decode only the first N test verses")
    p.add_argument(
        "--quality_precisions",
        default="float32,bfloat16,int8,int8-weight-only",
        help="FastDecoding precisions measured by --quality (comma-separated)",
    )
    p.add_argument(
        "--quality_ctranslate2",
        default="float32,int8",
        help="CTranslate2 compute types of our export measured by --quality (comma-separated; '' for none)",
    )
    p.add_argument("--quick", action="store_true", help="short defaults: 1 repeat, 8 + 8 tokens, batch 1 2, beam 1 2")
    p.add_argument(
        "--output", type=Path, default=None,
        help="write the table's rows (speed, or --quality's) to this CSV (e.g. results/fast_decoding.csv), with the "
        "run's context",
    )  # fmt: skip
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    _result_rows().add_isa_argument(p)
    args = p.parse_args(argv)
    args.engines = _names(args.engines)
    unknown = [name for name in args.engines if name not in ENGINES]
    if unknown or "marian" not in args.engines:
        p.error(f"--engines: unknown {unknown} or no 'marian' (the reference); choose from {', '.join(ENGINES)}")
    args.quality_precisions = _names(args.quality_precisions)
    args.quality_ctranslate2 = _names(args.quality_ctranslate2)
    unknown = [name for name in args.quality_precisions if name not in PRECISIONS]
    if unknown:
        p.error(f"--quality_precisions: unknown {unknown}; choose from {', '.join(PRECISIONS)}")
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    full = dict(source_length=32, new_tokens=32, batch_sizes=[1, 16], beams=[1, 4], repeats=3)
    quick = dict(source_length=8, new_tokens=8, batch_sizes=[1, 2], beams=[1, 2], train_batch=2, repeats=1)
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None or (args.quick and name == "train_batch"):
            setattr(args, name, value)
    return args


# ----------------------------------------------------------------------------------------------- the engines
def build_marian(args: argparse.Namespace) -> MarianMTModel:
    pad = args.vocab_size - 1
    config = MarianConfig(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        activation_function=args.activation,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=args.source_length + args.new_tokens + 8,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=EOS,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,  # exactly --new_tokens tokens: nothing forces </s> at the end
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    model.set_attn_implementation(args.attn_implementation)
    with torch.no_grad():
        model.final_logits_bias.normal_(std=0.1)  # non-zero, so that every engine must apply it
    return model


class RandomVocabulary:
    """What CTranslate2's converter reads from a tokenizer, for random weights without one: `get_vocab()` (token ->
    id; the pad token last, named "<pad>": the Marian loader drops it) and the special tokens."""

    def __init__(self, vocab_size: int):
        self.tokens = ["</s>", "<unk>"] + [f"t{i}" for i in range(2, vocab_size - 1)] + ["<pad>"]
        self.eos_token, self.unk_token, self.bos_token, self.pad_token = "</s>", "<unk>", "<s>", "<pad>"

    def get_vocab(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}


class ByThreads(dict):
    """An engine that is built per thread count (CTranslate2 takes its threads when it loads a model): thread count
    -> engine. Other engines are one object, run after `torch.set_num_threads`."""


def engine_at(engine, threads: int):
    """`engine` as it runs at `threads` threads (see `ByThreads`); torch's threads are set by the caller."""
    return engine[threads] if isinstance(engine, ByThreads) else engine


class CTranslate2Engine:
    """A `ctranslate2.Translator` with the token strings of the random vocabulary (it translates token strings)."""

    def __init__(self, translator, vocabulary: RandomVocabulary):
        self.translator = translator
        self.id_to_token = vocabulary.tokens
        self.token_to_id = vocabulary.get_vocab()

    def generate(self, input_ids: torch.Tensor, beams: int, new_tokens: int) -> torch.Tensor:
        """Exactly `new_tokens` tokens per sequence (min = max decoding length), (B, new_tokens)."""
        results = self.translator.translate_batch(
            [[self.id_to_token[i] for i in row] for row in input_ids.tolist()],
            beam_size=beams,
            num_hypotheses=1,
            length_penalty=1.0,
            min_decoding_length=new_tokens,
            max_decoding_length=new_tokens,
        )
        return torch.tensor([[self.token_to_id[token] for token in result.hypotheses[0]] for result in results])


def build_ctranslate2(marian_dir: Path, out_dir: Path, args: argparse.Namespace) -> dict:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    vocabulary = RandomVocabulary(args.vocab_size)

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return vocabulary

    device = "cuda" if args.device.startswith("cuda") else "cpu"
    translators = {}
    for name, quantization in (("ct2-fp32", "float32"), ("ct2-int8", "int8")):
        if name in args.engines:
            path = out_dir / name
            Converter(str(marian_dir)).convert(str(path), quantization=quantization, force=True)
            translators[name] = ByThreads(
                (
                    threads,
                    CTranslate2Engine(
                        ctranslate2.Translator(
                            str(path), device=device, compute_type=quantization, intra_threads=threads, inter_threads=1
                        ),
                        vocabulary,
                    ),
                )
                for threads in args.threads
            )
    return translators


def build_ctranslate2_exports(ours: nn.Module, out_dir: Path, args: argparse.Namespace) -> dict:
    """Our model through `export_ctranslate2`, run by `CTranslate2Generator` (float32, int8)."""
    from hf_vit_plus.export import export_ctranslate2
    from hf_vit_plus.models.pipeline_text2text_generation import CTranslate2Generator

    generators = {}
    for name, quantization in (("ct2-export", None), ("ct2-export-int8", "int8")):
        if name in args.engines:
            folder = export_ctranslate2(ours, out_dir / name, quantization=quantization)
            compute_type = quantization or "float32"
            generators[name] = ByThreads(
                (threads, CTranslate2Generator(folder, compute_type=compute_type, intra_threads=threads))
                for threads in args.threads
            )
    return generators


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    from hf_vit_plus.quantization import quantize

    return quantize(model, "int8-dynamic")


def build_engines(args: argparse.Namespace, workdir: Path) -> tuple[dict, dict, nn.Module]:
    """The engines to time, copies of marian and ours for the training case (training changes weights), and our
    float32 model (for the profile)."""
    from hf_vit_plus.models.fast_decoding import FastDecoding

    marian = build_marian(args)
    engines = {"marian": marian.to(args.device)}
    ours = seq2seq_from_marian(marian).eval()
    for name in ("ours", "ours-compiled", "ours-int8", "ours-int8-eager"):
        if name in args.engines:
            model = copy.deepcopy(ours)
            engines[name] = quantize_int8(model) if "int8" in name else model
    for name, precision in FAST.items():
        if name in args.engines:
            fast = FastDecoding(precision, args.fast_backend, screened_greedy=name != "ours-fast-full")
            engines[name] = (ours, fast)
    if any(name in ("ct2-fp32", "ct2-int8") for name in args.engines):
        marian.save_pretrained(workdir / "marian")
        engines.update(build_ctranslate2(workdir / "marian", workdir, args))
    engines.update(build_ctranslate2_exports(ours, workdir, args))
    trainable = {}
    if args.train_batch:
        trainable = {name: copy.deepcopy(engines[name]) for name in TRAINABLE if name in args.engines}
    return {name: engines[name] for name in args.engines}, trainable, ours


# ----------------------------------------------------------------------------------------------- the timings
def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def compile_config(args: argparse.Namespace) -> CompileConfig:
    config = CompileConfig(fullgraph=True, dynamic=False, mode=args.compile_mode)
    config._compile_all_devices = True  # transformers compiles generate's step on GPUs only, unless told
    return config


@torch.no_grad()
def generate(name: str, engine, input_ids: torch.Tensor, beams: int, args: argparse.Namespace) -> torch.Tensor:
    """Exactly `args.new_tokens` new tokens per sequence; returns them, (B, new_tokens)."""
    n = args.new_tokens
    if isinstance(engine, CTranslate2Engine):
        return engine.generate(input_ids, beams, n)
    settings = dict(num_beams=beams, do_sample=False, length_penalty=1.0, min_new_tokens=n, max_new_tokens=n)
    mask = torch.ones_like(input_ids)
    if name.startswith("ct2-export"):
        return engine.generate(input_ids, attention_mask=mask, **settings)[:, 1:]
    if name in FAST:
        model, fast = engine
        return fast.generate(model, input_ids, attention_mask=mask, **settings)[:, 1:]
    if name in COMPILED:
        settings.update(cache_implementation="static", compile_config=args.compile_config)
    return engine.generate(input_ids=input_ids, attention_mask=mask, **settings)[:, 1:]  # without the start token


def timed_generate(name: str, engine, input_ids, beams: int, args, threads: int) -> tuple[float, torch.Tensor]:
    """(seconds, new tokens) of one `generate` call at `threads` threads."""
    torch.set_num_threads(threads)
    engine = engine_at(engine, threads)
    sync(args.device)
    start = time.perf_counter()
    new_tokens = generate(name, engine, input_ids, beams, args)
    sync(args.device)
    return time.perf_counter() - start, new_tokens


def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled so far in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def training_rate(model, optimizer, input_ids, labels, device: str, steps: int = 3) -> float:
    model.train()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    return steps * (input_ids.numel() + labels.numel()) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict]]:
    args = parse_args(argv)
    # ours and CTranslate2 capped together: the libraries read the caps when they load, so the script starts again
    _result_rows().run_capped(args.isa, from_command_line=argv is None)
    torch.set_num_threads(args.threads[0])
    if args.quality is not None:
        return quality(args)
    args.compile_config = compile_config(args)
    # Every (engine, batch x beams) shape of the compiled engines is one more compiled graph of the same code.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    workdir = tempfile.TemporaryDirectory(prefix="bench_seq2seq_")
    engines, trainable, ours = build_engines(args, Path(workdir.name))
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, m in trainable.items()}
    generator = torch.Generator().manual_seed(0)

    def tokens(batch: int, length: int) -> torch.Tensor:
        ids = torch.randint(2, args.vocab_size - 1, (batch, length), generator=generator)
        ids[:, -1] = EOS  # sources end with </s>, as a Marian tokenizer writes them
        return ids.to(args.device)

    cases = [
        (f"generate {'greedy' if beams == 1 else f'beam {beams}'}, batch {batch}", batch, beams)
        for beams in args.beams
        for batch in args.batch_sizes
    ]
    names = list(engines)
    # every engine at every thread count: (engine, threads) pairs, measured in turn
    runs = [(name, threads) for name in names for threads in args.threads]
    rates = {label: {name: {threads: [] for threads in args.threads} for name in names} for label, _, _ in cases}
    first_calls: dict[str, dict[str, dict]] = {label: {name: {} for name in names} for label, _, _ in cases}
    agreement: dict[str, dict[str, float]] = {}
    for label, batch, beams in cases:  # untimed first calls: warm-up, and compilation of the compiled engines
        source = tokens(batch, args.source_length)
        outputs = {}
        for name, threads in runs:
            seconds, out = timed_generate(name, engines[name], source, beams, args, threads)
            first_calls[label][name][threads] = seconds
            outputs.setdefault(name, out)  # the first thread count's tokens
        if beams == 1 and not agreement:
            for reference in ("marian", "ours-fast"):
                if reference in outputs:
                    agreement[reference] = {
                        name: (out.cpu() == outputs[reference].cpu()).float().mean().item()
                        for name, out in outputs.items()
                        if name != reference
                    }
    graphs_before = compiled_graphs()
    args.load_averages = []  # the 1-minute load average at the start of each repetition
    for repeat in range(args.repeats):
        args.load_averages.append(os.getloadavg()[0])
        order = runs[repeat % len(runs) :] + runs[: repeat % len(runs)]
        for label, batch, beams in cases:
            source = tokens(batch, args.source_length)  # the same inputs for every engine of this repetition
            for name, threads in order:
                seconds, _ = timed_generate(name, engines[name], source, beams, args, threads)
                rates[label][name][threads].append(batch * args.new_tokens / seconds)
    args.recompiled = compiled_graphs() - graphs_before
    if trainable:
        label = f"train fwd+bwd+step, batch {args.train_batch}"
        rates[label] = {name: {threads: [] for threads in args.threads} for name in trainable}
        train_runs = [(name, threads) for name in trainable for threads in args.threads]
        for name, threads in train_runs:  # warm-up
            torch.set_num_threads(threads)
            training_rate(trainable[name], optimizers[name], tokens(2, 8), tokens(2, 8), args.device, steps=1)
        for repeat in range(args.repeats):
            source, target = tokens(args.train_batch, args.source_length), tokens(args.train_batch, args.new_tokens)
            for name, threads in train_runs if repeat % 2 == 0 else train_runs[::-1]:
                torch.set_num_threads(threads)
                rate = training_rate(trainable[name], optimizers[name], source, target, args.device)
                rates[label][name][threads].append(rate)
    torch.set_num_threads(args.threads[0])
    best = best_threads(rates)
    summary = report(args, {label: {name: rates[label][name][best[label][name]] for name in rates[label]}
                            for label in rates},
                     {label: {name: by_threads[best[label][name]] for name, by_threads in firsts.items()}
                      for label, firsts in first_calls.items()},
                     agreement, best, rates)  # fmt: skip
    for name in [name for name in FAST if name in engines]:
        fast = engines[name][1]
        if fast.screened_steps:
            print(
                f"{name}: {fast.screened_steps} greedy steps chose through the output screen, "
                f"{fast.screen_fallbacks} of them from all float32 logits (not proven by the screen)"
            )
            summary.setdefault("screen", {})[name] = (fast.screened_steps, fast.screen_fallbacks)
    if args.profile:
        summary["profile"] = profile_tables(args, engines, ours, tokens, summary)
    if args.output is not None:
        print(f"wrote {write_speed_rows(args, summary)}")
    workdir.cleanup()
    return summary


def _version(package: str) -> str:
    """The installed version of `package`, '' where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def _result_rows():
    """scripts/benchmarks/result_rows.py (the rows' context, `--isa`)."""
    import sys

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import result_rows

    return result_rows


def _write_rows(path: Path, rows: list[dict], threads: int) -> Path:
    return _result_rows().write_rows(path, rows, threads=threads)


def kernel_paths_line() -> str:
    """The fast engine's kernels and the path each runs at this instruction set (`hf-vit-plus env`'s line)."""
    from hf_vit_plus.env_cli import kernel_paths_text

    return f"kernel paths: {kernel_paths_text()}"


def write_speed_rows(args: argparse.Namespace, summary: dict) -> Path:
    """The speed table (each case and engine: tokens/s, the median ratio to marian and its range, the compilation
    seconds, the ratio to CTranslate2 at the same precision and its range, the load average over the repetitions)
    as rows of `--output`, with the model sizes and the engine's best thread count (`result_rows.write_rows` adds
    the run's context). The file's rows of other presets are kept (the small and the opus-mt run in one file)."""
    import csv

    loads = getattr(args, "load_averages", [])
    sizes = dict(preset=args.preset, vocab_size=args.vocab_size, d_model=args.d_model, layers=args.layers,
                 source_length=args.source_length, new_tokens=args.new_tokens, repeats=args.repeats,
                 ctranslate2=_version("ctranslate2"))  # fmt: skip
    rows = []
    for case, by_engine in summary.items():
        if case in ("agreement", "screen", "profile"):
            continue
        for engine, entry in by_engine.items():
            low, high = entry["range"]
            peer_low, peer_high = entry.get("vs_ctranslate2_range", ("", ""))
            rows.append(dict(case=case, engine=engine, tokens_per_s=round(entry["rate"], 2),
                             vs_marian=round(entry["ratio"], 4), vs_marian_min=round(low, 4),
                             vs_marian_max=round(high, 4), compile_s=round(entry.get("compile_s", 0.0), 2),
                             **sizes, vs_ctranslate2=_rounded(entry.get("vs_ctranslate2", "")),
                             vs_ctranslate2_min=_rounded(peer_low), vs_ctranslate2_max=_rounded(peer_high),
                             load_average=f"{min(loads):.2f}-{max(loads):.2f}" if loads else "",
                             threads=str(entry.get("threads", args.threads[0]))))  # fmt: skip
    kept = []
    if args.output.is_file():  # other presets' rows, each with its own run's context, the columns of this run's
        context_fields = _result_rows().CONTEXT_FIELDS

        with args.output.open(newline="", encoding="utf-8") as file:
            kept = [row for row in csv.DictReader(file) if row.get("preset") != args.preset]
        columns = [*rows[0], *(field for field in context_fields if field not in rows[0])]
        kept = [{key: row.get(key) or "" for key in columns} for row in kept]
    order = list(PRESETS)
    ordered = sorted(kept + rows, key=lambda row: order.index(row["preset"]) if row["preset"] in order else len(order))
    return _write_rows(args.output, ordered, threads=args.threads[0])


def _rounded(value):
    return round(value, 4) if isinstance(value, float) else value


def best_threads(rates: dict) -> dict[str, dict[str, int]]:
    """Each engine's fastest thread count per case (the highest median rate): case -> engine -> threads."""

    def fastest(by_threads: dict) -> int:
        return max(by_threads, key=lambda threads: statistics.median(by_threads[threads]))

    return {label: {name: fastest(by_threads) for name, by_threads in by.items()} for label, by in rates.items()}


def _paired(values: list[float], reference: list[float]) -> tuple[float, float, float]:
    """The median of the per-repetition ratios of `values` to `reference`, and their range."""
    ratios = [a / b for a, b in zip(values, reference)]
    return statistics.median(ratios), min(ratios), max(ratios)


def report(args, rates, first_calls, agreement, best=None, all_rates=None) -> dict[str, dict[str, dict]]:
    """The speed table. rates, first_calls: case -> engine -> the rates (each repetition's) and the first call's
    seconds at the engine's best thread count (`best`: case -> engine -> threads; `all_rates`: every thread
    count's rates, case -> engine -> threads -> rates)."""
    threads_text = " or ".join(map(str, args.threads))
    print(
        f"device {args.device}, {threads_text} thread(s), each engine at its fastest; "
        f"attn {args.attn_implementation}; preset {args.preset}: "
        f"vocab {args.vocab_size}, d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, "
        f"ffn {args.ffn_dim}, {args.activation}; source {args.source_length} tokens, {args.new_tokens} new tokens; "
        f"median of {args.repeats}; FastDecoding backend {args.fast_backend}"
    )
    print(_result_rows().isa_summary())
    print(kernel_paths_line())
    for reference, shares in agreement.items():
        print(
            f"greedy tokens equal to {reference}'s (first batch): "
            + ", ".join(f"{name} {share:.1%}" for name, share in shares.items())
        )
    loads = getattr(args, "load_averages", [])
    if loads:
        print(f"load average (1 minute, at the start of each repetition): {min(loads):.2f}-{max(loads):.2f}")
    print(
        "vs marian: median of the per-repetition ratios to marian eager (measured in turn, at its fastest thread "
        "count), with their range; threads: the engine's fastest (tok/s at each thread count in the last column)"
    )
    header = (
        f"| {'case':<30} | {'engine':<16} | {'threads':>7} | {'tok/s':>9} | {'vs marian':>9} | {'range':>11} "
        f"| {'tok/s by threads':<24} |"
    )
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    summary: dict[str, dict[str, dict]] = {"agreement": agreement}
    for label, by_engine in rates.items():
        summary[label] = {}
        for i, (name, values) in enumerate(by_engine.items()):
            ratio, low, high = _paired(values, by_engine["marian"])
            entry = {"rate": statistics.median(values), "ratio": ratio, "range": (low, high)}
            entry["threads"] = best[label][name] if best else args.threads[0]
            by_threads = (all_rates or {}).get(label, {}).get(name, {})
            entry["rates_by_threads"] = {t: statistics.median(v) for t, v in by_threads.items() if v}
            summary[label][name] = entry
            spread = "" if name == "marian" else f"{low:.2f}-{high:.2f}"
            case = label if i == 0 else ""
            each = ", ".join(f"{t}: {rate:.1f}" for t, rate in entry["rates_by_threads"].items())
            print(
                f"| {case:<30} | {name:<16} | {entry['threads']:>7} | {entry['rate']:>9.1f} | {ratio:>8.2f}x "
                f"| {spread:>11} | {each:<24} |"
            )
    peers = [(ours, ct2) for ours, ct2 in CTRANSLATE2_PEERS if ours in args.engines and ct2 in args.engines]
    if peers:
        print(
            "ours against CTranslate2 at the same precision, each at its fastest thread count: the median of the "
            "per-repetition ratios of tokens/s, with their range"
        )
    for label, by_engine in rates.items():
        for ours, ct2 in peers:
            if ours not in by_engine or ct2 not in by_engine:
                continue
            ratio, low, high = _paired(by_engine[ours], by_engine[ct2])
            entry = summary[label][ours]
            entry.update(vs_ctranslate2=ratio, vs_ctranslate2_range=(low, high), ctranslate2_peer=ct2)
            peer = summary[label][ct2]
            verdict = "ahead" if ratio >= 1 else "behind"
            print(
                f"summary | {label} | {ours} {entry['rate']:.1f} tok/s ({entry['threads']} thr) against {ct2} "
                f"{peer['rate']:.1f} tok/s ({peer['threads']} thr) | {ratio:.2f}x ({low:.2f}-{high:.2f}) | {verdict}"
            )
    compiled = [name for name in COMPILED if name in args.engines]
    if compiled:
        print(
            "compilation: first call of each shape minus the median timed call, in seconds (paid once per shape); "
            f"torch.compile graphs compiled during the timed calls: {args.recompiled} (0 expected)"
        )
        header = f"| {'case':<30} | " + " | ".join(f"{name:>16}" for name in compiled) + " |"
        print(header)
        print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
        for label, firsts in first_calls.items():
            batch = int(label.rsplit(" ", 1)[1])
            cells = []
            for name in compiled:
                steady = batch * args.new_tokens / summary[label][name]["rate"]
                summary[label][name]["compile_s"] = max(0.0, firsts[name] - steady)  # 0: an earlier shape's graph
                cells.append(f"{summary[label][name]['compile_s']:>16.1f}")
            print(f"| {label:<30} | " + " | ".join(cells) + " |")
    return summary


# ------------------------------------------------------------------------------------------------ the profile
class _Projections(nn.Module):
    """Every projection of the decoder layers (self-attention Q/K/V, as one product in the converted precisions, and
    O, cross-attention Q/O, the feed-forward network), as the step computes them on (rows, d_model) states."""

    def __init__(self, decoder):
        super().__init__()
        self.layers = decoder.layers

    def forward(self, hidden):
        out = hidden.new_zeros(())
        for layer in self.layers:
            inputs = (layer.qkv_proj,) if layer.qkv_proj is not None else (layer.q_proj, layer.k_proj, layer.v_proj)
            for projection in (*inputs, layer.o_proj, layer.cross_q_proj):
                out = out + projection(hidden).sum()
            out = out + layer.cross_o_proj(hidden).sum()
            out = out + layer.fc2(layer.activation_fn(layer.fc1(hidden))).sum()
        return out


class _Attention(nn.Module):
    """Self-attention over the (rows, length, d_model) caches and cross-attention over the (batch, source, d_model)
    keys and values of every layer, without the projections: the step's attention arithmetic."""

    def __init__(self, heads: int, layers: int):
        super().__init__()
        self.heads, self.num_layers = heads, layers

    def forward(self, query, position, cache, cross, source_bias):
        rows, dim = query.shape
        heads, head_dim = self.heads, dim // self.heads
        out = query.new_zeros(())
        for i in range(self.num_layers):
            keys, values = cache[2 * i], cache[2 * i + 1]
            length = keys.shape[1]
            scores = (query.view(rows, 1, heads, head_dim) * keys.view(rows, length, heads, head_dim)).sum(-1)
            future = torch.arange(length) > position
            probs = scores.masked_fill(future.view(1, length, 1), float("-inf")).softmax(dim=1)
            out = out + (probs.unsqueeze(-1) * values.view(rows, length, heads, head_dim)).sum(1).sum()
            batch, source = cross.shape[2], cross.shape[3]
            q = query.view(batch, rows // batch, 1, heads, head_dim)
            scores = (q * cross[i, 0].view(batch, 1, source, heads, head_dim)).sum(-1)
            probs = (scores + source_bias.view(batch, 1, source, 1)).softmax(dim=2)
            out = out + (probs.unsqueeze(-1) * cross[i, 1].view(batch, 1, source, heads, head_dim)).sum(2).sum()
        return out


class _OutputProjection(nn.Module):
    def __init__(self, decoder):
        super().__init__()
        self.lm_head = decoder.lm_head

    def forward(self, hidden):
        return self.lm_head(hidden)


class _ScreenedChoice(nn.Module):
    """The float32 greedy choice through `OutputScreen` (its float16 pass, bounds, candidates and choice)."""

    def __init__(self, decoder):
        super().__init__()
        self.screen = decoder.screen
        vocab = decoder.lm_head.weight.shape[0]
        # no end token, bad word or forced token; no length limit within the profile
        rules = DecodingRules.from_generation_config(GenerationConfig(max_length=1 << 20))
        controls = rules.controls(vocab, decoder.lm_head.weight.device)
        self.num_controls = len(controls)
        for i, tensor in enumerate(controls):
            self.register_buffer(f"control_{i}", tensor)
        self.register_buffer("cur_len", torch.tensor(3))

    def forward(self, hidden):
        controls = tuple(getattr(self, f"control_{i}") for i in range(self.num_controls))
        return self.screen(hidden, self.cur_len, controls)[0]


class _TimedRunner:
    """A compiled step that records the time of its calls and when the first began."""

    def __init__(self, runner):
        self.runner, self.seconds, self.calls, self.first_start = runner, 0.0, 0, None

    def __call__(self, *args):
        start = time.perf_counter()
        if self.first_start is None:
            self.first_start = start
        out = self.runner(*args)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def _best_ms(fn, *inputs, rounds: int = 5, calls: int = 20) -> float:
    for _ in range(3):
        fn(*inputs)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    return best


@torch.no_grad()
def profile_tables(args, engines, ours, tokens, summary) -> dict:
    """Where a token's time goes, for every fast engine at batch 1 (greedy and beam search); see the docstring."""
    from hf_vit_plus.models.fast_decoding import aoti_compile

    tables = {}
    read_rate = memory_read_rate()
    for name in [name for name in FAST if name in engines]:
        _, fast = engines[name]
        state = fast.decoding_state(ours)
        decoder = state.decoder
        for beams in args.beams:
            label = f"generate {'greedy' if beams == 1 else f'beam {beams}'}, batch 1"
            if label not in summary:
                continue
            rows, length, source, dim = beams, args.new_tokens, args.source_length, args.d_model
            hidden = torch.randn(rows, dim)
            cache = [torch.randn(rows, length, dim) for _ in range(2 * args.layers)]
            cross = torch.randn(args.layers, 2, 1, source, dim)
            bias = torch.zeros(1, source)
            position = torch.tensor(length // 2)
            screened = beams == 1 and decoder.screen is not None and rows <= SMALL_ROWS
            head = "output projection" + (" (float16 screen, choice)" if screened else "")
            parts = {
                "decoder projections (GEMV)": (_Projections(decoder), (hidden,)),
                "attention (self + cross)": (
                    _Attention(args.heads, args.layers),
                    (hidden, position, cache, cross, bias),
                ),
                head: ((_ScreenedChoice if screened else _OutputProjection)(decoder), (hidden,)),
            }
            ms = {part: _best_ms(aoti_compile(module, inputs), *inputs) for part, (module, inputs) in parts.items()}
            # The step itself and the rest, timed inside real generate calls.
            runners = state.steps.runners
            for key in list(runners):
                runners[key] = _TimedRunner(runners[key])
            source_ids = tokens(1, args.source_length)
            total, setup, step_seconds, step_calls = 0.0, 0.0, 0.0, 0
            for _ in range(args.repeats):
                timed = [runner for runner in runners.values()]
                for runner in timed:
                    runner.seconds, runner.calls, runner.first_start = 0.0, 0, None
                start = time.perf_counter()
                generate(name, engines[name], source_ids, beams, args)
                total += time.perf_counter() - start
                first = min(r.first_start for r in timed if r.first_start is not None)
                setup += first - start
                # summed over the repetitions, as `total` and `setup` are (each runner restarts its count above)
                step_seconds += sum(r.seconds for r in timed)
                step_calls += sum(r.calls for r in timed)
            for key in list(runners):
                runners[key] = runners[key].runner
            new = args.new_tokens * args.repeats
            step_ms = step_seconds / step_calls * 1e3
            ms["rest of the step (norms, embeddings, logits processing, bookkeeping)"] = step_ms - sum(ms.values())
            ms["encoder and generate() set-up, per token"] = setup / new * 1e3
            ms["Python loop and call overhead"] = (total - setup - step_seconds) / new * 1e3
            weights = sum(
                linear.nbytes() for layer in decoder.layers for linear in layer.children() if hasattr(linear, "nbytes")
            )
            nbytes = {
                "decoder projections (GEMV)": weights,
                "attention (self + cross)": 4
                * (2 * args.layers * rows * length * dim + 2 * args.layers * source * dim),
                head: decoder.screen.nbytes(rows) if screened else decoder.lm_head.nbytes(),
            }
            token_ms = total / new * 1e3
            print(f"\nprofile: {name}, {label}: {token_ms:.3f} ms per token ({1e3 / token_ms:.0f} tok/s)")
            print(f"| {'part':<72} | {'ms/token':>8} | {'share':>6} | {'MB/token':>8} | {'GB/s':>6} |")
            print(f"|{'-' * 74}|{'-' * 10}|{'-' * 8}|{'-' * 10}|{'-' * 8}|")
            for part, value in ms.items():
                mb = nbytes.get(part)
                rate = f"{mb / value / 1e6:>6.1f}" if mb and value > 0 else f"{'':>6}"
                mb_cell = f"{mb / 1e6:>8.2f}" if mb else f"{'':>8}"
                print(f"| {part:<72} | {value:>8.3f} | {value / token_ms:>6.1%} | {mb_cell} | {rate} |")
            step_mb = sum(nbytes.values())
            print(
                f"| {'the compiled step (one graph)':<72} | {step_ms:>8.3f} | {step_ms / token_ms:>6.1%} | "
                f"{step_mb / 1e6:>8.2f} | {step_mb / step_ms / 1e6:>6.1f} |"
            )
            floor_ms = step_mb / read_rate * 1e3
            floor = "floor: the step's bytes at a plain read's rate (torch.sum of 256 MB)"
            print(
                f"| {floor:<72} "
                f"| {floor_ms:>8.3f} | {floor_ms / token_ms:>6.1%} | {step_mb / 1e6:>8.2f} | {read_rate / 1e9:>6.1f} |"
            )
            tables[f"{name}: {label}"] = {
                "token_ms": token_ms,
                "step_ms": step_ms,
                "parts": ms,
                "bytes": nbytes,
                "read_rate_gbs": read_rate / 1e9,
                "floor_ms": floor_ms,
            }
    return tables


def memory_read_rate(megabytes: int = 256) -> float:
    """Bytes per second of a plain read of `megabytes` of float32 (`torch.sum`, this process's threads): about the
    most a memory-bound step can stream here, so the step's bytes at this rate are its floor."""
    data = torch.ones(megabytes * 2**20 // 4)
    return data.numel() * 4 / (_best_ms(torch.sum, data, rounds=3, calls=5) / 1e3)


# ------------------------------------------------------------------------------------------------ the quality
def _token_agreement(outputs: list[list[int]], references: list[list[int]]) -> float:
    equal = total = 0
    for out, ref in zip(outputs, references):
        equal += sum(a == b for a, b in zip(out, ref))
        total += max(len(out), len(ref))
    return equal / total


def _strip(ids: torch.Tensor, special: set[int]) -> list[list[int]]:
    return [[t for t in row if t not in special] for row in ids.tolist()]


@torch.no_grad()
def quality(args) -> dict:
    """BLEU / chrF and agreement with float32 `generate`, per engine, on the SWORD test verses (see the docstring)."""
    import sys

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_vit_plus.export import export_ctranslate2
    from hf_vit_plus.metrics import load_translation_metric
    from hf_vit_plus.models.fast_decoding import FastDecoding
    from hf_vit_plus.models.pipeline_text2text_generation import CTranslate2Generator

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import train_translation

    test = train_translation.load_pairs(train_translation.parse_args(["--output_dir", "unused"]))["test"]
    sources, references = test["source"], test["target"]
    if args.quality_limit:
        sources, references = sources[: args.quality_limit], references[: args.quality_limit]
    model = AutoModelForSeq2SeqLM.from_pretrained(args.quality).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.quality)
    special = set(tokenizer.all_special_ids)
    workdir = tempfile.TemporaryDirectory(prefix="bench_seq2seq_quality_")
    engines = {"generate float32": ("generate", None)}
    for precision in args.quality_precisions:
        engines[f"fast {precision}"] = ("fast", FastDecoding(precision=precision, backend=args.fast_backend))
    compute_types = args.quality_ctranslate2
    folder = export_ctranslate2(model, Path(workdir.name) / "ct2", tokenizer=tokenizer) if compute_types else None
    for compute_type in compute_types:
        generator = CTranslate2Generator(folder, compute_type=compute_type, intra_threads=args.threads[0])
        engines[f"ctranslate2 {compute_type}"] = ("ctranslate2", generator)
    metric = load_translation_metric()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    modes = {"greedy": dict(num_beams=1), "beam 4": dict(num_beams=4, length_penalty=0.6)}
    results: dict = {}
    for mode, settings in modes.items():
        reference_ids = None
        for name, (kind, engine) in engines.items():
            ids: list[list[int]] = [[] for _ in sources]
            texts: list[str] = [""] * len(sources)
            start = time.perf_counter()
            for first in range(0, len(order), args.quality_batch):
                index = order[first : first + args.quality_batch]
                batch = tokenizer([sources[i] for i in index], return_tensors="pt", padding=True)
                extra = dict(settings, max_new_tokens=batch["input_ids"].shape[1] + 50)
                if kind == "ctranslate2":
                    out = engine.generate(batch["input_ids"], batch["attention_mask"], **extra)
                else:
                    if kind == "fast":
                        extra["custom_generate"] = engine
                    out = model.generate(**batch, **extra)
                for i, row, text in zip(
                    index, _strip(out, special), tokenizer.batch_decode(out, skip_special_tokens=True)
                ):
                    ids[i], texts[i] = row, text.strip()
            seconds = time.perf_counter() - start
            if reference_ids is None:
                reference_ids = ids
            scores = metric.compute(predictions=texts, references=references)
            entry = {
                "bleu": round(scores["bleu"], 2),
                "chrf": round(scores["chrf"], 2),
                "identical": sum(a == b for a, b in zip(ids, reference_ids)) / len(ids),
                "agreement": _token_agreement(ids, reference_ids),
                "seconds": round(seconds, 1),
            }
            results[f"{mode}: {name}"] = entry
            print(
                f"| {mode:<7} | {name:<28} | {entry['bleu']:>6.2f} | {entry['chrf']:>6.2f} | "
                f"{entry['identical']:>7.1%} | {entry['agreement']:>7.2%} | {seconds:>7.1f} |",
                flush=True,
            )
    workdir.cleanup()
    if args.output is not None:
        rows = [
            dict(
                mode=key.split(": ", 1)[0], engine=key.split(": ", 1)[1], **entry, ctranslate2=_version("ctranslate2")
            )
            for key, entry in results.items()
        ]
        print(f"wrote {_write_rows(args.output, rows, threads=args.threads[0])}")
    return results


if __name__ == "__main__":
    main()
