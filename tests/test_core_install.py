"""The core package alone, without extras, in a fresh virtual environment: it loads, runs and fine-tunes a model with
transformers' `Trainer`, and each feature of an extra stops with the one-line `pip install "hf_vit_plus[...]"` hint.

No network: the fresh environment is made with `venv`, the package is installed into it from a wheel built here
(`pip wheel --no-deps`), and its core dependencies are those of this environment: the closure of the package's core
requirements (`Requires-Dist` without extras, recursively, markers evaluated) is linked into a folder that a `.pth`
file adds to the fresh environment's path, distribution metadata included. Nothing else of this environment is
visible there: the test first checks that no module of an extra can be found.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hf_vit_plus.utils.extras import EXTRAS
from tests.utils import REPO_ROOT


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_closure() -> list[importlib.metadata.Distribution]:
    """The installed distributions hf_vit_plus needs without extras: its core requirements, recursively."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(spec) for spec in importlib.metadata.requires("hf_vit_plus") or []]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _normalise(requirement.name)
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python, not installed here
        found[name] = dist
        todo.extend(Requirement(spec) for spec in dist.requires or [])
    return list(found.values())


def link_distributions(dists: list[importlib.metadata.Distribution], folder: Path) -> None:
    """Symlink each distribution's top-level files and folders (and its .dist-info) into `folder`."""
    folder.mkdir(parents=True)
    for dist in dists:
        site = Path(dist.locate_file(""))
        for entry in {Path(str(file)).parts[0] for file in dist.files or []}:
            source, target = site / entry, folder / entry
            if entry in ("..", "__pycache__") or not source.exists() or target.exists():
                continue
            target.symlink_to(source)


PROBE = """
import importlib.util, json, sys
extras = {extras!r}
print(json.dumps({{
    "extras_found": sorted(m for ms in extras.values() for m in ms if importlib.util.find_spec(m) is not None),
    "peft": importlib.util.find_spec("peft") is not None,
    "package": importlib.util.find_spec("hf_vit_plus").origin,
}}))
"""

USE = """
import json, logging, warnings
import torch
from transformers import AutoModelForImageClassification, Trainer, TrainingArguments
import hf_vit_plus
from hf_vit_plus import ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor
from hf_vit_plus.utils.extras import MissingExtraError

out = {}
# load and run
torch.manual_seed(0)
config = ViTPlusConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=8,
                       patch_size=4, num_channels=1, num_labels=2)
ViTPlusForImageClassification(config).save_pretrained("vit")
ViTPlusImageProcessor.from_model_config(config).save_pretrained("vit")
model = AutoModelForImageClassification.from_pretrained("vit")
out["logits"] = list(model(torch.randn(2, 1, 8, 8)).logits.shape)

# fine-tune with Trainer: which half of the image is the brighter one?
class Halves(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.rand(n, 1, 8, 8, generator=g)
        self.x[self.y == 1, :, :4] += 0.5  # class 1: the top half
        self.x[self.y == 0, :, 4:] += 0.5  # class 0: the bottom half
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}

def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

args = TrainingArguments("trainer", per_device_train_batch_size=32, num_train_epochs=4, learning_rate=1e-3,
                         report_to="none", use_cpu=True, save_strategy="no", logging_steps=1000, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=Halves(512, 0), eval_dataset=Halves(256, 1),
                  compute_metrics=accuracy)
before = trainer.evaluate()["eval_accuracy"]
trainer.train()
out["accuracy"] = [before, trainer.evaluate()["eval_accuracy"]]
trainer.save_model("fine-tuned")
out["reloaded"] = type(AutoModelForImageClassification.from_pretrained("fine-tuned")).__name__

# the features of the extras, from Python
def refusal(call):
    try:
        call()
    except MissingExtraError as error:
        return str(error)
    return None

from hf_vit_plus.quantization import quantize
out["quantize"] = refusal(lambda: quantize(model, "int8-dynamic"))
out["figures"] = refusal(lambda: __import__("hf_vit_plus.interpret.plots"))
from hf_vit_plus.data import load_digits_dataset
out["digits"] = refusal(load_digits_dataset)
from hf_vit_plus.metrics import load_translation_metric
out["bleu"] = refusal(load_translation_metric)
from hf_vit_plus.export import export_onnx
out["onnx"] = refusal(lambda: export_onnx(model, "onnx"))
print(json.dumps(out))
"""

SAVE_VIT = """
config = ViTPlusConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=8,
                       patch_size=4, num_channels=1, num_labels=2)
ViTPlusForImageClassification(config).save_pretrained("vit")
print("{}")
"""

# command -> the extra its one-line error names
COMMANDS = {
    ("train", "vit", "--output_dir", "run", "--max_steps", "1"): "train",
    ("demo", "--output_dir", "demo", "--max_steps", "1"): "train",
    ("explain", "pattern", "--kind", "strided", "--stride", "4"): "interpret",
    ("export", "onnx", "vit", "onnx-out"): "export",
}


def build_requirements_installed() -> bool:
    """Whether this environment holds releases of everything pyproject's [build-system] requires (setuptools with
    the SPDX license string, say): a venv's bundled setuptools is often older."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return False
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for requirement in map(Requirement, requires):
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            return False
        if not requirement.specifier.contains(installed, prereleases=True):
            return False
    return True


@pytest.fixture(scope="module")
def core_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("core_install")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())  # fmt: skip
    link_distributions(core_closure(), root / "core")
    (site / "core_dependencies.pth").write_text(str(root / "core") + "\n")
    wheels = root / "wheels"
    # with this environment's build tools where they meet pyproject's [build-system] (no download), else in pip's own
    # build environment
    isolation = ["--no-build-isolation"] if build_requirements_installed() else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(wheels), str(REPO_ROOT)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    wheel = next(wheels.glob("hf_vit_plus-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(root / "hf_home")})
    work = root / "work"
    work.mkdir()
    return python, env, work


def _python(core_env, code: str) -> dict:
    python, env, work = core_env
    proc = subprocess.run([str(python), "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=work, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_fresh_environment_has_the_core_and_no_extra(core_env):
    report = _python(core_env, PROBE.format(extras=EXTRAS))
    assert report["extras_found"] == [] and report["peft"] is False
    assert "/venv/" in report["package"]  # the wheel installed there, not this checkout


def test_the_core_loads_runs_and_fine_tunes_with_trainer_and_each_extra_is_named(core_env):
    out = _python(core_env, USE)
    assert out["logits"] == [2, 2] and out["reloaded"] == "ViTPlusForImageClassification"
    before, after = out["accuracy"]
    assert after >= 0.95 and after > before + 0.3, out["accuracy"]
    hints = {
        "quantize": 'int8 quantization needs torchao (not installed): pip install "hf_vit_plus[fast]"',
        "figures": "hf_vit_plus.interpret's figures needs matplotlib (not installed): "
        'pip install "hf_vit_plus[interpret]"',
        "digits": 'The digits data set needs scikit-learn (not installed): pip install "hf_vit_plus[train]"',
        "bleu": 'BLEU / chrF needs sacrebleu (not installed): pip install "hf_vit_plus[train]"',
        "onnx": 'ONNX export needs onnx, onnxscript (not installed): pip install "hf_vit_plus[export]"',
    }
    assert {key: out[key] for key in hints} == hints


def test_each_command_of_an_extra_stops_with_one_line(core_env):
    python, env, work = core_env
    if not (work / "vit").is_dir():  # the checkpoint `export onnx` is given
        _python(core_env, USE.split("out = {}")[0] + SAVE_VIT)
    command = python.parent / "hf-vit-plus"
    assert command.is_file()
    for args, extra in COMMANDS.items():
        proc = subprocess.run([str(command), *args], capture_output=True, text=True, env=env, cwd=work, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (args, proc.stderr[-3000:])
        assert lines[0].startswith(f"hf-vit-plus {args[0]}")
        assert lines[0].endswith(f'pip install "hf_vit_plus[{extra}]"')
    assert not (work / "run").exists() and not (work / "demo").exists()  # stopped before any work
