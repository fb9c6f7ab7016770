"""What a long step shows while it runs: a progress bar, and counts written as people write them."""

from __future__ import annotations

import warnings


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
    if count == 1:
        return f"{count} {noun}"
    if plural_form is None:
        plural_form = noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{count} {plural_form}"
