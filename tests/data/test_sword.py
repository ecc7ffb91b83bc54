"""The SWORD zText reader: on a synthetic module built here (always runs), and on the Debian KJV + Reina-Valera
modules when they are installed (`apt-get install sword-text-kjv sword-text-sparv`)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from hf_vit_plus.data.sword import (
    ZTextModule,
    find_sword_module,
    load_sword_parallel_dataset,
    parallel_verses,
    strip_markup,
)


def write_ztext(folder: Path, testaments: dict[str, list[str]], verses_per_block: int = 3) -> Path:
    """Write a zText module: slots grouped into zlib blocks, `.bzs` <III and `.bzv` <IIH index entries."""
    folder.mkdir(parents=True)
    for name, slots in testaments.items():
        index, verses, data = b"", b"", b""
        for first in range(0, len(slots), verses_per_block):
            block_number = first // verses_per_block
            block = b""
            for text in slots[first : first + verses_per_block]:
                raw = text.encode("utf-8")
                verses += struct.pack("<IIH", block_number, len(block), len(raw))
                block += raw
            compressed = zlib.compress(block)
            index += struct.pack("<III", len(data), len(compressed), len(block))
            data += compressed
        (folder / f"{name}.bzs").write_bytes(index)
        (folder / f"{name}.bzv").write_bytes(verses)
        (folder / f"{name}.bzz").write_bytes(data)
    return folder


# Slot layout of a versification: module heading, testament heading, book heading, chapter heading, verses.
ENGLISH_OT = [
    "",
    '<milestone type="x-importer"/>',
    '<div type="book" osisID="Gen"/><title type="main">THE FIRST BOOK OF MOSES</title>',
    '<chapter n="1" osisID="Gen.1"/>',
    '<w lemma="strong:H07225">In the beginning</w> God created the heaven &amp; the earth.',
    'And the earth<note type="study">Heb. <reference>waste</reference></note> was without form.',
    "",  # a verse missing in this translation
    '<title canonical="true" type="psalm">A Psalm of David.</title> <w>Lord</w> , hear me.',
]
SPANISH_OT = [
    "",
    "",
    '<title type="main">GÉNESIS</title>',
    '<chapter n="1"/>',
    "<w>EN el principio</w> crió Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada<RF>a GBF footnote<Rf> y vacía.",
    "Y dijo Dios.",
    "Señor, óyeme.",
]
ENGLISH_NT = ["", "", "<title>MATTHEW</title>", "<chapter/>", "The book of the generation of Jesus Christ."]
SPANISH_NT = ["", "", "<title>SAN MATEO</title>", "<chapter/>", "LIBRO de la generación de Jesucristo."]


@pytest.fixture
def sword_root(tmp_path):
    root = tmp_path / "sword"
    write_ztext(root / "modules/texts/ztext/eng", {"ot": ENGLISH_OT, "nt": ENGLISH_NT})
    write_ztext(root / "modules/texts/ztext/spa", {"ot": SPANISH_OT, "nt": SPANISH_NT}, verses_per_block=2)
    (root / "mods.d").mkdir()
    for name in ("eng", "spa"):
        (root / "mods.d" / f"{name}.conf").write_text(
            f"[{name}]\nDataPath=./modules/texts/ztext/{name}/\nModDrv=zText\nCompressType=ZIP\nSourceType=OSIS\n"
        )
    return root


def test_strip_markup():
    assert strip_markup('<w lemma="x">Abraham</w> <w>begat</w> <w>Isaac</w> ; and') == "Abraham begat Isaac; and"
    assert strip_markup("a<note n='1'>hidden <i>note</i></note> b &lt;c&gt;") == "a b <c>"
    assert strip_markup('<title type="psalm" canonical="true">To the chief</title> x') == "To the chief x"
    assert strip_markup('<title type="main">BOOK</title><chapter n="1"/>') == ""
    assert strip_markup("word<RF>gbf note<Rf> <FI>italic<Fi>") == "word italic"


def test_reader_on_synthetic_module(sword_root):
    folder = find_sword_module("eng", roots=[sword_root])
    module = ZTextModule(folder)
    assert module.testaments == ("ot", "nt")
    assert module.slots("ot") == len(ENGLISH_OT)
    assert module.raw("ot", 5) == ENGLISH_OT[5]
    assert module.texts("ot")[4] == "In the beginning God created the heaven & the earth."
    with pytest.raises(ValueError, match="slot 99"):
        module.raw("ot", 99)

    pairs = parallel_verses(module, ZTextModule(find_sword_module("spa", roots=[sword_root])))
    assert pairs == [
        ("In the beginning God created the heaven & the earth.", "EN el principio crió Dios los cielos y la tierra."),
        ("And the earth was without form.", "Y la tierra estaba desordenada y vacía."),
        ("A Psalm of David. Lord, hear me.", "Señor, óyeme."),
        ("The book of the generation of Jesus Christ.", "LIBRO de la generación de Jesucristo."),
    ]
    data = load_sword_parallel_dataset("eng", "spa", test_size=1, roots=[sword_root])
    assert data["train"].num_rows == 3 and data["test"].num_rows == 1
    assert set(data["test"].column_names) == {"source", "target"}
    assert set(data["train"]["source"]) | set(data["test"]["source"]) == {s for s, _ in pairs}


def test_reader_errors(sword_root, tmp_path):
    with pytest.raises(FileNotFoundError, match="sword-text-kjv"):
        find_sword_module("missing", roots=[sword_root])
    with pytest.raises(ValueError, match="no ot.bz"):
        ZTextModule(tmp_path)
    short = write_ztext(tmp_path / "short", {"ot": ENGLISH_OT[:5]})
    with pytest.raises(ValueError, match="not the same versification"):
        parallel_verses(ZTextModule(short), ZTextModule(sword_root / "modules/texts/ztext/spa"))
    broken = write_ztext(tmp_path / "broken", {"nt": ENGLISH_NT})
    (broken / "nt.bzv").write_bytes((broken / "nt.bzv").read_bytes()[:-3])
    with pytest.raises(ValueError, match="corrupt zText index"):
        ZTextModule(broken)
    (sword_root / "mods.d" / "lz.conf").write_text("[lz]\nDataPath=./x/\nModDrv=zText\nCompressType=LZSS\n")
    with pytest.raises(ValueError, match="LZSS"):
        find_sword_module("lz", roots=[sword_root])


def _installed() -> bool:
    try:
        find_sword_module("engKJV2006eb")
        find_sword_module("spaRV1909eb")
    except FileNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed(), reason="apt-get install sword-text-kjv sword-text-sparv")
def test_kjv_reina_valera_pairs():
    kjv = ZTextModule(find_sword_module("engKJV2006eb"))
    spanish = ZTextModule(find_sword_module("spaRV1909eb"))
    # KJV versification: 39 + 27 books, 929 + 260 chapters, 23,145 + 7,957 verses, plus 2 heading slots each.
    assert kjv.slots("ot") == 2 + 39 + 929 + 23145 and kjv.slots("nt") == 2 + 27 + 260 + 7957
    pairs = parallel_verses(kjv, spanish)
    assert 31000 <= len(pairs) <= 31102
    assert pairs[0] == (
        "In the beginning God created the heaven and the earth.",
        "EN el principio crió Dios los cielos y la tierra.",
    )
    assert pairs[-1][0].startswith("The grace of our Lord Jesus Christ")
    assert not any("<" in s or "<" in t for s, t in pairs)
