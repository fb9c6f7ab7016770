"""The ONNX export's cost: torch.export traced non-strict (what training does) against strict (Dynamo).

    python -m benchmarks.onnx_export --out benchmarks/raw/onnx_export.json

Training writes the artifact's fp32 ONNX file with pipeline.core.onnx.export_embedding_model: tracing,
conversion to ONNX and the check against torch. Each export here runs in a process of its own (Dynamo and
torch.export keep caches within one), on untrained models of the tiny size (the tests' and the XLA stand-in's;
one member and a 3-member ensemble) and of the voxceleb size (auto on a TPU or GPU). Both files of a model
must give the same embeddings: the largest difference between them is recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import print_result

MODELS = (("tiny", 1), ("tiny", 3), ("voxceleb", 1))


def export_once(preset: str, members: int, strict: bool, out: Path) -> dict[str, Any]:
    """One export in this process: its seconds and the ONNX file's embeddings of a fixed input."""
    import numpy as np
    import torch

    from pipeline.core import onnx as core_onnx
    from pipeline.core.model import ModelConfig, SpeakerClassifier

    torch.manual_seed(0)
    model = SpeakerClassifier(ModelConfig.from_preset(preset, n_classes=10, members=members)).eval()
    report = core_onnx.export_embedding_model(model, out, strict=strict)
    feats, lens = core_onnx.example_inputs(model, 5, 203, seed=3)
    session = core_onnx.load_session(out, threads=1)
    np.save(out.with_suffix(".npy"), core_onnx.run_session(session, feats, lens))
    return {"seconds": round(report.seconds, 1), "max_abs_diff_vs_torch": report.max_abs_diff}


def run() -> dict[str, Any]:
    import numpy as np

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="onnx-export-") as tmp:
        for preset, members in MODELS:
            name = f"{preset} x{members}"
            found[name] = {}
            for mode in ("strict", "non_strict"):
                out = Path(tmp) / f"{preset}{members}{mode}.onnx"
                one = ["--one", preset, str(members), mode, str(out)]
                argv = [sys.executable, "-m", "benchmarks.onnx_export", *one]
                done = subprocess.run(argv, capture_output=True, text=True, check=True)
                found[name][mode] = json.loads(done.stdout.strip().splitlines()[-1])
            strict, loose = (
                np.load(Path(tmp) / f"{preset}{members}{m}.npy") for m in ("strict", "non_strict")
            )
            seconds = {mode: found[name][mode]["seconds"] for mode in ("strict", "non_strict")}
            found[name]["files_max_abs_diff"] = float(np.abs(strict - loose).max())
            found[name]["speedup"] = round(seconds["strict"] / seconds["non_strict"], 2)
    headline = "; ".join(
        f"{name}: strict {v['strict']['seconds']:.1f} s, non-strict {v['non_strict']['seconds']:.1f} s "
        f"(x{v['speedup']:.1f}, files within {v['files_max_abs_diff']:.0e})"
        for name, v in found.items()
    )
    return {"headline": f"ONNX export (trace, conversion, check): {headline}", "models": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="raw file to write (stamped with the commit and machine)")
    parser.add_argument(
        "--one", nargs=4, metavar=("PRESET", "MEMBERS", "MODE", "FILE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.one:
        preset, members, mode, out = args.one
        print(json.dumps(export_once(preset, int(members), mode == "strict", Path(out))))
        return 0
    print_result(run(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
