"""Throughput of hf_vit_plus's encoder-decoder Transformer against transformers' `MarianMTModel` of the same shape.

Both models are built at random init from configs with the same vocabulary, width, depth, heads, feed-forward
size, ReLU, sinusoidal (static) positions, embeddings scaled by sqrt(d_model), post-norm layers and tied embeddings;
the same attention implementation is requested for both. Measurements alternate between the two models, repetition
by repetition, so that load on the machine affects both alike; the table reports medians.

- generation: new tokens per second, greedy and beam 4, batch 1 and 16; exactly `--new_tokens` tokens are
  generated (min = max new tokens) so that both models do the same work whatever they predict;
- training: (source + target) tokens per second of forward + backward + Adam step, dropout 0.1.

    python scripts/benchmarks/bench_seq2seq.py                       # small sizes, one thread
    python scripts/benchmarks/bench_seq2seq.py --d_model 512 --layers 6 --ffn_dim 2048 --heads 8 --threads 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForSeq2SeqLM, MarianConfig

from hf_vit_plus import Seq2SeqTransformerConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab_size", type=int, default=8000, help="shared vocabulary size")
    p.add_argument("--d_model", type=int, default=256, help="model width")
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--ffn_dim", type=int, default=1024, help="feed-forward width")
    p.add_argument("--source_length", type=int, default=32, help="source tokens per sequence")
    p.add_argument("--new_tokens", type=int, default=32, help="tokens generated per sequence (exactly)")
    p.add_argument("--train_batch", type=int, default=16, help="sequences per training step")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per model and case")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--attn_implementation", default="sdpa", choices=["eager", "sdpa"], help="kernel of both models")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    return p.parse_args(argv)


def build_models(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    pad, bos, eos = 0, 1, 2
    shape = dict(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn_dim,
        decoder_ffn_dim=args.ffn_dim,
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=args.source_length + args.new_tokens + 8,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=bos,
        tie_word_embeddings=True,
    )
    ours = Seq2SeqTransformerConfig(bos_token_id=bos, label_smoothing=0.0, **shape)
    marian = MarianConfig(share_encoder_decoder_embeddings=True, forced_eos_token_id=None, **shape)
    models = {}
    for name, config in (("hf_vit_plus", ours), ("marian", marian)):
        torch.manual_seed(0)
        model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=args.attn_implementation)
        models[name] = model.to(args.device)
    return models


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def generation_rate(model, input_ids, new_tokens: int, num_beams: int, device: str) -> float:
    model.eval()
    sync(device)
    start = time.perf_counter()
    model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        num_beams=num_beams,
        do_sample=False,
        length_penalty=1.0,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
    )
    sync(device)
    return input_ids.shape[0] * new_tokens / (time.perf_counter() - start)


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


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    models = build_models(args)
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, m in models.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    generator = torch.Generator().manual_seed(0)

    def tokens(batch: int, length: int) -> torch.Tensor:
        return torch.randint(3, args.vocab_size, (batch, length), generator=generator).to(args.device)

    cases = [(f"generate greedy, batch {b}", "gen", b, 1) for b in (1, 16)]
    cases += [(f"generate beam 4, batch {b}", "gen", b, 4) for b in (1, 16)]
    cases.append((f"train fwd+bwd+step, batch {args.train_batch}", "train", args.train_batch, 0))
    rates: dict[str, dict[str, list[float]]] = {case[0]: {name: [] for name in models} for case in cases}
    for _label, kind, batch, beams in cases:  # one warm-up run of each case per model
        for name, model in models.items():
            if kind == "gen":
                generation_rate(model, tokens(batch, args.source_length), 4, beams, args.device)
            else:
                training_rate(model, optimizers[name], tokens(batch, 8), tokens(batch, 8), args.device, steps=1)
    names = list(models)
    for repeat in range(args.repeats):
        for label, kind, batch, beams in cases:
            source, target = tokens(batch, args.source_length), tokens(batch, args.new_tokens)
            # Same inputs, back to back; who goes first alternates, so that neither model always runs on a warmer
            # (or more loaded) machine than the other.
            for name in names if repeat % 2 == 0 else names[::-1]:
                model = models[name]
                if kind == "gen":
                    rate = generation_rate(model, source, args.new_tokens, beams, args.device)
                else:
                    rate = training_rate(model, optimizers[name], source, target, args.device)
                rates[label][name].append(rate)

    print(
        f"device {args.device}, {args.threads} thread(s), attn {args.attn_implementation}; vocab {args.vocab_size}, "
        f"d_model {args.d_model}, {args.layers}+{args.layers} layers, {args.heads} heads, ffn {args.ffn_dim}; "
        f"source {args.source_length} tokens, {args.new_tokens} new tokens; median of {args.repeats}"
    )
    print(f"parameters: hf_vit_plus {params['hf_vit_plus'] / 1e6:.2f}M, marian {params['marian'] / 1e6:.2f}M")
    print("ratio: median of the per-repetition ratios (each pair measured back to back), with their range")
    header = f"| {'case':<30} | {'hf_vit_plus tok/s':>17} | {'Marian tok/s':>12} | {'ratio':>6} | {'range':>11} |"
    print(header)
    print("|" + "|".join("-" * (len(cell) + 0) for cell in header.split("|")[1:-1]) + "|")
    summary = {}
    for label, by_model in rates.items():
        ours, marian = statistics.median(by_model["hf_vit_plus"]), statistics.median(by_model["marian"])
        paired = [a / b for a, b in zip(by_model["hf_vit_plus"], by_model["marian"])]
        ratio = statistics.median(paired)
        summary[label] = {"hf_vit_plus": ours, "marian": marian, "ratio": ratio, "range": (min(paired), max(paired))}
        spread = f"{min(paired):.2f}-{max(paired):.2f}"
        print(f"| {label:<30} | {ours:>17.1f} | {marian:>12.1f} | {ratio:>5.2f}x | {spread:>11} |")
    return summary


if __name__ == "__main__":
    main()
