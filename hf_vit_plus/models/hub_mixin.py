"""What the three model families add to transformers' `PreTrainedModel` and `PretrainedConfig` on the way to and
from the Hub.

- `push_to_hub` (and `save_pretrained(..., push_to_hub=True)`) uploads the family's model card instead of
  transformers' stock card ("[More Information Needed]", no tags), through the hook the `hf_vit_plus` package sets
  when it is imported (`set_push_to_hub_hook`).
- `from_pretrained` names the weights file when a `*.safetensors` file is corrupt or truncated (safetensors itself
  only says "Error while deserializing header").
- A saved config (`config.save_pretrained`, alone, before any model exists) names every Auto class of its family in
  its `auto_map` and carries the model code they need (`HubConfigMixin`), so that "write a config, train from
  scratch" works where the package is not installed: `AutoConfig.from_pretrained(dir, trust_remote_code=True)`,
  then `AutoModelForX.from_config(config, trust_remote_code=True)` (what transformers' example scripts do with
  `--config_name dir --trust_remote_code`).

This module ships with the checkpoints as remote code (`trust_remote_code=True`), so it imports only transformers,
huggingface_hub and safetensors, never the rest of the package: the card code (`hf_vit_plus.hub`) sits above the
models and hands them its push (`import hf_vit_plus` sets `hf_vit_plus.integrations.push_with_family_card` as the
hook).
Without the package no hook is set, and the push is transformers' own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from safetensors import SafetensorError, safe_open

logger = logging.getLogger(__name__)

# `push_to_hub` with the family's card: called as hook(model, repo_id, **options) and returning a `CommitInfo`; set by
# the hf_vit_plus package when it is imported. None: transformers' own push.
_push_to_hub_hook: Callable | None = None
# The name of this module in the installed package; a copy loaded as remote code has another (transformers_modules.*).
_PACKAGE_MODULE = "hf_vit_plus.models.hub_mixin"


def set_push_to_hub_hook(hook: Callable | None) -> Callable | None:
    """Make `hook(model, repo_id, **options)` do the models' `push_to_hub` (None: transformers' own push); returns the
    hook it replaces."""
    global _push_to_hub_hook
    previous, _push_to_hub_hook = _push_to_hub_hook, hook
    return previous


def push_to_hub_hook() -> Callable | None:
    """The hook set with `set_push_to_hub_hook`. A copy of this module loaded as remote code (`trust_remote_code=True`
    in a process that has also imported the package) takes the package's hook: the same models, the same card."""
    if _push_to_hub_hook is not None:
        return _push_to_hub_hook
    installed = sys.modules.get(_PACKAGE_MODULE)
    if installed is None or installed is sys.modules.get(__name__):
        return None
    return getattr(installed, "_push_to_hub_hook", None)


# `from .module import name`: how the model modules import their siblings (the only form remote code allows).
_SIBLING_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import\s", re.MULTILINE)


def model_code_files(modules, folder: str | os.PathLike) -> list[Path]:
    """The files of the modules named in `modules` (e.g. "modeling_vit_plus") in `folder` and of every sibling module
    they import (`from .x import y`), recursively: what a checkpoint must carry for `trust_remote_code`. Modules
    missing from `folder` are left out (a remote-code copy holds only those it was loaded with)."""
    folder, todo, found = Path(folder), list(modules), {}
    while todo:
        name = todo.pop()
        path = folder / f"{name}.py"
        if name in found or not path.is_file():
            continue
        found[name] = path
        todo.extend(_SIBLING_IMPORT.findall(path.read_text(encoding="utf-8")))
    return sorted(found.values())


class HubConfigMixin:
    """Inherited first by the families' configs (`class XConfig(HubConfigMixin, PretrainedConfig)`).

    `remote_code_classes` ({Auto class: "module.Class"}) names the family's classes for each Auto class. A config
    saved with `save_pretrained` gets the entries its `auto_map` lacks (`family_auto_map()`; entries it has, such
    as a Hub repository's "repo--module.Class", are kept), and the folder gets the modules those classes live in with
    everything they import. transformers itself writes only `AutoConfig` and copies only the configuration's
    modules, so a config saved before any model could not build one under remote code ("Unrecognized configuration
    class"). A model's config gets the same entries when the model is built (`HubMixin`)."""

    remote_code_classes: dict[str, str] = {}

    def family_auto_map(self) -> dict[str, str]:
        """The Auto classes of this config's model.

        A family may choose per config (the Sparse Transformer's causal-LM head is the image model's for an image
        config).

        Returns:
            {Auto class: "module.Class"}.
        """
        return dict(self.remote_code_classes)

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs):
        """transformers' `save_pretrained`, with every Auto class of the family in `auto_map` and their code.

        Args:
            save_directory: the folder to write.
            push_to_hub: save the folder, then push it with `push_to_hub` (code included).
            **kwargs: transformers' `save_pretrained` options; with `push_to_hub=True`, `repo_id` (default: the
                folder's name) and `push_to_hub`'s options.

        Returns:
            With `push_to_hub=True`, what `push_to_hub` returns; else None.
        """
        self.auto_map = {**self.family_auto_map(), **(getattr(self, "auto_map", None) or {})}
        super().save_pretrained(save_directory, **kwargs if not push_to_hub else {})
        here = Path(sys.modules[type(self).__module__].__file__).parent
        local = [ref.split(".")[0] for ref in self.auto_map.values() if isinstance(ref, str) and "--" not in ref]
        for path in model_code_files(local, here):
            target = Path(save_directory) / path.name
            if not target.exists() or target.read_bytes() != path.read_bytes():
                shutil.copyfile(path, target)
        if push_to_hub:
            repo_id = kwargs.pop("repo_id", os.fspath(save_directory).rstrip(os.sep).split(os.sep)[-1])
            return self.push_to_hub(repo_id, **kwargs)
        return None


class CorruptCheckpointError(OSError):
    """A weights file of a checkpoint cannot be read: it is corrupt or truncated. `paths` lists the files."""

    def __init__(self, message: str, paths: list[Path]):
        super().__init__(message)
        self.paths = paths


def _safetensors_cause(err: BaseException) -> SafetensorError | None:
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, SafetensorError):
            return err
        err = err.__cause__ or err.__context__
    return None


def unreadable_safetensors(path: str | os.PathLike) -> str | None:
    """Why safetensors cannot open `path` (its error message), or None when its header and size are sound."""
    try:
        with safe_open(os.fspath(path), framework="pt") as handle:
            handle.keys()
    except (SafetensorError, OSError) as err:
        return str(err) or type(err).__name__
    return None


def _checkpoint_folder(
    name_or_path: str | os.PathLike, subfolder: str, revision: str | None, cache_dir: str | os.PathLike | None
) -> Path | None:
    """The local folder holding a checkpoint's weights: the folder itself, or its snapshot in the Hub cache."""
    local = Path(name_or_path)
    if local.is_dir():
        return local / subfolder if subfolder else local
    from huggingface_hub import try_to_load_from_cache

    for name in ("model.safetensors", "model.safetensors.index.json", "config.json"):
        try:
            cached = try_to_load_from_cache(
                os.fspath(name_or_path),
                f"{subfolder}/{name}" if subfolder else name,
                cache_dir=cache_dir,
                revision=revision,
            )
        except Exception:  # not a valid repo id either: nothing to look at
            return None
        if isinstance(cached, str):
            return Path(cached).parent
    return None


def corrupt_safetensors_files(
    name_or_path: str | os.PathLike,
    *,
    subfolder: str = "",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> dict[Path, str]:
    """The `*.safetensors` files of a checkpoint (a file, a local folder, or a Hub id already in the cache) that
    safetensors cannot open, with its reason for each."""
    path = Path(name_or_path)
    if path.is_file():
        candidates = [path]
    else:
        folder = _checkpoint_folder(name_or_path, subfolder, revision, cache_dir)
        candidates = sorted(folder.glob("*.safetensors")) if folder is not None else []
    return {file: reason for file in candidates if (reason := unreadable_safetensors(file)) is not None}


@contextlib.contextmanager
def naming_corrupt_safetensors(
    name_or_path: str | os.PathLike,
    *,
    subfolder: str = "",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Iterator[None]:
    """Turn a safetensors error raised inside the block into a `CorruptCheckpointError` that names the corrupt or
    truncated file(s) of `name_or_path` (the safetensors error is kept as `__cause__`). Other errors, and a
    safetensors error no file explains, pass through unchanged."""
    try:
        yield
    except Exception as err:
        cause = _safetensors_cause(err)
        if cause is None:
            raise
        corrupt = corrupt_safetensors_files(name_or_path, subfolder=subfolder, revision=revision, cache_dir=cache_dir)
        if not corrupt:
            raise
        files = "; ".join(f"{file} ({reason})" for file, reason in corrupt.items())
        in_cache = not Path(name_or_path).exists()
        raise CorruptCheckpointError(
            f"Cannot load the weights of {os.fspath(name_or_path)!r}: "
            f"{'this file is' if len(corrupt) == 1 else 'these files are'} corrupt or truncated: {files}. "
            + (
                "Download it again with `from_pretrained(..., force_download=True)`."
                if in_cache
                else "Save or copy the checkpoint again."
            ),
            list(corrupt),
        ) from cause


def _check_local_config(name_or_path, subfolder: str, cls) -> None:
    """A local checkpoint folder must hold a config.json that is a JSON object of this class's model type."""
    folder = Path(name_or_path)
    if not folder.is_dir():
        return  # a Hub id (transformers names a missing repository or file itself) or a single file
    folder = folder / subfolder if subfolder else folder
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(
            f"{os.fspath(folder)!r} has no config.json: it is not a saved model folder (save one with "
            f"`save_pretrained`), or pass the config with `{cls.__name__}.from_pretrained(folder, config=...)`."
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{os.fspath(path)!r} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise ValueError(
            f"{os.fspath(path)!r} must hold a JSON object (the config's fields), got a {type(config).__name__}."
        )
    expected = getattr(getattr(cls, "config_class", None), "model_type", None)
    found = config.get("model_type")
    if expected and found is None:
        raise ValueError(
            f"{os.fspath(path)!r} has no `model_type`: it is not the config of a saved model. {cls.__name__} loads "
            f"{expected!r} models (a config.json that `save_pretrained` wrote names its model_type)."
        )
    if expected and found != expected:
        raise ValueError(
            f"{os.fspath(folder)!r} holds a {found!r} model, not a {expected!r} one: {cls.__name__} cannot load it "
            "(load it with the Auto class of its task, e.g. AutoModel.from_pretrained)."
        )


def _mismatched_tensors(cls, name_or_path, subfolder: str, kwargs: dict) -> list[tuple[str, tuple, tuple]]:
    """(key, saved shape, model shape) of each saved tensor whose shape differs from the model's (built on the meta
    device from the checkpoint's config), or [] when the weights cannot be read from a local folder."""
    import torch

    folder = _checkpoint_folder(name_or_path, subfolder, kwargs.get("revision"), kwargs.get("cache_dir"))
    files = sorted(folder.glob("*.safetensors")) if folder is not None else []
    if not files:
        return []
    config = kwargs.get("config") or cls.config_class.from_pretrained(folder)
    with torch.device("meta"):
        expected = {key: tuple(tensor.shape) for key, tensor in cls(config).state_dict().items()}
    prefix = f"{cls.base_model_prefix}."
    mismatched = []
    for file in files:
        with safe_open(os.fspath(file), framework="pt") as handle:
            for key in handle.keys():
                saved = tuple(handle.get_slice(key).get_shape())
                for candidate in (key, prefix + key, key.removeprefix(prefix)):
                    if candidate in expected:
                        if expected[candidate] != saved:
                            mismatched.append((key, saved, expected[candidate]))
                        break
    return mismatched


class HubMixin:
    """Inherited first by the families' `PreTrainedModel` classes (`class XPreTrainedModel(HubMixin,
    PreTrainedModel)`).

    Each family's base sets `remote_code_auto_map` ({Auto class: "module.Class"}, its config's
    `remote_code_classes`); every model built merges its config's `family_auto_map()` into `config.auto_map`, so a
    saved config names a class for each Auto class and the checkpoint opens with `trust_remote_code=True`. The config
    decides, not the class: the body a head builds inside itself must not rename the head (the image model's
    `AutoModelForCausalLM` entry is `SparseTransformerForImageGeneration`, which its inner `SparseTransformerModel`
    used to overwrite until `save_pretrained` set it back).
    """

    remote_code_auto_map: dict[str, str] = {}

    def __init__(self, config, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        family = getattr(self.config, "family_auto_map", None)
        entries = family() if callable(family) else self.remote_code_auto_map
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **entries}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' `from_pretrained`, with clear errors for a checkpoint that cannot be this model.

        Args:
            pretrained_model_name_or_path: a saved model folder or a Hub id.
            *model_args: passed to the model's constructor, as transformers does.
            **kwargs: transformers' `from_pretrained` options (`config`, `revision`, `subfolder`,
                `ignore_mismatched_sizes`, ...).

        Returns:
            The model, in eval mode.

        Raises:
            ValueError: a local folder without config.json (and no `config=` given), whose config.json is not a JSON
                object or holds another model type than this class's (transformers would build the class with
                default fields, or fail deep inside); or weights whose shapes differ from the model the config
                describes (unless `ignore_mismatched_sizes=True`), naming the tensors with both shapes.
            CorruptCheckpointError: a corrupt or truncated `*.safetensors` file (an `OSError` naming the file,
                instead of safetensors' bare header error).
        """
        subfolder = kwargs.get("subfolder") or ""
        if kwargs.get("config") is None:
            _check_local_config(pretrained_model_name_or_path, subfolder, cls)
        with naming_corrupt_safetensors(
            pretrained_model_name_or_path,
            subfolder=subfolder,
            revision=kwargs.get("revision"),
            cache_dir=kwargs.get("cache_dir"),
        ):
            try:
                return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            except RuntimeError as err:
                if "ignore_mismatched_sizes" not in str(err):
                    raise
                mismatched = _mismatched_tensors(cls, pretrained_model_name_or_path, subfolder, kwargs)
                if not mismatched:
                    raise
                listed = "; ".join(f"{key}: checkpoint {tuple(saved)} vs model {tuple(built)}" for key, saved, built in
                                   mismatched[:8])  # fmt: skip
                more = f" (and {len(mismatched) - 8} more)" if len(mismatched) > 8 else ""
                raise ValueError(
                    f"The weights of {os.fspath(pretrained_model_name_or_path)!r} do not fit {cls.__name__} built "
                    f"from its config: {len(mismatched)} tensor(s) of another shape: {listed}{more}. The config and "
                    "the weights come from different models; pass `ignore_mismatched_sizes=True` to re-initialise "
                    "those tensors instead."
                ) from err

    def save_pretrained(self, save_directory: str | os.PathLike, *args, push_to_hub: bool = False, **kwargs):
        """transformers' `save_pretrained`, pushing with the family's model card when asked to push.

        With `push_to_hub=True` (and the package's hook set) the folder is saved, then pushed with `push_to_hub`, so
        the repository gets the family's card, not transformers' stock card (which transformers would also write into
        the folder).

        Args:
            save_directory: the folder to write.
            *args: transformers' `save_pretrained` positional options.
            push_to_hub: push the folder after saving it.
            **kwargs: transformers' `save_pretrained` options; with `push_to_hub=True`, also `repo_id` (default: the
                folder's name) and `push_to_hub`'s options.

        Returns:
            What transformers' `save_pretrained` returns.
        """
        if not push_to_hub or push_to_hub_hook() is None:
            return super().save_pretrained(save_directory, *args, push_to_hub=push_to_hub, **kwargs)
        push_options = {
            name: kwargs.pop(name)
            for name in ("commit_message", "commit_description", "private", "token", "revision", "create_pr", "tags")
            if name in kwargs
        }
        repo_id = kwargs.pop("repo_id", os.fspath(save_directory).rstrip(os.sep).split(os.sep)[-1])
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            self.push_to_hub(repo_id, max_shard_size=kwargs.get("max_shard_size", "50GB"), **push_options)
        return result

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str | None = None,
        commit_description: str | None = None,
        private: bool | None = None,
        token: bool | str | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        max_shard_size: int | str | None = "50GB",
        tags: list[str] | None = None,
    ):
        """Upload the model (weights, config, model code) to the Hub repository `repo_id` as one commit.

        The family's model card goes in as README.md when the repository has none: the card of
        `hf_vit_plus.hub.card.model_card_from_config`, with the family's metadata, description, architecture and usage,
        saying that no training data or evaluation was recorded. A README.md that the repository already has (on
        `revision`, or main) is kept as it is; only `tags` it lacks are added, as transformers does. The push is the
        hook the package sets (`set_push_to_hub_hook`); without the `hf_vit_plus` package (remote code) there is none,
        and this is transformers' own push, stock card included.

        Args:
            repo_id: the Hub repository, "namespace/name".
            commit_message: the commit's message.
            commit_description: the commit's description.
            private: whether a repository created by the push is private.
            token: the Hub token; None: the saved login.
            revision: the branch to push to.
            create_pr: open a pull request instead of committing to the branch.
            max_shard_size: the largest weights file before the weights are sharded.
            tags: Hub tags to add to the card.

        Returns:
            The commit's `CommitInfo`, as transformers' `push_to_hub` returns it.
        """
        arguments = dict(
            commit_message=commit_message,
            commit_description=commit_description,
            private=private,
            token=token,
            revision=revision,
            create_pr=create_pr,
            max_shard_size=max_shard_size,
            tags=tags,
        )
        hook = push_to_hub_hook()
        if hook is None:
            logger.info("hf_vit_plus is not imported: pushing with transformers' stock model card.")
            return super().push_to_hub(repo_id, **arguments)
        return hook(self, repo_id, **arguments)
