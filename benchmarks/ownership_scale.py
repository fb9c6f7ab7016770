"""What telling this project's folders from a user's costs, at two sizes: the rule that nothing a user owns is
replaced reads every file's size and modification time (a marked folder) or hashes every file (an artifact).

    python -m benchmarks.ownership_scale [--quick] [--files N] [--mb M] [--out FILE]

Marked folders (core/staging): a competition folder of N and 10N audio files, as `python -m pipeline data`
lays one out (audio/ in folders of 1,000); `mark` records every file and `changes_since_marked` checks them,
as `--overwrite` and `kaggle package` do before they replace a folder. Artifacts (core/artifact): the check
that training runs before it replaces an earlier artifact (`not_the_artifact`), on an artifact whose weights
file is M and 10M MB ('voxceleb' weighs ~80 MB a copy). Times are the median of 3 runs; files are on this
machine's disk, in its page cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import print_result


def median_seconds(step: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 4)


def competition_folder(root: Path, files: int) -> Path:
    """`files` small WAV-named files under audio/, in folders of 1,000, and the four tables."""
    for name in ("train.csv", "test.csv", "sample_submission.csv", "solution.csv"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("path,label\n")
    for k in range(files):
        path = root / "audio" / f"{k // 1000:03d}" / f"{k:06d}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"RIFF")
    return root


def marked_folder(tmp: Path, files: int) -> dict[str, Any]:
    from pipeline.core.staging import MARKER, changes_since_marked, mark

    root = competition_folder(tmp / f"folder_{files}", files)
    marking = median_seconds(lambda: mark(root, "competition folder"))
    checking = median_seconds(lambda: changes_since_marked(root, "competition folder"))
    assert changes_since_marked(root, "competition folder") == []
    return {"files": files, "mark_s": marking, "check_s": checking,
            "marker_kb": round((root / MARKER).stat().st_size / 1e3)}  # fmt: skip


def artifact(tmp: Path, megabytes: int) -> dict[str, Any]:
    """An artifact-shaped folder (a manifest listing a weights file of `megabytes` and four small files),
    written as save_artifact records its files, then checked as training checks it."""
    import numpy as np

    from pipeline.core.artifact import MANIFEST, REQUIRED_FILES, _file_record, not_the_artifact

    root = tmp / f"artifact_{megabytes}"
    root.mkdir()
    weights = np.random.default_rng(0).integers(0, 255, megabytes * 1_000_000, dtype=np.uint8)
    (root / REQUIRED_FILES[0]).write_bytes(weights.tobytes())
    for name in REQUIRED_FILES[1:]:
        (root / name).write_text(name)
    files = {p.name: _file_record(p) for p in sorted(root.iterdir())}
    (root / MANIFEST).write_text(json.dumps({"format_version": 2, "files": files}))
    checking = median_seconds(lambda: not_the_artifact(root))
    assert not_the_artifact(root) == []
    return {"weights_mb": megabytes, "check_s": checking}


def run(quick: bool = False, files: int | None = None, megabytes: int | None = None) -> dict[str, Any]:
    small_files = files or (300 if quick else 3_000)
    small_mb = megabytes or (4 if quick else 40)
    with tempfile.TemporaryDirectory(prefix="bench-ownership-") as tmp:
        folders = [marked_folder(Path(tmp), n) for n in (small_files, small_files * 10)]
        artifacts = [artifact(Path(tmp), mb) for mb in (small_mb, small_mb * 10)]
    (one, ten), (small, large) = folders, artifacts
    result: dict[str, Any] = {
        "folders": folders,
        "artifacts": artifacts,
        "mark_ratio": round(ten["mark_s"] / one["mark_s"], 2),
        "check_ratio": round(ten["check_s"] / one["check_s"], 2),
        "artifact_ratio": round(large["check_s"] / small["check_s"], 2),
    }
    result["headline"] = (
        f"a competition folder of {one['files']:,} / {ten['files']:,} files: marked in {one['mark_s']} / "
        f"{ten['mark_s']} s (x{result['mark_ratio']}), checked in {one['check_s']} / {ten['check_s']} s "
        f"(x{result['check_ratio']}), marker {one['marker_kb']} / {ten['marker_kb']} kB; an artifact of "
        f"{small['weights_mb']} / {large['weights_mb']} MB of weights checked in {small['check_s']} / "
        f"{large['check_s']} s (x{result['artifact_ratio']})"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--files", type=int, help="the smaller folder's audio files (the larger has 10x)")
    parser.add_argument("--mb", type=int, help="the smaller artifact's weights in MB (the larger has 10x)")
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    print_result(run(args.quick, args.files, args.mb), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
