"""The run file a run writes: its resolved options, every value its plan decided, as OUTPUT_DIR/run_config.yaml
(`write_run_config`); `--print_config` prints the same text (`run_config_text`). `hf-vit-plus train FAMILY
OUTPUT_DIR/run_config.yaml` repeats the run (`run_file.read_run_file` reads it).

A comment names who chose each value that was not given (the family, the recipe, the data, the launcher); read back,
a value equal to that choice is again that choice's (`plan.build_plan`), so the repeated run starts with the same
lines and prints the same file.
"""

from __future__ import annotations

import os
from pathlib import Path

from .options import OPTION_GROUPS, applies, group_fields
from .plan import THE_DEFAULT, RunPlan

RUN_CONFIG_NAME = "run_config.yaml"


def run_config_text(plan: RunPlan) -> str:
    """The resolved options of a planned run as a run file: YAML, one section per option group, each value not given
    by the user followed by a comment naming who chose it.

    Args:
        plan: the run's plan.

    Returns:
        The text of the file.
    """
    import yaml

    from ..families import get_family

    options, record = plan.options, get_family(plan.options.family)
    lines = [
        f"# The resolved options of a `hf-vit-plus train {options.family}` run. Repeat it with",
        f"#   hf-vit-plus train {options.family} {RUN_CONFIG_NAME}",
        "# (flags given after the file override it). A comment names who chose a value that was not given.",
        f"family: {options.family}",
    ]
    for group in OPTION_GROUPS:
        flags = [flag for flag in group_fields(group) if applies(flag, record)]
        if not flags:
            continue
        lines.append(f"# --- {group._argument_group_name}")
        for flag in flags:
            text = yaml.safe_dump({flag.name: getattr(options, flag.name)}, default_flow_style=True, width=10**6)
            line = text.strip().removeprefix("{").removesuffix("}")
            chooser = plan.chosen_by.get(flag.name)
            if chooser and chooser != THE_DEFAULT and not plan.given_by_user(flag.name):
                line += f"  # {chooser}"
            lines.append(line)
    return "\n".join(lines) + "\n"


def write_run_config(plan: RunPlan) -> Path:
    """Write `run_config_text(plan)` as OUTPUT_DIR/run_config.yaml (written next to it, then renamed: never half a
    file). Called by the main process once the run holds its output folder.

    Args:
        plan: the run's plan.

    Returns:
        The file written.
    """
    output_dir = Path(plan.options.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / RUN_CONFIG_NAME
    staging = output_dir / f".{RUN_CONFIG_NAME}.tmp"
    staging.write_text(run_config_text(plan), encoding="utf-8")
    os.replace(staging, path)
    return path


__all__ = ["RUN_CONFIG_NAME", "run_config_text", "write_run_config"]
