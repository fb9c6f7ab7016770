"""Kaggle awareness: is this a Kaggle session, where are its inputs, and how long may it still run?

Inputs are mounted read-only under /kaggle/input in two layouts seen in 2026: the old flat
`/kaggle/input/<slug>/` and the newer `/kaggle/input/{competitions/<slug>, datasets/<owner>/<slug>,
notebooks/<owner>/<slug>, models/<owner>/<model>/<framework>/<variation>/<version>}/`. Rather than
hard-coding either, stages search for what they need (a competition folder, an artifact's manifest, a
checkpoint). Outputs go to /kaggle/working. `KAGGLE_ROOT` moves the whole tree (tests build a fake one).

Nothing here imports torch: `doctor` and the notebooks' defaults use it before anything heavy is loaded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

RUN_TYPE_VARIABLE = "KAGGLE_KERNEL_RUN_TYPE"  # "Interactive" in the editor, "Batch" for Save Version
# input/models/<owner>/<model>/<framework>/<variation>/<version> is 6 levels deep, and an artifact may sit
# in a subfolder of it: 7 covers every layout with one level to spare.
SEARCH_DEPTH = 7
# Session limits (Kaggle docs, "Notebooks" -> technical specifications): 12 h for CPU and GPU sessions,
# 9 h for TPU sessions. A run past the limit is killed without saving anything.
SESSION_LIMIT_HOURS = {"cpu": 12.0, "tpu": 9.0}  # "cpu" also covers GPU sessions
# Kept back from the limit for what follows training in the notebook (figures, artifact save, the output
# upload Kaggle does after the last cell) and for clock differences between our estimate and Kaggle's.
SESSION_MARGIN_MINUTES = 20.0
CHECKPOINT_FILE = "latest.pt"  # pipeline.training.checkpoint.LATEST (not imported: that module imports torch)


def kaggle_root() -> Path:
    return Path(os.environ.get("KAGGLE_ROOT", "/kaggle"))


def on_kaggle(env: Mapping[str, str] | None = None) -> bool:
    """True inside a Kaggle notebook session (editor or Save Version), from KAGGLE_KERNEL_RUN_TYPE."""
    return RUN_TYPE_VARIABLE in (os.environ if env is None else env)


def run_type(env: Mapping[str, str] | None = None) -> str | None:
    """'Interactive', 'Batch' (Save Version / Save & Run All), or None off Kaggle."""
    return (os.environ if env is None else env).get(RUN_TYPE_VARIABLE)


def is_competition_rerun(env: Mapping[str, str] | None = None) -> bool:
    """True only in the hidden-test scoring rerun of a code competition."""
    return bool((os.environ if env is None else env).get("KAGGLE_IS_COMPETITION_RERUN"))


def working_dir() -> Path:
    return kaggle_root() / "working"


def input_dir() -> Path:
    return kaggle_root() / "input"


def find_dirs_with(marker_files: tuple[str, ...], roots: list[Path] | None = None) -> list[Path]:
    """Directories under `roots` (default: the input root) holding all `marker_files`, shallowest first."""
    found = []
    for root in roots or [input_dir()]:  # os.walk yields nothing for a missing root
        base_depth = len(root.parts)
        for current, subdirs, files in os.walk(root, followlinks=True):
            depth = len(Path(current).parts) - base_depth
            if all(name in files for name in marker_files):
                found.append(Path(current))
            # Hidden folders are never inputs: `.model.partial-*` / `.model.old-*` are an artifact save
            # that was interrupted or the artifact it replaced (pipeline/core/artifact.py).
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".")) if depth < SEARCH_DEPTH else []
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


def find_competition_dir(train_table: str = "train.csv") -> Path | None:
    """A folder holding the training table (the competition's own name for it) and a sample submission."""
    return _first(find_dirs_with((train_table, "sample_submission.csv")), "competition folders")


def find_test_dir(
    sample_submission: str = "sample_submission.csv",
    test_table: str = "test.csv",
    test_audio_dir: str | None = None,
) -> Path | None:
    """The submission notebook's folder: the sample submission, and the test table or the test audio folder."""
    matches = find_dirs_with((sample_submission,) if test_audio_dir else (sample_submission, test_table))
    if test_audio_dir:
        matches = [m for m in matches if (m / test_audio_dir).is_dir()]
    return _first(matches, "competition folders")


def find_artifact_dir() -> Path | None:
    """An artifact among the inputs (a train notebook's output, a dataset or a model), else in working."""
    markers = ("manifest.json", "model.safetensors")
    return _first(find_dirs_with(markers) or find_dirs_with(markers, [working_dir()]), "artifacts")


def find_input_checkpoints() -> list[Path]:
    """Training checkpoints among the inputs: the output of an earlier version of the train notebook that
    stopped on its time budget (or was attached after a timeout). Each is `<fingerprint>/latest.pt`; which
    one belongs to this run is decided on resume by its fingerprint."""
    return find_dirs_with((CHECKPOINT_FILE,))


# Outside Kaggle, data_dir and artifact_dir left as None are the Makefile demo's folders.
LOCAL_DATA = Path("artifacts/demo_data")
LOCAL_ARTIFACT = Path("artifacts/model")


def input_or_local(search: Callable[[], Path | None], local_default: Path, name: str, what: str) -> str:
    """A path parameter left as None: on Kaggle what `search` finds among the inputs (said), else the local
    default; a ConfigError naming the parameter when neither is there."""
    from .config import ConfigError

    if on_kaggle():
        found = search()
        if found is None:
            raise ConfigError(
                f"parameter {name} is None and {what} was not found under {input_dir()}; "
                f"attach the input or pass -p {name} PATH"
            )
        print(f"{name}: found {found}")
        return str(found)
    if not local_default.exists():
        raise ConfigError(
            f"parameter {name} is None and the local default {local_default} does not exist; "
            f"pass -p {name} PATH ({what})"
        )
    return str(local_default)


def _first(matches: list[Path], what: str) -> Path | None:
    if len(matches) > 1:  # say which one wins: two attached versions of a model are an easy mistake
        print(
            f"found {len(matches)} {what} under {kaggle_root()}; using the shallowest, {matches[0]} "
            f"(others: {', '.join(map(str, matches[1:4]))}); pass the path explicitly to choose"
        )
    return matches[0] if matches else None


# ------------------------------------------------------------------------------------- session limits


def session_limit_hours(env: Mapping[str, str] | None = None) -> float:
    """The TPU limit on a TPU VM (told by the variables Kaggle's TPU image sets: no torch_xla import), else the
    CPU/GPU one."""
    e = os.environ if env is None else env
    tpu = (
        e.get("ISTPUVM") == "1"
        or bool(e.get("TPU_ACCELERATOR_TYPE"))
        or e.get("PJRT_DEVICE", "").upper() == "TPU"
    )
    return SESSION_LIMIT_HOURS["tpu" if tpu else "cpu"]


def session_elapsed_seconds(proc: Path = Path("/proc"), env: Mapping[str, str] | None = None) -> float | None:
    """Seconds since this session began, or None if it cannot be known.

    A Kaggle session is a fresh container (or TPU VM): its PID 1 started with the session. The notebook
    kernel's own start is the fallback (it misses only the container's start-up). An age longer than any
    session limit means PID 1 is not the session's (a long-lived host): then the kernel's start is used.
    So does a Kaggle layout under KAGGLE_ROOT (Kaggle never sets it): that is a stand-in on some other host,
    whose PID 1 may be hours old without being the session's, and would leave training a 1-minute budget.
    """
    pids = ("self",) if (os.environ if env is None else env).get("KAGGLE_ROOT") else ("1", "self")
    ages = [process_age_seconds(pid, proc) for pid in pids]
    plausible = [a for a in ages if a is not None and 0 <= a < max(SESSION_LIMIT_HOURS.values()) * 3600]
    return plausible[0] if plausible else None


def process_age_seconds(pid: str = "self", proc: Path = Path("/proc")) -> float | None:
    """Seconds since process `pid` started (Linux: /proc/uptime and /proc/<pid>/stat's start time both count
    from the host's boot), or None where /proc cannot tell."""
    try:
        uptime = float((proc / "uptime").read_text().split()[0])
        # Field 22 is the start time in clock ticks; the command name (field 2) may contain spaces.
        fields = (proc / pid / "stat").read_text().rsplit(")", 1)[1].split()
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_started_at() -> float:
    """When this process started, on time.time()'s scale (now, where /proc cannot tell)."""
    return time.time() - (process_age_seconds() or 0.0)


def default_time_budget_minutes(
    env: Mapping[str, str] | None = None, elapsed_seconds: float | None = None
) -> float | None:
    """Training budget on Kaggle: the session limit minus a margin minus the time this session already
    used (when knowable). None off Kaggle: no limit to respect."""
    if not on_kaggle(env):
        return None
    if elapsed_seconds is None:
        elapsed_seconds = session_elapsed_seconds(env=env) or 0.0
    budget = session_limit_hours(env) * 60 - SESSION_MARGIN_MINUTES - elapsed_seconds / 60
    return max(budget, 1.0)  # too late to train properly, but a positive budget still saves an artifact
