"""Write where nobody looks, then swap into place: a crash never leaves a half-written file or directory.

Everything is written in a hidden sibling of its target, `.NAME.partial-*` (the same filesystem, so the final
rename is atomic). A directory it replaces is first renamed to `.NAME.old-*` and removed only after the swap.
Searches for folders (pipeline.kaggle) skip hidden names, so neither is ever taken for the real thing.
Directories: the artifact and the competition folders the data commands write. Files: submission.csv and the
files beside it, and training checkpoints.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def refuse_to_replace(target: Path, overwrite: bool, how_to_overwrite: str) -> None:
    """Stop before any work when `target` holds something the caller did not ask to replace."""
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"output path exists and is not a directory: {target}")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"output directory is not empty: {target} ({how_to_overwrite} to replace it)")


@contextmanager
def staged_file(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden path beside `target` to write the file at (it keeps `target`'s suffix, so writers that
    add one, like numpy's savez, leave it alone); when the block ends without error the file is flushed to
    disk and replaces `target`, otherwise it is removed and `target` is left as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.partial-", suffix=target.suffix)
    os.close(fd)
    staging = Path(name)
    try:
        yield staging
        with staging.open("rb") as handle:
            os.fsync(handle.fileno())
        staging.chmod(0o644)  # mkstemp makes a private file; these files are meant to be read
        os.replace(staging, target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def write_text_atomically(target: str | os.PathLike, text: str) -> None:
    """`target` holds `text` in full, or is left as it was."""
    with staged_file(target) as staging:
        staging.write_text(text, encoding="utf-8", newline="")


@contextmanager
def staged_directory(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty hidden folder beside `target`; when the block ends without error it replaces `target`,
    otherwise it is removed and `target` is left as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes a private folder; these folders are meant to be shared
        if target.exists():
            retired = target.with_name(f".{target.name}.old-{os.getpid()}-{time.time_ns()}")
            target.rename(retired)
            staging.rename(target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
