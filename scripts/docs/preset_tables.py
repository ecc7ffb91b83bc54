"""Write the presets tables of the model pages (docs/families/*.md) from the configs themselves: each preset's layers,
width, heads and parameters, the parameters counted on a model built on the meta device (no memory, no weights).

    python scripts/docs/preset_tables.py            # rewrite the tables between the pages' markers
    python scripts/docs/preset_tables.py --check    # exit 1 when a page's table is not what the configs give

Each table sits between `<!-- presets: begin -->` and `<!-- presets: end -->` on its page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"vit": "families/vit.md", "seq2seq": "families/seq2seq.md", "sparse": "families/sparse.md"}
BEGIN, END = "<!-- presets: begin -->", "<!-- presets: end -->"


def _parameters(model_class, config) -> int:
    import torch

    with torch.device("meta"):
        model = model_class(config)
    return sum(parameter.numel() for parameter in model.parameters())


def _millions(count: int) -> str:
    return f"{count / 1e6:,.1f}M ({count:,})"


def vit_rows() -> list[tuple[str, ...]]:
    from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification
    from hf_vit_plus.models.configuration_vit_plus import VIT_PLUS_PATCH_SIZES, VIT_PLUS_SIZES

    rows = []
    for size in VIT_PLUS_SIZES:
        for patch in VIT_PLUS_PATCH_SIZES:
            config = ViTPlusConfig.from_preset(f"{size}-patch{patch}-224", num_labels=1000)
            count = _parameters(ViTPlusForImageClassification, config)
            rows.append(
                (
                    f"`{size}-patch{patch}-224`",
                    str(config.num_hidden_layers),
                    str(config.hidden_size),
                    str(config.intermediate_size),
                    str(config.num_attention_heads),
                    _millions(count),
                )
            )
    return rows


def seq2seq_rows() -> list[tuple[str, ...]]:
    from hf_vit_plus import Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration
    from hf_vit_plus.models.configuration_seq2seq_transformer import SEQ2SEQ_TRANSFORMER_PRESETS

    rows = []
    for name in SEQ2SEQ_TRANSFORMER_PRESETS:
        config = Seq2SeqTransformerConfig.from_preset(name, vocab_size=37000)
        count = _parameters(Seq2SeqTransformerForConditionalGeneration, config)
        rows.append(
            (
                f'`from_preset("{name}")`',
                f"{config.encoder_layers} + {config.decoder_layers}",
                str(config.d_model),
                str(config.encoder_ffn_dim),
                str(config.encoder_attention_heads),
                _millions(count),
            )
        )
    return rows


def sparse_rows() -> list[tuple[str, ...]]:
    from hf_vit_plus import SparseTransformerConfig, SparseTransformerForCausalLM, SparseTransformerForImageGeneration

    cases = [
        ("`SparseTransformerConfig()` (enwik8, bytes)", SparseTransformerConfig(), SparseTransformerForCausalLM),
        (
            "`SparseTransformerConfig.for_images(28, 28)`",
            SparseTransformerConfig.for_images(28, 28),
            SparseTransformerForImageGeneration,
        ),
        (
            "`SparseTransformerConfig.for_images(32, 32, num_channels=3)`",
            SparseTransformerConfig.for_images(32, 32, num_channels=3),
            SparseTransformerForImageGeneration,
        ),
    ]
    return [
        (
            name,
            str(config.num_hidden_layers),
            str(config.hidden_size),
            str(config.intermediate_size),
            str(config.num_attention_heads),
            _millions(_parameters(model_class, config)),
        )
        for name, config, model_class in cases
    ]


HEADERS = {
    "vit": ("preset (1000 classes)", "layers", "width", "MLP", "heads", "parameters"),
    "seq2seq": ("preset (vocabulary 37,000)", "layers", "width", "feed-forward", "heads", "parameters"),
    "sparse": ("config", "layers", "width", "MLP", "heads", "parameters"),
}
ROWS = {"vit": vit_rows, "seq2seq": seq2seq_rows, "sparse": sparse_rows}


def table(family: str) -> str:
    """The family's presets table in Markdown."""
    header = HEADERS[family]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in ROWS[family]()]
    return "\n".join(lines)


def render_page(text: str, family: str) -> str:
    """The page's text with its table between the markers replaced by the configs' one."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + table(family) + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    from hf_vit_plus.cli_utils import CommandParser

    parser = CommandParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare the pages' tables with the configs")
    args = parser.parse_args(argv)
    stale = []
    for family, page in PAGES.items():
        path = ROOT / "docs" / page
        text = path.read_text(encoding="utf-8")
        rendered = render_page(text, family)
        if rendered != text:
            stale.append(page)
            if not args.check:
                path.write_text(rendered, encoding="utf-8")
    if args.check and stale:
        print(f"presets tables out of date: {stale}: run python scripts/docs/preset_tables.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
