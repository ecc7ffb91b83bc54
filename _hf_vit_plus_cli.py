"""The `hf-vit-plus` command's entry point, outside the package so that it runs before the package is imported.

`import hf_vit_plus` registers the model classes with transformers' Auto classes, which imports torch (seconds).
`hf-vit-plus --help` needs none of it: the launcher asks the package to leave the registration to the command,
which makes it once its arguments are parsed (`hf_vit_plus.cli.main`), so that the usage prints at once.
"""

import os
import sys


def main() -> int:
    os.environ["_HF_VIT_PLUS_DEFER_REGISTRATION"] = "1"  # read (and removed) by hf_vit_plus/__init__.py
    from hf_vit_plus.cli import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
