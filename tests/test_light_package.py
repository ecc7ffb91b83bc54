"""The package costs what its users use, and changes nothing it was not asked to.

- A plain `from_pretrained` + forward (installed package, and remote code without it) imports neither the heavy
  libraries of training, data, figures and export nor this package's training, export, interpretability or Hub code
  (checked in fresh interpreters through `sys.modules`).
- `hf-vit-plus --help` and every `SUBCOMMAND --help` answer without importing torch.
- `import hf_vit_plus` changes nothing but the Auto classes, the models' push hook, its own loggers, and the Trainer
  integration when (and only when) the Trainer is imported; the integration can be switched off.
- Logging follows transformers' verbosity; progress bars follow transformers' switch.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from tests.utils import REPO_ROOT, run_without_package

# Libraries a user who only loads and runs a model must not pay for. transformers' own model classes may import some
# of them themselves (transformers 5 imports accelerate in `modeling_utils` where it is installed): a module is only
# refused where transformers' own ViT, loaded and run the same way, does not import it.
HEAVY = (
    "accelerate", "datasets", "pandas", "pyarrow", "matplotlib", "tensorboard", "sklearn", "sacrebleu", "peft",
    "evaluate", "onnx", "onnxruntime", "ctranslate2", "ninja", "timm", "transformers.trainer", "gradio",
    "gradio_client",
)  # fmt: skip
# What transformers' own models import on none of the supported releases (5.20 imports pandas, pyarrow and
# scikit-learn with its model classes where they are installed, 5.24 accelerate): never imported by a plain load.
NEVER_FOR_LOADING = frozenset(
    {"datasets", "matplotlib", "tensorboard", "peft", "transformers.trainer", "gradio", "gradio_client"}
)
# The package's modules that a plain load must not import: what is done with a model, not the model.
NOT_FOR_LOADING = (
    "hf_vit_plus.training", "hf_vit_plus.hub", "hf_vit_plus.export", "hf_vit_plus.interpret", "hf_vit_plus.conversion",
    "hf_vit_plus.metrics", "hf_vit_plus.quantization", "hf_vit_plus.image_generation", "hf_vit_plus.tokenization",
    "hf_vit_plus.cli", "hf_vit_plus.cli_utils", "hf_vit_plus.data.loading", "hf_vit_plus.data.text",
    "hf_vit_plus.models.fast_decoding", "hf_vit_plus.models.fast_layers", "hf_vit_plus.models.fast_steps",
    "hf_vit_plus.models.fast_kernels",
    "hf_vit_plus.models.pipeline_text2text_generation",
)  # fmt: skip

REPORT = """
import json, sys
heavy = {heavy!r}
print(json.dumps({{
    "heavy": sorted(m for m in heavy if m in sys.modules),
    "ours": sorted(m for m in sys.modules if m == "hf_vit_plus" or m.startswith("hf_vit_plus.")),
    "result": result,
}}))
"""

# A tiny checkpoint of each family, saved once for the module (with the package).
SAVE = """
import torch
from hf_vit_plus import (
    Seq2SeqTransformerConfig, Seq2SeqTransformerForConditionalGeneration, SparseTransformerConfig,
    SparseTransformerForCausalLM, ViTPlusConfig, ViTPlusForImageClassification, ViTPlusImageProcessor,
)
from transformers import ViTConfig, ViTForImageClassification
root = sys.argv[1]
torch.manual_seed(0)
small = dict(num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
vit = ViTPlusConfig(hidden_size=16, image_size=16, patch_size=8, num_labels=3, **small)
ViTPlusForImageClassification(vit).save_pretrained(f"{root}/vit")
ViTPlusImageProcessor.from_model_config(vit).save_pretrained(f"{root}/vit")
s2s = Seq2SeqTransformerConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                               decoder_ffn_dim=32, max_position_embeddings=32)
Seq2SeqTransformerForConditionalGeneration(s2s).save_pretrained(f"{root}/seq2seq")
lm = SparseTransformerConfig(vocab_size=40, hidden_size=16, max_position_embeddings=32, attention_type="strided",
                             sparse_stride=4, **small)
SparseTransformerForCausalLM(lm).save_pretrained(f"{root}/sparse-lm")
ViTForImageClassification(ViTConfig(hidden_size=16, image_size=16, patch_size=8, num_labels=3, **small)
                          ).save_pretrained(f"{root}/transformers-vit")
print("{}")
"""

LOAD_AND_RUN = """
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageClassification, AutoModelForSeq2SeqLM
root, remote = {root!r}, {remote!r}
result = {{}}
with torch.no_grad():
    vit = AutoModelForImageClassification.from_pretrained(f"{{root}}/vit", trust_remote_code=remote)
    result["vit"] = list(vit(torch.randn(1, 3, 16, 16)).logits.shape)
    s2s = AutoModelForSeq2SeqLM.from_pretrained(f"{{root}}/seq2seq", trust_remote_code=remote)
    ids = torch.tensor([[5, 6, 7, 2]])
    # min_new_tokens: a random model may draw its end-of-sequence token at once
    result["seq2seq"] = list(s2s.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False).shape)
    lm = AutoModelForCausalLM.from_pretrained(f"{{root}}/sparse-lm", trust_remote_code=remote)
    result["sparse-lm"] = list(lm.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False).shape)
"""


def _run(code: str, *args: str, env: dict | None = None) -> dict:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    full_env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=full_env,
        timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("light")
    _run("import sys\n" + SAVE, str(root))
    return root


@pytest.fixture(scope="module")
def transformers_baseline(saved):
    """The heavy modules transformers' own ViT imports when it is loaded and run (no hf_vit_plus)."""
    code = f"""
    import torch
    from transformers import AutoModelForImageClassification
    with torch.no_grad():
        model = AutoModelForImageClassification.from_pretrained({str(saved / "transformers-vit")!r})
        result = list(model(torch.randn(1, 3, 16, 16)).logits.shape)
    """
    report = _run(textwrap.dedent(code) + REPORT.format(heavy=HEAVY))
    assert report["ours"] == [] and report["result"] == [1, 3]
    return set(report["heavy"])


def test_import_alone_loads_no_heavy_library_and_none_of_the_packages_work_code(transformers_baseline):
    report = _run("import hf_vit_plus\nresult = sorted(hf_vit_plus.__all__)\n" + REPORT.format(heavy=HEAVY))
    assert set(report["heavy"]) <= transformers_baseline
    assert NEVER_FOR_LOADING.isdisjoint(report["heavy"])
    offending = [m for m in report["ours"] if any(m == p or m.startswith(p + ".") for p in NOT_FOR_LOADING)]
    assert offending == []
    assert "ViTPlusForImageClassification" in report["result"]


def test_from_pretrained_and_a_forward_pass_import_what_transformers_own_model_does(saved, transformers_baseline):
    code = "import hf_vit_plus\n" + LOAD_AND_RUN.format(root=str(saved), remote=False)
    report = _run(textwrap.dedent(code) + REPORT.format(heavy=HEAVY))
    assert report["result"] == {"vit": [1, 3], "seq2seq": [1, 4], "sparse-lm": [1, 7]}
    assert set(report["heavy"]) <= transformers_baseline, "imported beyond transformers' own model"
    assert NEVER_FOR_LOADING.isdisjoint(report["heavy"])
    offending = [m for m in report["ours"] if any(m == p or m.startswith(p + ".") for p in NOT_FOR_LOADING)]
    assert offending == []


def test_the_remote_code_path_imports_no_heavy_library_either(saved, transformers_baseline, tmp_path):
    code = LOAD_AND_RUN.format(root=str(saved), remote=True) + REPORT.format(heavy=HEAVY)
    report = run_without_package(code, tmp_path)
    assert report["ours"] == []  # the package is blocked: the checkpoints' own copies of the model code run
    assert report["result"] == {"vit": [1, 3], "seq2seq": [1, 4], "sparse-lm": [1, 7]}
    assert set(report["heavy"]) <= transformers_baseline
    assert NEVER_FOR_LOADING.isdisjoint(report["heavy"])


HELP_COMMANDS = [
    [], ["convert"], ["explain"], ["train"], ["train", "vit"], ["train", "seq2seq"], ["demo"], ["push"], ["export"],
    ["export", "onnx"], ["translate"], ["sample"], ["env"],
]  # fmt: skip


def test_help_answers_without_importing_torch():
    """Every command's --help, through the `hf-vit-plus` launcher, in one fresh process per command."""
    code = """
    import contextlib, io, json, sys
    argv = json.loads(sys.argv[1])
    sys.argv = ["hf-vit-plus", *argv, "--help"]  # the installed script's program name
    from hf_vit_plus.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as stop:
            code = stop.code
    print(json.dumps({"torch": "torch" in sys.modules, "code": code, "usage": out.getvalue().startswith("usage:")}))
    """
    for argv in HELP_COMMANDS:
        report = _run(code, json.dumps(argv))
        assert report == {"torch": False, "code": 0, "usage": True}, argv


@pytest.mark.parametrize(
    "program, command",
    [("/venv/bin/hf-vit-plus", True), ("hf-vit-plus.exe", True), ("/venv/Scripts/hf-vit-plus-script.py", True),
     ("-c", False), ("/usr/bin/python3", False), ("/venv/bin/hf-vit-plus-demo", False), ("", False)],
)  # fmt: skip
def test_the_package_knows_the_command_by_its_script(monkeypatch, program, command):
    """The `hf-vit-plus` script (pip's, uv's, setuptools', on Windows too) is what leaves the registration to the
    command; any other program registers at import."""
    import hf_vit_plus

    monkeypatch.setattr(sys, "argv", [program])
    assert hf_vit_plus._imported_by_the_command() is command


def test_the_command_registers_the_classes_once_it_runs(tmp_path):
    """The installed command defers the registration to the command: a command that loads a model still finds the
    Auto classes, and the variable that defers it too does not reach the processes the command starts."""
    code = """
    import json, os, sys
    sys.argv = ["hf-vit-plus", "env"]
    os.environ["_HF_VIT_PLUS_DEFER_REGISTRATION"] = "1"
    from hf_vit_plus.cli import main
    from transformers import CONFIG_MAPPING
    before = "vit_plus" in CONFIG_MAPPING
    code = main(["env"])
    print(json.dumps({"code": code, "before": before, "registered": "vit_plus" in CONFIG_MAPPING,
                      "variable_left": "_HF_VIT_PLUS_DEFER_REGISTRATION" in os.environ}))
    """
    report = _run(code)
    assert report == {"code": 0, "before": False, "registered": True, "variable_left": False}


SIDE_EFFECTS = """
import json, logging, os, sys
pytree = logging.getLogger("torch.utils._pytree")
before = {"pytree_filters": len(pytree.filters), "root_handlers": len(logging.getLogger().handlers)}
import hf_vit_plus
from transformers import AutoConfig
after_import = {
    "pytree_filters": len(pytree.filters), "root_handlers": len(logging.getLogger().handlers),
    "trainer_imported": "transformers.trainer" in sys.modules,
    "registered": AutoConfig.for_model("vit_plus").__class__.__name__,
}
from transformers import Trainer
wrapped = {name: getattr(getattr(Trainer, name), "__wrapped_by_hf_vit_plus__", False)
           for name in ("create_model_card", "prediction_step")}
hf_vit_plus.disable_trainer_integration()
unwrapped = {name: getattr(getattr(Trainer, name), "__wrapped_by_hf_vit_plus__", False)
             for name in ("create_model_card", "prediction_step")}
hf_vit_plus.enable_trainer_integration()
rewrapped = getattr(Trainer.create_model_card, "__wrapped_by_hf_vit_plus__", False)
print(json.dumps({"before": before, "after_import": after_import, "wrapped": wrapped, "unwrapped": unwrapped,
                  "rewrapped": rewrapped}))
"""


def test_import_changes_nothing_but_what_it_lists():
    report = _run(SIDE_EFFECTS)
    before = report["before"]
    assert report["after_import"] == {**before, "trainer_imported": False, "registered": "ViTPlusConfig"}
    assert report["wrapped"] == {"create_model_card": True, "prediction_step": True}  # once the Trainer is imported
    assert report["unwrapped"] == {"create_model_card": False, "prediction_step": False}
    assert report["rewrapped"] is True


def test_the_trainer_integration_is_switched_off_by_its_variable_and_made_when_the_trainer_came_first():
    code = """
    import json
    from transformers import Trainer
    import hf_vit_plus
    print(json.dumps({"wrapped": getattr(Trainer.prediction_step, "__wrapped_by_hf_vit_plus__", False)}))
    """
    assert _run(code) == {"wrapped": True}
    assert _run(code, env={"HF_VIT_PLUS_TRAINER_INTEGRATION": "0"}) == {"wrapped": False}


def test_the_package_logs_at_transformers_verbosity_unless_set_its_own():
    from transformers.utils import logging as transformers_logging

    from hf_vit_plus.utils import logging as package_logging

    module_logger = logging.getLogger("hf_vit_plus.training.loop")
    previous = transformers_logging.get_verbosity()
    try:
        transformers_logging.set_verbosity_warning()
        assert not module_logger.isEnabledFor(logging.INFO)
        transformers_logging.set_verbosity_info()
        assert module_logger.isEnabledFor(logging.INFO) and package_logging.get_verbosity() == logging.INFO
        package_logging.set_verbosity_error()  # the package's own level wins over transformers'
        assert not module_logger.isEnabledFor(logging.WARNING) and package_logging.get_verbosity() == logging.ERROR
        package_logging.reset_verbosity()
        assert package_logging.get_verbosity() == logging.INFO
        with pytest.raises(ValueError, match="'loud'"):
            package_logging.set_verbosity("loud")
    finally:
        package_logging.reset_verbosity()
        transformers_logging.set_verbosity(previous)


def test_progress_bars_follow_transformers_switch(capsys):
    from transformers.utils import logging as transformers_logging

    from hf_vit_plus.utils import logging as package_logging

    try:
        transformers_logging.disable_progress_bar()
        assert not package_logging.is_progress_bar_enabled()
        for _ in package_logging.tqdm(range(3), desc="hidden", delay=0):
            pass
        assert "hidden" not in capsys.readouterr().err
    finally:
        package_logging.enable_progress_bar()
    for _ in package_logging.tqdm(range(3), desc="shown", delay=0):
        pass
    assert "shown" in capsys.readouterr().err


def test_cli_log_flags_are_read_before_or_after_the_command(monkeypatch, capsys):
    """In this process (the flags are the parser's, not the imports'): `hf-vit-plus env` with each placement."""
    from hf_vit_plus.cli import main
    from hf_vit_plus.utils import logging as package_logging

    monkeypatch.setattr(sys, "argv", ["hf-vit-plus"])  # the installed script's program name

    def status(*argv: str) -> int:
        try:
            return main(list(argv))
        except SystemExit as exited:  # argparse's own errors
            return exited.code
        finally:
            package_logging.reset_verbosity()  # the command set the package's level

    assert status("env", "-q", "--log_level", "info") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "hf-vit-plus env: error: Give one of --log_level, -q and -v."
    ]
    assert status("--log_level", "loud", "env") == 2 and "invalid choice: 'loud'" in capsys.readouterr().err
    for flags in (["--log_level", "debug", "env"], ["env", "-v"], ["-q", "env"]):
        code = status(*flags)
        output = capsys.readouterr()
        assert code == 0 and "- hf_vit_plus: " in output.out, (flags, output.err[-2000:])


def test_a_missing_extra_stops_the_command_with_one_line(monkeypatch, tmp_path, capsys):
    """Before any work: the missing modules and the pip command, as the command's one-line error (status 1)."""
    from hf_vit_plus.cli import main
    from hf_vit_plus.utils import extras
    from hf_vit_plus.utils import logging as package_logging

    monkeypatch.setattr(extras, "missing_modules", lambda *modules: [m for m in modules if m == "tensorboard"])
    try:
        code = main(["train", "vit", "--output_dir", str(tmp_path / "run"), "--max_steps", "1"])
    finally:
        package_logging.reset_verbosity()  # the command set the package's level (info)
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "hf-vit-plus train vit: error: hf-vit-plus train needs tensorboard (not installed): "
        'pip install "hf_vit_plus[train]"'
    ]
    assert not (tmp_path / "run").exists()


def test_require_names_every_missing_module_and_refuses_an_unknown_extra():
    from hf_vit_plus.utils.extras import MissingExtraError, require

    with pytest.raises(MissingExtraError) as info:
        require("export", "ONNX export", ("onnx", "no_such_module_xyz", "nor_this_one_xyz"))
    assert str(info.value) == (
        'ONNX export needs no_such_module_xyz, nor_this_one_xyz (not installed): pip install "hf_vit_plus[export]"'
    )
    assert isinstance(info.value, ImportError)
    with pytest.raises(ValueError, match="'speed'"):
        require("speed", "something")
    require("train", "training")  # installed in the test environment: nothing raised
