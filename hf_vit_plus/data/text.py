"""Real text with no network: the bytes of the running interpreter's standard-library Python sources.

Byte-level language modelling as in the Sparse Transformer's enwik8 experiment (bits per byte). Token ids are
transformers' `ByT5Tokenizer(extra_ids=0)` numbering: pad = 0, eos = 1 (also the file separator), unk = 2,
byte b = b + 3; 259 ids in all. `byte_tokenizer()` (a plain fast tokenizer with the same ids that adds no `</s>`)
encodes prompts, decodes `generate()` output and is saved next to a checkpoint.

The train / held-out split is by file (a hash of the path relative to the standard library), so it is the same on
every run and no file is split between the two.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
BYTE_OFFSET = 3
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET
# Large, repetitive or generated parts of the standard library that would dominate the data.
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})


def byte_tokenizer():
    """A fast byte tokenizer with these ids (ByT5's numbering: pad 0, `</s>` 1, unk 2, byte b = b + 3) that adds no
    special token to a prompt, so `pipeline("text-generation")` continues the prompt itself.

    ByT5's own tokenizer appends `</s>` (here: end of document) to every encoded text, and the pipeline encodes
    prompts with the tokenizer's defaults: the model was then asked to start a new document. This one is a plain
    `PreTrainedTokenizerFast` (tokenizer.json), so `AutoTokenizer` loads it without custom code. Byte-level
    pre-tokenization maps each byte to one symbol of a 256-symbol vocabulary (no merges); decoding joins the bytes
    and replaces invalid UTF-8.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's byte -> symbol table (what the ByteLevel pre-tokenizer emits): printable Latin-1 bytes stand for
    # themselves, the others for chr(256), chr(257), ... in byte order.
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shift)
            shift += 1
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": PAD_ID, "</s>": EOS_ID, "<unk>": UNK_ID}
    vocab.update({table[byte]: byte + BYTE_OFFSET for byte in range(256)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="</s>"
    )


def encode_bytes(data: bytes) -> np.ndarray:
    """Bytes -> token ids (int64), byte b -> b + 3."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64) + BYTE_OFFSET


def decode_ids(ids) -> bytes:
    """Token ids -> bytes, dropping the special ids."""
    ids = np.asarray(ids, dtype=np.int64)
    return (ids[ids >= BYTE_OFFSET] - BYTE_OFFSET).astype(np.uint8).tobytes()


def stdlib_source_files(root: str | Path | None = None) -> list[Path]:
    """Sorted `.py` files of the standard library (`sysconfig.get_paths()["stdlib"]` by default)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ValueError(f"Standard-library folder {str(root)!r} does not exist.")
    files = [path for path in root.rglob("*.py") if not EXCLUDED_DIRS & set(path.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda path: path.relative_to(root).as_posix())


def is_heldout(relative_path: str, heldout_fraction: float) -> bool:
    """Deterministic split by file: a CRC-32 of the relative path, so the split never changes between runs."""
    return zlib.crc32(relative_path.encode("utf-8")) % 10_000 < heldout_fraction * 10_000


def load_stdlib_text(
    max_train_bytes: int | None = None,
    max_heldout_bytes: int | None = None,
    heldout_fraction: float = 0.1,
    root: str | Path | None = None,
) -> dict[str, np.ndarray]:
    """Token ids of the standard-library sources: {"train": ids, "heldout": ids}, each a 1-D int64 array with
    `</s>` (id 1) between files. Files are read in sorted order until each split reaches its byte budget.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"`heldout_fraction` must be in (0, 1), got {heldout_fraction!r}.")
    root = Path(root or sysconfig.get_paths()["stdlib"])
    budgets = {"train": max_train_bytes, "heldout": max_heldout_bytes}
    chunks: dict[str, list[np.ndarray]] = {"train": [], "heldout": []}
    sizes = {"train": 0, "heldout": 0}
    separator = np.array([EOS_ID], dtype=np.int64)
    for path in stdlib_source_files(root):
        split = "heldout" if is_heldout(path.relative_to(root).as_posix(), heldout_fraction) else "train"
        budget = budgets[split]
        if budget is not None and sizes[split] >= budget:
            if all(budgets[s] is not None and sizes[s] >= budgets[s] for s in budgets):
                break
            continue
        ids = encode_bytes(path.read_bytes())
        if budget is not None:
            ids = ids[: budget - sizes[split]]
        chunks[split] += [ids, separator]
        sizes[split] += len(ids)
    result = {split: np.concatenate(parts) if parts else np.zeros(0, np.int64) for split, parts in chunks.items()}
    for split, ids in result.items():
        if len(ids) == 0:
            raise ValueError(f"No {split} text found under {str(root)!r} (heldout_fraction={heldout_fraction}).")
    return result


def random_windows(ids: np.ndarray, block_size: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """A batch (batch_size, block_size) of windows starting at random offsets (for training)."""
    if len(ids) < block_size:
        raise ValueError(f"The text has {len(ids)} tokens, fewer than block_size={block_size}.")
    starts = torch.randint(0, len(ids) - block_size + 1, (batch_size,), generator=generator).tolist()
    return torch.stack([torch.from_numpy(ids[start : start + block_size]) for start in starts])


def sequential_windows(ids: np.ndarray, block_size: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows (num_windows, block_size) for evaluation; with `max_windows`, that many windows
    evenly spaced over the whole text (so a few files' headers do not stand for all of it)."""
    available = len(ids) // block_size
    if available == 0:
        raise ValueError(f"The text has {len(ids)} tokens, fewer than block_size={block_size}.")
    num_windows = available if max_windows is None else min(available, max_windows)
    indices = np.linspace(0, available - 1, num_windows).round().astype(np.int64)
    return torch.stack([torch.from_numpy(ids[i * block_size : (i + 1) * block_size].copy()) for i in indices])


def unigram_entropy_bits(ids: np.ndarray) -> float:
    """Entropy in bits of the empirical distribution of the ids: the bits per byte of the best context-free model."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64))
    probs = counts[counts > 0] / counts.sum()
    return float(-(probs * np.log2(probs)).sum())


__all__ = [
    "BYTE_OFFSET",
    "BYTE_VOCAB_SIZE",
    "EOS_ID",
    "PAD_ID",
    "byte_tokenizer",
    "decode_ids",
    "encode_bytes",
    "load_stdlib_text",
    "random_windows",
    "sequential_windows",
    "stdlib_source_files",
    "unigram_entropy_bits",
]
