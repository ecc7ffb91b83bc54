"""`hf-vit-plus space`: the generated Gradio Space, launched on loopback and driven with gradio_client as a user's
client would, its answers compared with the pipeline's / generate's; and its bad inputs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_vit_plus.hub.card import load_card_metadata
from hf_vit_plus.hub.space import SPACE_FILES, write_space
from tests.utils import REPO_ROOT

gradio_client = pytest.importorskip("gradio_client")
pytest.importorskip("gradio")

REPO = "test-org/space-model"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(space: Path, model_dir: Path, tmp: Path, without_package: bool = False):
    """Run the generated app.py on a free loopback port; returns (process, url) once it answers. `without_package`:
    in a process where hf_vit_plus cannot be imported (a Space without it: the model's own code, trust_remote_code)."""
    port = _free_port()
    env = {
        **os.environ,
        "HF_VIT_PLUS_SPACE_MODEL": str(model_dir),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "app.py"]
    if without_package:
        from tests.utils import BLOCK_PACKAGE

        command = [sys.executable, "-c", BLOCK_PACKAGE + "import runpy\nrunpy.run_path('app.py', run_name='__main__')"]
        env.update(PYTHONPATH="", HF_MODULES_CACHE=str(tmp / "modules_cache"), HF_HOME=str(tmp / "hf_home"))
    log = open(tmp / "app.log", "w")
    process = subprocess.Popen(command, cwd=space, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the app exited: {(tmp / 'app.log').read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.3)
    else:
        process.kill()
        raise AssertionError("the app did not listen within 60 s")
    return process, url


@pytest.fixture(scope="module")
def vit_space(tmp_path_factory):
    from hf_vit_plus.models.configuration_vit_plus import ViTPlusConfig
    from hf_vit_plus.models.image_processing_vit_plus import ViTPlusImageProcessor
    from hf_vit_plus.models.modeling_vit_plus import ViTPlusForImageClassification

    root = tmp_path_factory.mktemp("vit_space")
    torch.manual_seed(0)
    labels = ["cat", "dog", "owl", "fox", "elk", "yak"]
    config = ViTPlusConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
        patch_size=8, num_labels=6, id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)},
    )  # fmt: skip
    model = ViTPlusForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=0.5)
    model.save_pretrained(root / "model")
    ViTPlusImageProcessor.from_model_config(config).save_pretrained(root / "model")
    write_space(root / "model", root / "space", model_id=REPO)
    process, url = _launch(root / "space", root / "model", root)
    try:
        yield root, url
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def image_lm_space(tmp_path_factory):
    from hf_vit_plus.families import get_family
    from tests.conftest import TINY_CONFIGS

    root = tmp_path_factory.mktemp("image_lm_space")
    family = get_family("image-lm")
    fields = dict(TINY_CONFIGS["image-lm"])
    height, width = fields.pop("image_size")
    torch.manual_seed(0)
    model = family.head_class(family.config_class.for_images(height, width, **fields)).eval()
    model.save_pretrained(root / "model")
    write_space(root / "model", root / "space", model_id=REPO)
    process, url = _launch(root / "space", root / "model", root)
    try:
        yield root, url, model
    finally:
        process.kill()
        process.wait()


TEXTS = [
    "the cat sat on the mat", "le chat est assis sur le tapis", "a dog ran in the park", "un chien courait au parc",
]  # fmt: skip


@pytest.fixture(scope="module", params=["seq2seq", "sparse-lm"])
def text_space(request, tmp_path_factory):
    """A tiny translation model or LM with a byte-level BPE tokenizer, and its Space running."""
    from hf_vit_plus.families import get_family
    from hf_vit_plus.tokenization import train_bpe_tokenizer
    from tests.conftest import TINY_CONFIGS

    root = tmp_path_factory.mktemp(request.param)
    family = get_family(request.param)
    tokenizer = train_bpe_tokenizer(TEXTS * 10, vocab_size=300)
    fields = {**TINY_CONFIGS[request.param], "vocab_size": len(tokenizer), "max_position_embeddings": 64}
    fields.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    fields.update(eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = family.head_class(family.config_class(**fields)).eval()
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    write_space(root / "model", root / "space", model_id=REPO)
    process, url = _launch(root / "space", root / "model", root)
    try:
        yield request.param, url, model, tokenizer
    finally:
        process.kill()
        process.wait()


def _image(path: Path) -> Path:
    from PIL import Image

    generator = torch.Generator().manual_seed(3)
    pixels = torch.randint(0, 256, (40, 40, 3), generator=generator, dtype=torch.uint8).numpy()
    Image.fromarray(pixels).save(path)
    return path


def test_the_vit_space_answers_the_pipelines_top5(vit_space):
    from transformers import pipeline

    root, url = vit_space
    image = _image(root / "input.png")
    client = gradio_client.Client(url, verbose=False)
    label, overlay = client.predict(gradio_client.handle_file(str(image)), api_name="/classify")
    expected = pipeline("image-classification", model=str(root / "model"), device="cpu")(str(image), top_k=5)
    got = [(c["label"], c["confidence"]) for c in label["confidences"]]
    assert [name for name, _ in got] == [e["label"] for e in expected]
    assert [score for _, score in got] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    assert label["label"] == expected[0]["label"]
    from PIL import Image

    assert Image.open(overlay).size == (40, 40)  # the rollout laid over the uploaded image


def test_the_vit_space_runs_without_the_package_through_the_models_own_code(vit_space, tmp_path):
    """Where hf_vit_plus is not installed the app loads the model with trust_remote_code=True (the code the folder
    ships) and answers the pipeline's top-5, without the rollout overlay (which is the package's)."""
    from transformers import pipeline

    root, _ = vit_space
    process, url = _launch(root / "space", root / "model", tmp_path, without_package=True)
    try:
        image = _image(tmp_path / "input.png")
        label, overlay = gradio_client.Client(url, verbose=False).predict(
            gradio_client.handle_file(str(image)), api_name="/classify"
        )
    finally:
        process.kill()
        process.wait()
    expected = pipeline("image-classification", model=str(root / "model"), device="cpu")(str(image), top_k=5)
    got = [(c["label"], c["confidence"]) for c in label["confidences"]]
    assert [name for name, _ in got] == [e["label"] for e in expected]
    assert [score for _, score in got] == pytest.approx([e["score"] for e in expected], abs=1e-5)
    assert overlay is None
    assert (tmp_path / "modules_cache").is_dir()  # the model's code came from the folder, through remote code


def test_the_image_lm_space_samples_the_grid_sample_images_draws(image_lm_space):
    from PIL import Image

    from hf_vit_plus.image_generation import image_grid, sample_images

    root, url, model = image_lm_space
    client = gradio_client.Client(url, verbose=False)
    grid = client.predict(4, 1.0, 7, api_name="/sample")
    expected = image_grid(sample_images(model, 4, temperature=1.0, seed=7))
    got = Image.open(grid)
    assert got.size == expected.size
    import numpy as np

    assert np.array_equal(np.asarray(got.convert(expected.mode)), np.asarray(expected))


def test_the_text_spaces_answer_what_generate_gives(text_space):
    family, url, model, tokenizer = text_space
    client = gradio_client.Client(url, verbose=False)
    prompt = "the cat sat"
    inputs = tokenizer(prompt, return_tensors="pt")
    beams = 3 if family == "seq2seq" else 1
    with torch.no_grad():
        output = model.generate(**inputs, num_beams=beams, max_new_tokens=8, do_sample=False)
    if family == "seq2seq":
        got = client.predict(prompt, beams, 8, api_name="/generate")
    else:
        output = output[:, inputs["input_ids"].shape[1] :]
        got = client.predict(prompt, beams, 8, 0.0, 0, api_name="/generate")
    expected = tokenizer.decode(output[0], skip_special_tokens=True)
    assert got == expected
    assert len(tokenizer(got, add_special_tokens=False).input_ids) > 0


def test_the_space_files_name_the_model(vit_space):
    root, _ = vit_space
    assert sorted(p.name for p in (root / "space").iterdir()) == sorted(SPACE_FILES)
    metadata = load_card_metadata(root / "space" / "README.md")
    assert metadata["sdk"] == "gradio" and metadata["app_file"] == "app.py" and metadata["models"] == [REPO]
    from huggingface_hub import SpaceCardData

    assert SpaceCardData(**metadata).sdk == "gradio"
    assert f'"HF_VIT_PLUS_SPACE_MODEL", "{REPO}"' in (root / "space" / "app.py").read_text()
    assert (root / "space" / "requirements.txt").read_text().startswith("hf_vit_plus[space]==")


def test_bad_inputs_stop_in_one_line_before_writing(tmp_path, capsys, vit_space):
    from hf_vit_plus.cli import main

    root, _ = vit_space
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    mpp = tmp_path / "mpp"
    mpp.mkdir()
    (mpp / "config.json").write_text('{"model_type": "vit_plus", "architectures": ["ViTPlusForMaskedImageModeling"]}')
    cases = [
        ((str(tmp_path / "notamodel"), str(tmp_path / "o1")), "no config.json"),
        ((str(root / "model"), str(tmp_path / "full"), "--model_id", REPO), "is not empty; pass --overwrite"),
        ((str(root / "model"), str(tmp_path / "o2"), "--model_id", "not a repo id"), "is not a Hub repository id"),
        ((str(root / "model"), str(tmp_path / "o3")), "pass --model_id"),
        ((str(mpp), str(tmp_path / "o4"), "--model_id", REPO), "a Space can be made for vit, seq2seq"),
    ]
    for args, message in cases:
        assert main(["space", *args]) == 2, args  # a user error: status 2, as argparse
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3", "o4"))
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["x"]


def test_push_with_space_creates_the_space_loading_the_pushed_repo(hub_server, vit_space):
    from tests.utils import run_with_package

    root, _ = vit_space
    result = run_with_package(
        f"""
        import contextlib, io, json
        from hf_vit_plus.cli import main

        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["push", {str(root / "model")!r}, "test-org/space-vit", "--space", "test-org/space-vit-demo"])
        print(json.dumps({{"code": code, "stdout": out.getvalue()}}))
        """,
        cwd=root,
        env=hub_server.env(),
    )
    assert result["code"] == 0 and len(result["stdout"].splitlines()) == 2  # two commit URLs: model, Space
    assert "model.safetensors" in hub_server.files("test-org/space-vit")
    assert hub_server.repo("test-org/space-vit-demo", repo_type="space").repo_type == "space"
    assert set(SPACE_FILES) <= set(hub_server.files("test-org/space-vit-demo", repo_type="space"))
    app = hub_server.read_file("test-org/space-vit-demo", "app.py", repo_type="space").decode()
    assert '"HF_VIT_PLUS_SPACE_MODEL", "test-org/space-vit"' in app
    readme = hub_server.read_file("test-org/space-vit-demo", "README.md", repo_type="space").decode()
    assert "sdk: gradio" in readme and "  - test-org/space-vit\n" in readme


def test_push_with_a_bad_space_id_sends_nothing(monkeypatch, capsys, vit_space):
    import huggingface_hub

    from hf_vit_plus.cli import main

    def no_request(*args, **kwargs):
        raise AssertionError("a request was sent")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", no_request)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", no_request)
    root, _ = vit_space
    assert main(["push", str(root / "model"), "test-org/never-pushed", "--space", "no space id"]) == 2
    err = capsys.readouterr().err
    assert "--space 'no space id' is not a Hub repository id" in err and len(err.strip().splitlines()) == 1


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def test_the_vit_space_in_headless_chromium_shows_the_pipelines_label(vit_space, tmp_path):
    """Upload an image in a real browser, press Submit, read the label. The screenshot goes to tmp_path, or to
    $HF_VIT_PLUS_SCREENSHOT_DIR (docs/images/space-vit.png is made that way)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(
            f"headless Chromium needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)"
        )
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait
    from transformers import pipeline

    root, url = vit_space
    image = _image(root / "browser.png")
    expected = pipeline("image-classification", model=str(root / "model"), device="cpu")(str(image), top_k=1)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 30)
        upload = wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "input[type=file]")))
        upload.send_keys(str(image))
        wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "img[src*='/file=']")))
        driver.find_element(By.XPATH, "//button[normalize-space()='Submit']").click()
        label = wait.until(
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, "[data-testid='label-output-value']"))
        )
        wait.until(lambda _: label.text.strip())
        assert label.text.strip() == expected[0]["label"]
        folder = Path(os.environ.get("HF_VIT_PLUS_SCREENSHOT_DIR") or tmp_path)
        folder.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(folder / "space-vit.png"))
    finally:
        driver.quit()
