"""Translation speed of hf_vit_plus's encoder-decoder Transformer against transformers' `MarianMTModel` and
CTranslate2, every engine holding the same weights.

One randomly initialised `MarianMTModel` with opus-mt's conventions (swish feed-forward, sines then cosines,
embeddings scaled by sqrt(d_model), an output bias, post-norm, tied embeddings, pad = decoder start token, eos 0) is
the reference. Our model is `hf_vit_plus.conversion.seq2seq_from_marian` of it; CTranslate2's models come from its
own converter (`ctranslate2.converters.TransformersConverter`) run on the same saved folder. Engines (`--engines`):

- marian: transformers' MarianMTModel, eager (the reference of the ratios);
- ours: our model, eager, dynamic cache;
- ours-compiled: `generate(..., cache_implementation="static", compile_config=CompileConfig(...))`: the decoding
  step runs compiled by torch.compile, with fixed shapes; each (batch size x beams, maximum length) compiles once,
  at its first call, which is left out of the rates and reported in a second table;
- ours-int8: our model quantized by `hf_vit_plus.quantization.quantize(model, "int8-dynamic")` (torchao: int8
  weights and activations), decoded compiled as above; ours-int8-eager (not in the default set): the same, eager;
- ct2-fp32, ct2-int8: CTranslate2 `Translator(compute_type="float32" / "int8")`, `translate_batch` on token strings.

Each engine generates exactly `--new_tokens` tokens (transformers: min = max new tokens; CTranslate2: min = max
decoding length), so that all do the same work whatever they predict. Cases: greedy and beam 4, at each batch size;
training (forward + backward + Adam step, dropout 0.1, on copies of the weights) for marian and ours only.

Measurements rotate over the engines, repetition by repetition (each engine takes each place in the order in turn),
on the same inputs, so that load on the machine affects all alike; the table gives median rates and the median of
the per-repetition ratios to marian, with their range. A first untimed call of every engine and case warms up
(and compiles). The greedy tokens of the first batch are compared with Marian's as a check of identical weights
(int8 engines are expected to differ somewhat). torch keeps compiled kernels in an on-disk cache: a second run
compiles faster; `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1` measures a cold compilation.

    python scripts/benchmarks/bench_seq2seq.py                       # small sizes, one thread, every engine
    python scripts/benchmarks/bench_seq2seq.py --quick               # a short check that every engine runs
    python scripts/benchmarks/bench_seq2seq.py --d_model 512 --layers 6 --ffn_dim 2048 --heads 8 --threads 8
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import CompileConfig, MarianConfig, MarianMTModel

from hf_vit_plus.cli_utils import CommandParser
from hf_vit_plus.conversion import seq2seq_from_marian

ENGINES = ("marian", "ours", "ours-compiled", "ours-int8", "ours-int8-eager", "ct2-fp32", "ct2-int8")
DEFAULT_ENGINES = ("marian", "ours", "ours-compiled", "ours-int8", "ct2-fp32", "ct2-int8")
TRAINABLE = ("marian", "ours")
COMPILED = ("ours-compiled", "ours-int8")
EOS, UNK = 0, 1  # Marian's ids; the pad token (also the decoder start) is the last id


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab_size", type=int, default=8000, help="shared vocabulary size")
    p.add_argument("--d_model", type=int, default=256, help="model width")
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--ffn_dim", type=int, default=1024, help="feed-forward width")
    p.add_argument("--activation", default="swish", help="feed-forward activation (opus-mt: swish)")
    # Defaults of the full run; --quick replaces those not given.
    p.add_argument("--source_length", type=int, help="source tokens per sequence (32)")
    p.add_argument("--new_tokens", type=int, help="tokens generated per sequence, exactly (32)")
    p.add_argument("--batch_sizes", type=int, nargs="+", help="generation batch sizes (1 16)")
    p.add_argument("--beams", type=int, nargs="+", help="beam sizes, 1 = greedy (1 4)")
    p.add_argument("--train_batch", type=int, help="sequences per training step, 0 = no training case (16)")
    p.add_argument("--repeats", type=int, help="timed repetitions per engine and case (3)")
    p.add_argument("--threads", type=int, default=1, help="torch and CTranslate2 (intra_threads) threads")
    p.add_argument("--attn_implementation", default="sdpa", choices=["eager", "sdpa"], help="torch models' kernel")
    p.add_argument("--engines", default=",".join(DEFAULT_ENGINES), help=f"comma-separated, from {', '.join(ENGINES)}")
    p.add_argument("--compile_mode", default="default", help="torch.compile mode of the compiled engines")
    p.add_argument("--quick", action="store_true", help="short defaults: 1 repeat, 8 + 8 tokens, batch 1 2, beam 1 2")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    args = p.parse_args(argv)
    args.engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = [name for name in args.engines if name not in ENGINES]
    if unknown or "marian" not in args.engines:
        p.error(f"--engines: unknown {unknown} or no 'marian' (the reference); choose from {', '.join(ENGINES)}")
    full = dict(source_length=32, new_tokens=32, batch_sizes=[1, 16], beams=[1, 4], train_batch=16, repeats=3)
    quick = dict(source_length=8, new_tokens=8, batch_sizes=[1, 2], beams=[1, 2], train_batch=2, repeats=1)
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
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
            translator = ctranslate2.Translator(
                str(path), device=device, compute_type=quantization, intra_threads=args.threads, inter_threads=1
            )
            translators[name] = CTranslate2Engine(translator, vocabulary)
    return translators


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    try:
        from hf_vit_plus.quantization import quantize
    except ImportError:  # an older hf_vit_plus: torchao directly
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantize_(model, Int8DynamicActivationInt8WeightConfig())
        return model
    return quantize(model, "int8-dynamic")


def build_engines(args: argparse.Namespace, workdir: Path) -> tuple[dict, dict]:
    """The engines to time, and copies of marian and ours for the training case (training changes weights)."""
    marian = build_marian(args)
    engines = {"marian": marian.to(args.device)}
    ours = seq2seq_from_marian(marian)
    for name in ("ours", "ours-compiled", "ours-int8", "ours-int8-eager"):
        if name in args.engines:
            model = copy.deepcopy(ours)
            engines[name] = quantize_int8(model) if "int8" in name else model
    if any(name.startswith("ct2") for name in args.engines):
        marian.save_pretrained(workdir / "marian")
        engines.update(build_ctranslate2(workdir / "marian", workdir, args))
    trainable = {}
    if args.train_batch:
        trainable = {name: copy.deepcopy(engines[name]) for name in TRAINABLE if name in args.engines}
    return {name: engines[name] for name in args.engines}, trainable


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
    extra = {}
    if name in COMPILED:
        extra = dict(cache_implementation="static", compile_config=args.compile_config)
    output = engine.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        num_beams=beams,
        do_sample=False,
        length_penalty=1.0,
        min_new_tokens=n,
        max_new_tokens=n,
        **extra,
    )
    return output[:, 1:]  # without the decoder start token


def timed_generate(name: str, engine, input_ids, beams: int, args) -> tuple[float, torch.Tensor]:
    """(seconds, new tokens) of one `generate` call."""
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
    torch.set_num_threads(args.threads)
    args.compile_config = compile_config(args)
    # Every (engine, batch x beams) shape of the compiled engines is one more compiled graph of the same code.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    workdir = tempfile.TemporaryDirectory(prefix="bench_seq2seq_")
    engines, trainable = build_engines(args, Path(workdir.name))
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
    rates = {label: {name: [] for name in names} for label, _, _ in cases}
    first_calls: dict[str, dict[str, float]] = {label: {} for label, _, _ in cases}
    agreement: dict[str, float] = {}
    for label, batch, beams in cases:  # untimed first calls: warm-up, and compilation of the compiled engines
        source = tokens(batch, args.source_length)
        outputs = {}
        for name in names:
            seconds, outputs[name] = timed_generate(name, engines[name], source, beams, args)
            first_calls[label][name] = seconds
        if beams == 1 and not agreement:
            reference = outputs["marian"].cpu()
            agreement = {name: (out.cpu() == reference).float().mean().item() for name, out in outputs.items()}
    graphs_before = compiled_graphs()
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for label, batch, beams in cases:
            source = tokens(batch, args.source_length)  # the same inputs for every engine of this repetition
            for name in order:
                seconds, _ = timed_generate(name, engines[name], source, beams, args)
                rates[label][name].append(batch * args.new_tokens / seconds)
    args.recompiled = compiled_graphs() - graphs_before
    if trainable:
        label = f"train fwd+bwd+step, batch {args.train_batch}"
        rates[label] = {name: [] for name in trainable}
        for name in trainable:  # warm-up
            training_rate(trainable[name], optimizers[name], tokens(2, 8), tokens(2, 8), args.device, steps=1)
        for repeat in range(args.repeats):
            source, target = tokens(args.train_batch, args.source_length), tokens(args.train_batch, args.new_tokens)
            for name in list(trainable) if repeat % 2 == 0 else list(trainable)[::-1]:
                rate = training_rate(trainable[name], optimizers[name], source, target, args.device)
                rates[label][name].append(rate)
    summary = report(args, rates, first_calls, agreement)
    workdir.cleanup()
    return summary


def report(args, rates, first_calls, agreement) -> dict[str, dict[str, dict]]:
    print(
        f"device {args.device}, {args.threads} thread(s), attn {args.attn_implementation}, compile mode "
        f"{args.compile_mode!r}; vocab {args.vocab_size}, d_model {args.d_model}, {args.layers}+{args.layers} layers, "
        f"{args.heads} heads, ffn {args.ffn_dim}, {args.activation}; source {args.source_length} tokens, "
        f"{args.new_tokens} new tokens; median of {args.repeats}"
    )
    print(
        "greedy tokens equal to Marian's (first batch): "
        + ", ".join(f"{name} {share:.0%}" for name, share in agreement.items() if name != "marian")
    )
    print("vs marian: median of the per-repetition ratios to marian eager (measured in turn), with their range")
    header = f"| {'case':<30} | {'engine':<15} | {'tok/s':>9} | {'vs marian':>9} | {'range':>11} |"
    print(header)
    print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    summary: dict[str, dict[str, dict]] = {}
    for label, by_engine in rates.items():
        summary[label] = {}
        for i, (name, values) in enumerate(by_engine.items()):
            paired = [a / b for a, b in zip(values, by_engine["marian"])]
            entry = {"rate": statistics.median(values), "ratio": statistics.median(paired)}
            entry["range"] = (min(paired), max(paired))
            summary[label][name] = entry
            spread = "" if name == "marian" else f"{entry['range'][0]:.2f}-{entry['range'][1]:.2f}"
            case = label if i == 0 else ""
            print(f"| {case:<30} | {name:<15} | {entry['rate']:>9.1f} | {entry['ratio']:>8.2f}x | {spread:>11} |")
    compiled = [name for name in COMPILED if name in args.engines]
    if compiled:
        print(
            "compilation: first call of each shape minus the median timed call, in seconds (paid once per shape); "
            f"graphs compiled during the timed calls: {args.recompiled} (0 expected)"
        )
        header = f"| {'case':<30} | " + " | ".join(f"{name:>13}" for name in compiled) + " |"
        print(header)
        print("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
        for label, firsts in first_calls.items():
            batch = int(label.rsplit(" ", 1)[1])
            cells = []
            for name in compiled:
                steady = batch * args.new_tokens / summary[label][name]["rate"]
                summary[label][name]["compile_s"] = max(0.0, firsts[name] - steady)  # 0: an earlier shape's graph
                cells.append(f"{summary[label][name]['compile_s']:>13.1f}")
            print(f"| {label:<30} | " + " | ".join(cells) + " |")
    return summary


if __name__ == "__main__":
    main()
