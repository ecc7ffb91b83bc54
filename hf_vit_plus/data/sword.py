"""Verse-aligned parallel text from SWORD zText Bible modules, read with no SWORD library and no network.

Debian ships two public-domain Bibles with the same (KJV) versification; install them with

    sudo apt-get install sword-text-kjv sword-text-sparv

They land in `/usr/share/sword` (module configs in `mods.d/`, data in `modules/texts/ztext/<module>/`).
`load_sword_parallel_dataset()` pairs the King James Version (English) with the Reina-Valera 1909 (Spanish)
verse by verse: about 31,000 pairs.

The zText format (SWORD's `zverse.cpp`), one set of three files per testament (`ot.*`, `nt.*`):
- `.bzs`: one 12-byte entry per compressed block, `<III` = offset in `.bzz`, compressed size, uncompressed size;
- `.bzv`: one 10-byte entry per verse slot, `<IIH` = block number, start and size inside the uncompressed block;
- `.bzz`: the zlib-compressed blocks, concatenated.
Slots follow the versification: slot 0 is the module heading, 1 the testament heading, then for each book a book
heading, and for each chapter a chapter heading followed by its verses. Two modules with the same versification
therefore align slot by slot. Headings hold only markup or titles, which `strip_markup` removes; slots that end up
empty on either side are dropped.
"""

from __future__ import annotations

import html
import logging
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset, DatasetDict

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SWORD_ROOTS",
    "ZTextModule",
    "find_sword_module",
    "load_sword_parallel_dataset",
    "parallel_verses",
    "strip_markup",
]

DEFAULT_SWORD_ROOTS = (Path("/usr/share/sword"), Path.home() / ".sword")
KJV_MODULE = "engKJV2006eb"  # Debian package sword-text-kjv
SPANISH_RV1909_MODULE = "spaRV1909eb"  # Debian package sword-text-sparv
TESTAMENTS = ("ot", "nt")
_BLOCK_ENTRY = struct.Struct("<III")
_VERSE_ENTRY = struct.Struct("<IIH")

# Elements whose text is not verse text: footnotes (OSIS <note>, GBF <RF>..<Rf>) and non-canonical headings.
_DROP_WITH_CONTENT = re.compile(
    r"<note\b[^>]*?/>|<note\b.*?</note>|<RF>.*?<Rf>|<title\b(?![^>]*canonical=\"true\")[^>]*>.*?</title>",
    flags=re.DOTALL,
)
_TAG = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r" ([,.;:!?)])")


def strip_markup(text: str) -> str:
    """Plain text of one OSIS or GBF verse: footnotes and non-canonical titles removed with their content, every
    other tag removed (its content kept), entities unescaped, whitespace collapsed."""
    text = _DROP_WITH_CONTENT.sub(" ", text)
    text = _TAG.sub(" ", text)
    text = html.unescape(text)
    text = _SPACES.sub(" ", text).strip()
    # Tags such as </w> sat between a word and its punctuation; removing them left a space there.
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text)


@dataclass(frozen=True)
class _Testament:
    blocks: list[tuple[int, int, int]]
    verses: list[tuple[int, int, int]]
    data: bytes


class ZTextModule:
    """Read-only access to a zText module folder (the one holding `ot.bzs`, `ot.bzv`, `ot.bzz`, `nt.*`).

    `module.raw(testament, slot)` gives the stored markup of one verse slot; `module.slots(testament)` the number
    of slots. Blocks are decompressed on first use and cached.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"not a zText module folder: {str(self.path)!r}")
        self._testaments: dict[str, _Testament] = {}
        for name in TESTAMENTS:
            files = [self.path / f"{name}.{ext}" for ext in ("bzs", "bzv", "bzz")]
            if all(f.is_file() for f in files):
                self._testaments[name] = self._read_testament(*files)
        if not self._testaments:
            raise ValueError(f"no ot.bz[svz] or nt.bz[svz] files in {str(self.path)!r}")
        self._cache: dict[tuple[str, int], bytes] = {}

    @staticmethod
    def _read_testament(bzs: Path, bzv: Path, bzz: Path) -> _Testament:
        index, verses = bzs.read_bytes(), bzv.read_bytes()
        if len(index) % _BLOCK_ENTRY.size or len(verses) % _VERSE_ENTRY.size:
            raise ValueError(
                f"corrupt zText index: {bzs.name} has {len(index)} bytes (entries of {_BLOCK_ENTRY.size}), "
                f"{bzv.name} has {len(verses)} bytes (entries of {_VERSE_ENTRY.size})"
            )
        return _Testament(
            blocks=[entry for entry in _BLOCK_ENTRY.iter_unpack(index)],
            verses=[entry for entry in _VERSE_ENTRY.iter_unpack(verses)],
            data=bzz.read_bytes(),
        )

    @property
    def testaments(self) -> tuple[str, ...]:
        return tuple(self._testaments)

    def slots(self, testament: str) -> int:
        return len(self._get(testament).verses)

    def _get(self, testament: str) -> _Testament:
        if testament not in self._testaments:
            raise ValueError(f"testament {testament!r} not in module {str(self.path)!r} (has {self.testaments})")
        return self._testaments[testament]

    def _block(self, testament: str, number: int) -> bytes:
        key = (testament, number)
        if key not in self._cache:
            part = self._get(testament)
            if number >= len(part.blocks):
                raise ValueError(f"{testament}: verse entry points to block {number}, index has {len(part.blocks)}")
            offset, compressed, uncompressed = part.blocks[number]
            block = zlib.decompress(part.data[offset : offset + compressed])
            if len(block) != uncompressed:
                raise ValueError(
                    f"{testament} block {number}: {len(block)} bytes after decompression, index says {uncompressed}"
                )
            self._cache[key] = block
        return self._cache[key]

    def raw(self, testament: str, slot: int) -> str:
        """The stored markup of one verse slot ("" for an empty slot)."""
        part = self._get(testament)
        if not 0 <= slot < len(part.verses):
            raise ValueError(f"slot {slot} out of range for {testament} ({len(part.verses)} slots)")
        block, start, size = part.verses[slot]
        if size == 0:
            return ""
        return self._block(testament, block)[start : start + size].decode("utf-8", errors="replace")

    def texts(self, testament: str) -> list[str]:
        """Plain text of every slot of a testament, markup stripped."""
        return [strip_markup(self.raw(testament, slot)) for slot in range(self.slots(testament))]


def _read_conf(conf: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in conf.read_text(encoding="utf-8", errors="replace").splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            values.setdefault(key.strip(), value.strip())
    return values


def find_sword_module(name: str, roots: list[str | Path] | tuple[Path, ...] = DEFAULT_SWORD_ROOTS) -> Path:
    """Folder of the installed zText module `name` (e.g. "engKJV2006eb"), read from `<root>/mods.d/*.conf`."""
    for root in map(Path, roots):
        for conf in sorted((root / "mods.d").glob("*.conf")) if (root / "mods.d").is_dir() else []:
            if conf.stem.lower() != name.lower():
                continue
            values = _read_conf(conf)
            if values.get("ModDrv", "").lower() != "ztext":
                raise ValueError(f"module {name!r} uses driver {values.get('ModDrv')!r}; only zText is supported")
            if values.get("CompressType", "ZIP").upper() != "ZIP":
                raise ValueError(f"module {name!r} uses CompressType={values['CompressType']!r}; only ZIP is read")
            if values.get("CipherKey"):
                raise ValueError(f"module {name!r} is enciphered; it cannot be read")
            return (root / values.get("DataPath", "")).resolve()
    raise FileNotFoundError(
        f"SWORD module {name!r} not found under {[str(r) for r in roots]}; on Debian/Ubuntu install it with "
        "`apt-get install sword-text-kjv sword-text-sparv`"
    )


def parallel_verses(source: ZTextModule, target: ZTextModule) -> list[tuple[str, str]]:
    """Slot-aligned (source, target) plain-text pairs of two modules of the same versification; slots empty on
    either side (headings, verses one translation omits) are dropped."""
    pairs = []
    for testament in TESTAMENTS:
        if testament not in source.testaments or testament not in target.testaments:
            continue
        if source.slots(testament) != target.slots(testament):
            raise ValueError(
                f"{testament}: {source.slots(testament)} slots in {str(source.path)!r} but "
                f"{target.slots(testament)} in {str(target.path)!r}: not the same versification"
            )
        pairs += [(s, t) for s, t in zip(source.texts(testament), target.texts(testament)) if s and t]
    return pairs


def load_sword_parallel_dataset(
    source_module: str | Path = KJV_MODULE,
    target_module: str | Path = SPANISH_RV1909_MODULE,
    test_size: int | float = 1000,
    seed: int = 0,
    roots: list[str | Path] | tuple[Path, ...] = DEFAULT_SWORD_ROOTS,
) -> DatasetDict:
    """English -> Spanish (by default) verse pairs as a `DatasetDict` with `train` and held-out `test` splits,
    columns `source` and `target`. A module is a name looked up in the SWORD roots or a path to its folder."""

    def open_module(module: str | Path) -> ZTextModule:
        path = Path(module)
        return ZTextModule(path if path.is_dir() else find_sword_module(str(module), roots))

    pairs = parallel_verses(open_module(source_module), open_module(target_module))
    logger.info("read %d verse pairs from %s -> %s", len(pairs), source_module, target_module)
    dataset = Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    return dataset.train_test_split(test_size=test_size, seed=seed)
