"""What a long step shows while it runs: a progress bar, a heartbeat for the launcher's stall check, and counts
and errors written as people read them."""

from __future__ import annotations

import contextlib
import os
import warnings

# The file a launched child touches to show progress (see heartbeat(); devices/launch.py sets it per rank).
HEARTBEAT_VARIABLE = "PIPELINE_LAUNCH_HEARTBEAT"


def progress_bar(total: int, desc: str, unit: str, enabled: bool, initial: int = 0, leave: bool = True):
    """A notebook-friendly bar (a widget where ipywidgets exists, text otherwise), or None when disabled."""
    if not enabled:
        return None
    with warnings.catch_warnings():  # without ipywidgets, tqdm.auto warns once and falls back to text: fine
        warnings.filterwarnings("ignore", message="IProgress not found")
        from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, mininterval=2.0, leave=leave)


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`1 class`, `2 classes`, `1 epoch`, `3 epochs`."""
    if count != 1:
        noun = plural_form or noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{count} {noun}"


def heartbeat() -> None:
    """Called by a worker as it makes progress (e.g. after every batch): under `launch(..., stall_timeout=s)` a
    rank that has not called it for `s` seconds counts as hung. Outside a launched process: does nothing."""
    if path := os.environ.get(HEARTBEAT_VARIABLE):
        with contextlib.suppress(OSError):
            os.utime(path)


def first_line(error: BaseException) -> str:
    """The first line of an error's message, for one-line logs (some errors carry no message at all)."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "(no message)"
