"""Convert a timm or transformers ViT checkpoint to ViTPlus: see `hf-vit-plus convert --help`."""

import sys

from hf_vit_plus.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
