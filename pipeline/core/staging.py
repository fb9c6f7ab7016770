"""Write where nobody looks, then swap into place: a crash never leaves a half-written file or directory; and
never replace a folder this project did not write.

Everything is written in a hidden sibling of its target, `.NAME.partial-*` (the same filesystem, so the final
rename is atomic). A directory it replaces is first renamed to `.NAME.old-*` and removed only after the swap.
Searches for folders (pipeline.core.kaggle) skip hidden names, so neither is ever taken for the real thing.
Directories: the artifact, the competition folders the data commands write, `kaggle package` output and the
audio cache. Files: submission.csv and the files beside it, and training checkpoints.

The one rule for every output folder (`check_output_dir`, re-checked by `staged_directory` at the swap): it
may be new, empty, or one this project wrote before (its marker says so); anything else is refused with a
message that says what to do. It may never be the working directory, one of its parents, the home folder or a
filesystem root, and it may not overlap the folders it must stay apart from (e.g. the data it was made from).
A file the project names itself (a self-training round's targets beside the artifact; the report and the
extras beside a submission) has the same rule (`check_output_file`): new, or one this project wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Written into every folder the data commands, `kaggle package` and the audio cache create: what it is and the
# files it holds, so a later run may replace it while nobody has put or changed a file there
# (`changes_since_marked`). The artifact's own marker is its manifest.json (pipeline.core.artifact.is_artifact).
MARKER = ".written-by-pipeline"


class OutputRefused(FileExistsError):
    """An output folder would replace or overlap something this project does not own. Names both, and the fix."""


def mark(folder: Path, kind: str) -> None:
    """Record in `folder` that this project wrote it, as `kind` (e.g. "competition folder"), and every file in
    it with its size and modification time: what `changes_since_marked` holds the folder against later."""
    files = {name: _size_and_time(folder / name) for name in _files_below(folder) if name != MARKER}
    (folder / MARKER).write_text(json.dumps({"kind": kind, "files": files}) + "\n", encoding="utf-8")


def marked_as(folder: Path, kind: str) -> bool:
    return _marker(folder, kind) is not None


def _marker(folder: Path, kind: str) -> dict[str, Any] | None:
    """The marker's record if `folder` is marked as `kind`, else None."""
    record = read_record(folder / MARKER, ("kind",))
    return record if record is not None and record["kind"] == kind else None


def changes_since_marked(folder: Path, kind: str) -> list[str]:
    """What in a folder marked as `kind` this project did not write: files put there since, or changed since
    (another size or modification time than the marker records). [] when the folder is as this project left
    it, so a later run may replace it; every entry when it is not marked as `kind`. A file the marker lists
    but the folder lacks is no one's loss. A marker written before markers listed files names
    none: a file modified after the marker was written is then the change."""
    record = _marker(folder, kind)
    if record is None:
        return sorted(p.name for p in folder.iterdir()) or [f"no {MARKER}"]
    listed, marked_at = record.get("files"), (folder / MARKER).stat().st_mtime_ns
    changes = []
    for name in _files_below(folder):
        if name == MARKER:
            continue
        size, mtime = _size_and_time(folder / name)
        if listed is None:
            if mtime > marked_at:
                changes.append(f"{name} (changed since)")
        elif name not in listed:
            changes.append(name)
        elif listed[name] != [size, mtime]:
            changes.append(f"{name} (changed since)")
    return changes


def _files_below(folder: Path) -> list[str]:
    """Every file below `folder` (links as themselves, never followed), as paths relative to it."""
    names = []
    for root, dirs, files in os.walk(folder):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in files + links:
            names.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(names)


def _size_and_time(path: Path) -> list[int]:
    info = path.lstat()
    return [info.st_size, info.st_mtime_ns]


def check_output_dir(
    target: str | os.PathLike,
    *,
    name: str,
    what: str,
    is_ours: Callable[[Path], bool] | None = None,
    not_ours: Callable[[Path], Sequence[str]] | None = None,
    keep_apart: Mapping[str, str | os.PathLike | None] | None = None,
    replace_ours: bool = True,
    how_to_replace: str = "",
) -> Path:
    """Refuse (OutputRefused) to write the folder `target` (parameter `name`) unless it is new, empty, or `what`
    this project wrote before and `replace_ours`; and unless it stays apart from every folder of `keep_apart`
    ({parameter: path}). Ours: `not_ours`, what in it this project does not own (named in the refusal), lists
    nothing; or, given instead, `is_ours` says so (the refusal names every entry). Returns the resolved
    target. Nothing is touched."""
    resolved = Path(target).expanduser().resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if resolved == Path(resolved.anchor) or resolved == home or cwd.is_relative_to(resolved):
        where = (
            "a filesystem root"
            if resolved == Path(resolved.anchor)
            else ("your home folder" if resolved == home else "the working directory or one of its parents")
        )
        raise OutputRefused(
            f"{name}={str(target)!r} is {where} ({resolved}): this run would replace it. "
            f"Give {name} a folder of its own, e.g. {name}={str(Path(target) / 'model')!r}"
        )
    for other_name, other in (keep_apart or {}).items():
        if other is None:
            continue
        apart = Path(other).expanduser().resolve()
        relation = (
            "is"
            if resolved == apart
            else "lies inside"
            if resolved.is_relative_to(apart)
            else "contains"
            if apart.is_relative_to(resolved)
            else None
        )
        if relation:
            raise OutputRefused(
                f"{name}={str(target)!r} {relation} {other_name}={str(other)!r}: writing it could "
                f"replace or mix with what is there. Put {name} in a folder of its own, outside "
                f"{other_name}"
            )
    if not resolved.exists():
        return resolved
    if not resolved.is_dir():
        raise OutputRefused(
            f"{name}={str(target)!r} exists and is not a folder ({resolved}); give {name} a folder path"
        )
    entries = sorted(p.name for p in resolved.iterdir())
    if not entries:
        return resolved
    foreign = list(not_ours(resolved)) if not_ours else ([] if is_ours(resolved) else entries)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputRefused(
            f"{name}={str(target)!r} holds files this project did not write ({shown}); it is "
            f"not {what}, so it is left alone. Choose a new or empty folder for {name}, or "
            "move those files away yourself"
        )
    if not replace_ours:
        raise OutputRefused(
            f"{name}={str(target)!r} already holds {what} ({resolved}); "
            f"{how_to_replace or 'choose another folder'} to replace it"
        )
    return resolved


def read_record(path: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """The JSON object at `path` if it is a record of this project's (it holds every one of `keys`), else None:
    how a report or lineage record this project wrote is told from a user's file of the same name."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and all(key in record for key in keys) else None


def check_output_file(
    target: str | os.PathLike,
    *,
    is_ours: Callable[[Path], bool],
    what: str,
    why: str,
    instead: str = "choose another artifact_dir",
) -> Path:
    """Refuse (OutputRefused) to write the file `target`, named by this project (`why`: after what), unless it
    is new or `what` this project wrote before (`is_ours`); `instead`: the other way out than moving it.
    Nothing is touched."""
    path = Path(target)
    if path.is_dir() or (path.exists() and not is_ours(path)):
        raise OutputRefused(
            f"{path} is there and this project did not write it (it is not {what}), so it is left alone: "
            f"this run writes a file of that name ({why}). Move it away, or {instead}"
        )
    return path


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file, read in blocks (a targets file or a teacher model runs to hundreds of MB)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
def staged_directory(target: str | os.PathLike, is_ours: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield an empty hidden folder beside `target`; when the block ends without error it replaces `target`,
    otherwise it is removed and `target` is left as it was.

    `target` is replaced only if it is still absent, empty or `is_ours` at the swap (callers check first with
    check_output_dir; a long build gives someone time to put files there): never a folder of someone else's."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes a private folder; these folders are meant to be shared
        if target.exists() and not (target.is_dir() and (not any(target.iterdir()) or is_ours(target))):
            raise OutputRefused(
                f"{target} now holds files this project did not write; the new content was not "
                "put there (move them away and run again)"
            )
        retired = target.with_name(f".{target.name}.old-{os.getpid()}-{time.time_ns()}")
        if target.exists():
            target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired, ignore_errors=True)  # nothing there when there was no target
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
