"""pipeline/tooling/wheelcheck.py on fabricated wheels: a zip with METADATA and WHEEL is all pip (and the check) reads."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipeline.tooling import versions
from pipeline.tooling.wheelcheck import (
    WheelCheckError,
    check_bundle,
    read_wheel,
    require_installable,
    supported_tags,
)

CP312 = "cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64"
CP311 = "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"
PROJECT_REQUIRES = (
    "torch<2.12,>=2.7.1",
    "torchaudio<2.12,>=2.7.1",
    "speechbrain<1.2,>=1.1.0",
    "numpy>=1.26.0",
    "soundfile>=0.12.1",
    "packaging>=22.0",
    'torch_xla<2.10,>=2.7.0; extra == "tpu"',
    'pytest>=8; extra == "dev"',
)


def wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any", requires=(), requires_python=None,
          meta_name: str | None = None) -> Path:  # fmt: skip
    """Write NAME-VERSION-TAG.whl with a METADATA (Requires-Dist lines) and a WHEEL file."""
    stem = name.replace("-", "_").replace(".", "_")
    path = folder / f"{stem}-{version}-{tag}.whl"
    metadata = ["Metadata-Version: 2.1", f"Name: {meta_name or name}", f"Version: {version}"]
    if requires_python:
        metadata.append(f"Requires-Python: {requires_python}")
    metadata += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{stem}/__init__.py", "")
        archive.writestr(f"{stem}-{version}.dist-info/METADATA", "\n".join(metadata) + "\n")
        archive.writestr(
            f"{stem}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag.split('.')[0]}\n"
        )
    return path


def bundle(folder: Path, project_requires=PROJECT_REQUIRES) -> Path:
    """What `kaggle package` writes: the project, speechbrain's stack, native wheels for cp311 and cp312."""
    folder.mkdir(exist_ok=True)
    wheel(folder, "kaggle-ecapa-pipeline", "0.1.0", requires=project_requires, requires_python=">=3.10")
    wheel(folder, "speechbrain", "1.1.2", requires=("hyperpyyaml>=0.0.1", "numpy>=1.17.0", "soundfile>=0.12.1",
          "sentencepiece>=0.1.91", "torch>=2.1.0", "torchaudio>=2.1.0", "packaging"))  # fmt: skip
    wheel(folder, "hyperpyyaml", "1.2.3", requires=("pyyaml>=5.1", "ruamel.yaml>=0.17.28"))
    wheel(folder, "ruamel.yaml", "0.18.17",
          requires=('ruamel.yaml.clib>=0.2.7; platform_python_implementation=="CPython" and python_version<"3.14"',
                    'ruamel.yaml.jinja2>=0.2; extra == "jinja2"'))  # fmt: skip
    for tag in (CP311, CP312):
        wheel(folder, "ruamel.yaml.clib", "0.2.15", tag=tag)
        wheel(folder, "sentencepiece", "0.2.3", tag=tag)
    wheel(folder, "soundfile", "0.14.0", tag="py2.py3-none-manylinux_2_28_x86_64", requires=("cffi>=1.0",))
    return folder


def test_the_bundle_kaggle_package_writes_installs_on_both_images(tmp_path):
    code = bundle(tmp_path / "code")
    for image in versions.IMAGES.values():
        check = check_bundle(code, image)
        assert check.ok, check.summary()
        assert check.chosen["sentencepiece"].startswith("sentencepiece-0.2.3-cp312")  # not the cp311 build
        assert "ruamel-yaml-clib" in check.chosen and "kaggle-ecapa-pipeline" in check.chosen
    assert len(require_installable(code)) == 2


def test_a_requirement_above_the_images_torch_would_replace_it(tmp_path):
    """The project asking for torch >= 2.11 passes on no image: pip would swap out the image's CUDA torch."""
    code = bundle(
        tmp_path / "code", project_requires=("torch>=2.11", "torchaudio>=2.7.1", "speechbrain>=1.1")
    )
    gpu = check_bundle(code, "kaggle-gpu")
    assert not gpu.ok
    assert any("requires torch>=2.11, but kaggle-gpu has torch 2.10.0: pip would replace the image's torch" in p
               for p in gpu.problems), gpu.problems  # fmt: skip
    with pytest.raises(WheelCheckError, match="kaggle-tpu: 1 problem"):
        require_installable(code)


def test_an_upper_bound_below_the_images_torchaudio_is_caught_too(tmp_path):
    code = bundle(tmp_path / "code")
    wheel(code, "speechbrain", "1.1.2", requires=("torchaudio<2.9",))  # replaces the good one
    assert check_bundle(code, "kaggle-tpu").ok  # 2.8.0 fits
    problems = check_bundle(code, "kaggle-gpu").problems
    assert problems == ["speechbrain 1.1.2 requires torchaudio<2.9, but kaggle-gpu has torchaudio 2.10.0: "
                        "pip would replace the image's torchaudio"]  # fmt: skip


def test_a_native_wheel_for_cp311_only_does_not_install_on_cp312(tmp_path):
    code = bundle(tmp_path / "code")
    (code / f"sentencepiece-0.2.3-{CP312}.whl").unlink()
    problems = check_bundle(code, "kaggle-gpu").problems
    assert problems[0].startswith("sentencepiece: no wheel installs on CPython 3.12 manylinux x86_64")
    assert "cp311" in problems[0]


def test_platforms_and_python_the_image_cannot_take(tmp_path):
    code = bundle(tmp_path / "code")
    wheel(code, "macos-only", "1.0", tag="cp312-cp312-macosx_11_0_arm64")
    wheel(code, "too-new-glibc", "1.0", tag="cp312-cp312-manylinux_2_39_x86_64")
    wheel(code, "old-python", "1.0", requires_python="<3.12")
    wheel(code, "abi3-ok", "1.0", tag="cp38-abi3-manylinux_2_17_x86_64")
    check = check_bundle(code, "kaggle-tpu")
    failing = sorted(p.split(":")[0] for p in check.problems)
    assert failing == ["macos-only", "old-python", "too-new-glibc"]
    assert "abi3-ok" in check.chosen


def test_a_dependency_in_neither_the_image_nor_the_bundle_fails_offline(tmp_path):
    code = bundle(tmp_path / "code")
    wheel(code, "hyperpyyaml", "1.2.3", requires=("pyyaml>=5.1", "ruamel.yaml>=0.17.28", "not-anywhere>=1"))
    problems = check_bundle(code, "kaggle-gpu").problems
    assert problems == ["hyperpyyaml 1.2.3 requires not-anywhere>=1: neither kaggle-gpu nor the bundle has "
                        "not-anywhere (an offline install would fail)"]  # fmt: skip


def test_the_tpu_image_lacks_soundfile_so_it_must_be_bundled(tmp_path):
    code = bundle(tmp_path / "code")
    (code / "soundfile-0.14.0-py2.py3-none-manylinux_2_28_x86_64.whl").unlink()
    assert check_bundle(code, "kaggle-gpu").ok  # the GPU image has soundfile 0.13.1
    assert any(
        "neither kaggle-tpu nor the bundle has soundfile" in p
        for p in check_bundle(code, "kaggle-tpu").problems
    )


def test_an_unprotected_upgrade_is_a_note_and_a_bundled_torch_is_refused(tmp_path):
    code = bundle(tmp_path / "code")
    wheel(code, "speechbrain", "1.1.2", requires=("soundfile>=0.14",))
    gpu = check_bundle(code, "kaggle-gpu")
    assert gpu.ok and gpu.notes == [
        "speechbrain 1.1.2 requires soundfile>=0.14: pip upgrades kaggle-gpu's soundfile 0.13.1 to the bundled 0.14.0"
    ]
    wheel(code, "torch", "2.10.0", tag=CP312)
    assert any("the bundle carries torch-2.10.0" in p for p in check_bundle(code, "kaggle-gpu").problems)


def test_extras_asked_of_a_bundled_wheel_are_followed(tmp_path):
    code = bundle(tmp_path / "code")
    wheel(code, "hyperpyyaml", "1.2.3", requires=("pyyaml>=5.1", "ruamel.yaml[jinja2]>=0.17.28"))
    problems = check_bundle(code, "kaggle-gpu").problems
    assert any("requires ruamel.yaml.jinja2>=0.2" in p and "neither" in p for p in problems), problems


def test_unreadable_and_mislabelled_wheels(tmp_path):
    code = bundle(tmp_path / "code")
    (code / "broken-1.0-py3-none-any.whl").write_bytes(b"")  # a name only, as --wheels-dir tests write
    wheel(code, "liar", "1.0", meta_name="someone-else")
    problems = check_bundle(code, "kaggle-tpu").problems
    assert any(p.startswith("broken-1.0-py3-none-any.whl: not a readable wheel") for p in problems)
    assert any("METADATA says someone-else 1.0, the file name liar 1.0" in p for p in problems)
    assert check_bundle(tmp_path / "empty", "kaggle-tpu").problems[0].startswith("no wheels in")
    # An incomplete bundle (`kaggle package --allow-incomplete`) is not checked: it is refused elsewhere.
    assert require_installable(code, missing=["soundfile"]) == []


def test_supported_tags_are_cp312_linux_x86_64():
    tags = {str(t) for t in supported_tags(versions.KAGGLE_GPU)}
    assert "cp312-cp312-manylinux_2_35_x86_64" in tags and "cp312-abi3-manylinux2014_x86_64" in tags
    assert "py3-none-any" in tags and "cp312-cp312-linux_x86_64" in tags
    assert "cp311-abi3-manylinux_2_17_x86_64" in tags  # abi3 from an older CPython runs on 3.12
    assert not any("cp311-cp311" in t or "manylinux_2_36" in t or "aarch64" in t for t in tags)


def test_read_wheel(tmp_path):
    found = read_wheel(wheel(tmp_path, "Ruamel.Yaml", "0.18.17", requires=("a>=1",), requires_python=">=3.9"))
    assert (found.name, str(found.version), found.requires, found.requires_python) == (
        "ruamel-yaml", "0.18.17", ("a>=1",), ">=3.9")  # fmt: skip


ONNX_REQUIRES = tuple(
    f"{name}>={version}; python_version >= '3.11'" for name, version in versions.ONNX_STACK.items()
)


def onnx_stack(folder: Path, runtime_tags=(CP311, CP312)) -> Path:
    """The ONNX engine's wheels as `kaggle package` bundles them (dependencies as their METADATA states)."""
    for tag in runtime_tags:
        wheel(folder, "onnxruntime", "1.32.0", tag=tag, requires_python=">=3.11",
              requires=("flatbuffers", "numpy>=1.21.6", "packaging", "protobuf>=4.25.8", 'sympy; extra == "symbolic"'))  # fmt: skip
    for tag in (CP311, CP312):
        wheel(folder, "onnx", "1.23.2", tag=tag, requires=("numpy>=1.23.2", "protobuf>=6.31.1",
              "typing_extensions>=4.7.1", "ml_dtypes>=0.5.4"))  # fmt: skip
        wheel(folder, "ml_dtypes", "0.5.4", tag=tag, requires=("numpy>=1.21",))
    wheel(folder, "onnxscript", "0.7.2", requires=("ml_dtypes", "numpy", "onnx_ir<2,>=0.1.16", "onnx>=1.17",
          "packaging", "typing_extensions>=4.10"))  # fmt: skip
    wheel(folder, "onnx_ir", "1.1.0", requires=("numpy", "onnx>=1.16", "typing_extensions>=4.10", "ml_dtypes>=0.5.0",
          "sympy>=1.13", "packaging"))  # fmt: skip
    wheel(folder, "flatbuffers", "25.12.19")
    wheel(folder, "protobuf", "7.36.2", tag="cp39-abi3-manylinux2014_x86_64")
    return folder


def test_the_onnx_engine_stack_installs_on_both_images(tmp_path):
    code = onnx_stack(bundle(tmp_path / "code", PROJECT_REQUIRES + ONNX_REQUIRES))
    for image in versions.IMAGES.values():
        check = check_bundle(code, image)
        assert check.ok, check.summary()
        assert check.chosen["onnxruntime"].startswith("onnxruntime-1.32.0-cp312")
        assert {"onnxscript", "onnx", "onnx-ir", "ml-dtypes", "flatbuffers", "protobuf"} <= set(check.chosen)


def test_the_project_requires_the_onnx_stack_on_kaggles_python(tmp_path):
    """The markers (python_version >= '3.11') hold on the images' 3.12: a bundle without the runtime fails."""
    code = onnx_stack(bundle(tmp_path / "code", PROJECT_REQUIRES + ONNX_REQUIRES))
    for path in code.glob("onnxruntime-*.whl"):
        path.unlink()
    problems = check_bundle(code, "kaggle-gpu").problems
    assert problems == ["kaggle-ecapa-pipeline 0.1.0 requires onnxruntime>=1.32.0; python_version >= \"3.11\": "
                        "neither kaggle-gpu nor the bundle has onnxruntime (an offline install would fail)"]  # fmt: skip


def test_an_onnxruntime_wheel_for_cp311_only_does_not_install_on_cp312(tmp_path):
    code = onnx_stack(bundle(tmp_path / "code", PROJECT_REQUIRES + ONNX_REQUIRES), runtime_tags=(CP311,))
    problems = check_bundle(code, "kaggle-tpu").problems
    assert problems[0].startswith("onnxruntime: no wheel installs on CPython 3.12")


def test_a_dependency_of_the_onnx_stack_missing_from_the_bundle_is_named(tmp_path):
    code = onnx_stack(bundle(tmp_path / "code", PROJECT_REQUIRES + ONNX_REQUIRES))
    for path in code.glob("ml_dtypes-*.whl"):
        path.unlink()
    problems = check_bundle(code, "kaggle-gpu").problems
    assert any("onnx 1.23.2 requires ml_dtypes>=0.5.4: neither kaggle-gpu nor the bundle has ml-dtypes" in p
               for p in problems), problems  # fmt: skip
