"""Build a directory where nobody looks, then swap it into place: a crash never leaves a half-written one.

The directory is built in a hidden sibling of the target, `.NAME.partial-*` (the same filesystem, so the final
rename is atomic). A directory it replaces is first renamed to `.NAME.old-*` and removed only after the swap.
Searches for folders (pipeline.kaggle) skip hidden names, so neither is ever taken for the real thing.
Used for the artifact and for the competition folders the data commands write.
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
