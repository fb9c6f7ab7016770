"""pipeline/tooling/versions.py is the one table of tested versions: pyproject's ranges, requirements.lock, the README,
the matrix runner and Kaggle's images all agree with it; doctor compares a session with it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from pipeline.tooling import versions
from pipeline.tooling.doctor import collect, render

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml with tomllib")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(texts: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, texts)}


def pins(leg: versions.Leg) -> dict[str, str]:
    return {canonicalize_name(n): v for n, v in leg.pins().items()}


DEPENDENCIES = requirements(pyproject()["dependencies"])
TPU_EXTRA = requirements(pyproject()["optional-dependencies"]["tpu"])


def test_every_range_is_what_the_legs_prove():
    """Lower bound = the floor leg's pin; upper bound = below the next minor of the newest pin (or none)."""
    for name, requirement in {**DEPENDENCIES, "torch-xla": TPU_EXTRA["torch-xla"]}.items():
        spec_name = "torch_xla" if name == "torch-xla" else name
        assert versions.tested_range(spec_name) is not None, f"{name}: no leg pins it (the floor leg must)"
        assert requirement.specifier == SpecifierSet(versions.tested_range(spec_name)), (
            f"pyproject says {requirement}, the legs prove {name}{versions.tested_range(spec_name)}"
        )


def test_the_floor_leg_installs_every_lower_bound():
    floor = pins(versions.FLOOR)
    for name, requirement in {**DEPENDENCIES, "torch-xla": TPU_EXTRA["torch-xla"]}.items():
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        assert lower == [floor.get(name)], f"{requirement}: the floor leg pins {floor.get(name)}"


def test_the_newest_leg_pins_the_newest_allowed_and_no_other_leg_is_newer():
    newest = pins(versions.NEWEST)
    for name in ("torch", "torchaudio", "speechbrain"):
        allowed = DEPENDENCIES[name].specifier
        assert newest[name] in allowed
        others = [pins(leg)[name] for leg in versions.LEGS]
        assert max(others, key=versions._release) == newest[name]
        # The next minor release is outside the range: nothing newer than the newest leg is allowed.
        major, minor = versions._release(newest[name])[:2]
        assert f"{major}.{minor + 1}.0" not in allowed


@pytest.mark.parametrize("leg", versions.LEGS, ids=lambda leg: leg.name)
def test_each_legs_pins_satisfy_the_ranges(leg):
    leg_pins = pins(leg)
    for name, version in leg_pins.items():
        if name in DEPENDENCIES:
            assert version in DEPENDENCIES[name].specifier, (
                f"{leg.name}: {name} {version} vs {DEPENDENCIES[name]}"
            )
    if leg.torch_xla:
        for name, requirement in TPU_EXTRA.items():  # torch_xla and the torch/torchaudio it pairs with
            assert leg_pins[name] in requirement.specifier, (
                f"{leg.name}: {name} {leg_pins[name]} vs {requirement}"
            )
        assert versions._release(leg.torch_xla)[:2] == versions._release(leg.torch)[:2], (
            "torch_xla X.Y needs torch X.Y"
        )
    assert versions._release(leg.torchaudio)[:2] == versions._release(leg.torch)[:2]


def test_the_dev_leg_is_requirements_lock():
    lock = dict(
        (canonicalize_name(n), v)
        for n, v in (
            line.split("==") for line in (ROOT / "requirements.lock").read_text().split() if "==" in line
        )
    )
    dev = pins(versions.BY_NAME["dev"])
    assert {n: lock[n] for n in dev} == dev
    assert not versions.BY_NAME["dev"].in_matrix  # `make test` runs it in .venv


def test_the_kaggle_legs_are_the_kaggle_images():
    for name in ("kaggle-tpu", "kaggle-gpu"):
        image, leg = versions.IMAGES[name], versions.BY_NAME[name]
        assert image.python == "3.12"
        shipped = {n: v for n, v in image.preinstalled.items() if v is not None}
        assert {n: leg.pins()[n] for n in shipped} == shipped, name
    assert (
        versions.BY_NAME["kaggle-gpu"].torch_xla is None
        and "torch_xla" not in versions.KAGGLE_GPU.preinstalled
    )
    assert versions.KAGGLE_TPU.preinstalled["torch_xla"] == "2.8.0"
    assert versions.KAGGLE_GPU.preinstalled["torch"] == "2.10.0"


def test_the_runner_implements_every_check_and_installs_existing_extras():
    from matrix.run import CHECKS, EXTRAS

    extras = set(pyproject()["optional-dependencies"])
    for leg in versions.MATRIX_LEGS:
        assert set(leg.checks) <= set(CHECKS), leg.name
        assert set(EXTRAS[leg.name].split(",")) <= extras, leg.name
    assert [leg.name for leg in versions.MATRIX_LEGS] == ["floor", "kaggle-tpu", "kaggle-gpu", "newest"]


def test_the_runners_pytest_check_names_each_skipped_test(tmp_path):
    """A leg's pytest line keeps the count and adds each skip's reason: read off a real pytest run."""
    from matrix.run import pytest_summary

    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    pass\n\n"
        "def test_needs_an_extra():\n    pytest.skip('the extra is not installed')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", tmp_path],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    summary = pytest_summary(ran.stdout)
    assert summary.startswith("1 passed, 1 skipped"), ran.stdout
    assert summary.endswith("test_sample.py:7: the extra is not installed"), summary
    assert pytest_summary(ran.stdout.replace("SKIPPED", "skip")) == summary.split(";")[0]


def test_ci_runs_the_images_handoff_and_the_matrix_runs_it_too():
    """CI (`make handoff`) runs a subset of the matrix: the TPU image trains, the GPU image predicts offline."""
    assert [leg.name for leg in versions.HANDOFF_LEGS] == ["kaggle-tpu", "kaggle-gpu"]
    for leg in versions.HANDOFF_LEGS:
        assert set(leg.handoff_checks) <= set(leg.checks), leg.name
    tpu, gpu = versions.HANDOFF_LEGS
    assert "train notebook on 8 XLA CPU devices -> artifact" in tpu.handoff_checks
    assert "infer notebook offline on the kaggle-tpu artifact" in gpu.handoff_checks
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "make handoff" in ci


def test_the_onnx_stack_is_pinned_by_the_legs_bundled_and_left_out_on_python_310():
    from pipeline.tooling.packaging import EXTRA_WHEELS

    for leg in versions.LEGS:
        if leg.name != "newest":  # the newest leg takes the newest releases
            assert {n: leg.pins()[n] for n in versions.ONNX_STACK} == versions.ONNX_STACK, leg.name
    assert set(versions.ONNX_STACK) <= {canonicalize_name(name) for name, _ in EXTRA_WHEELS}
    for name in versions.ONNX_STACK:
        marker = DEPENDENCIES[name].marker
        assert marker is not None, (
            f"{name}: onnxruntime has no Python 3.10 wheel, so the stack needs a marker"
        )
        assert not marker.evaluate({"python_version": "3.10"}) and marker.evaluate({"python_version": "3.12"})


def test_the_readme_shows_the_table():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tested versions", 1)[1].split("\n## ", 1)[0]
    assert versions.markdown_table() in section
    assert "make matrix" in section


def test_importing_and_comparing_never_imports_torch():
    code = ("import sys; from pipeline.tooling import versions; versions.compare(); versions.markdown_table(); "
            "print(sorted(m for m in ('torch', 'torch_xla', 'torchaudio') if m in sys.modules))")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stderr


def fake(**found: str | None):
    return lambda name: found.get(name)


def test_compare_a_session_that_is_a_leg():
    tpu = versions.compare(fake(torch="2.8.0+cpu", torchaudio="2.8.0", torch_xla="2.8.0", speechbrain="1.1.2",
                                numpy="2.1.0"))  # fmt: skip
    assert tpu.matches == ["kaggle-tpu"] and not tpu.out_of_range and not tpu.notes
    gpu = versions.compare(fake(torch="2.10.0", torchaudio="2.10.0", speechbrain="1.1.2", numpy="2.0.2"))
    assert gpu.matches == ["kaggle-gpu"]
    lines = gpu.lines()
    assert lines[0] == (
        "this session: torch 2.10.0, torchaudio 2.10.0, torch_xla not installed, speechbrain 1.1.2, numpy 2.0.2"
    )
    assert lines[1] == "tested: the same versions as matrix leg(s) kaggle-gpu"
    assert any(line.split()[0] == "floor" and "torch 2.7.1" in line for line in lines)


def test_compare_an_untested_session():
    near = versions.compare(fake(torch="2.10.0", torchaudio="2.10.0", torch_xla="2.9.0", speechbrain="1.1.1"))
    assert near.matches == [] and near.nearest == "kaggle-gpu"
    assert near.notes == [
        "torch_xla 2.9.0 is built for torch 2.9, not torch 2.10.0: importing it will fail (C++ ABI)"
    ]
    outside = versions.compare(fake(torch="2.12.0", torchaudio="2.12.0", speechbrain="1.2.0", numpy="1.24.4"))
    assert outside.nearest is None
    assert outside.out_of_range == [
        "torch 2.12.0 is outside the tested >=2.7.1,<2.12",
        "torchaudio 2.12.0 is outside the tested >=2.7.1,<2.12",
        "speechbrain 1.2.0 is outside the tested >=1.1.0,<1.2",
        "numpy 1.24.4 is outside the tested >=1.26.0",
    ]
    assert "no leg has this torch: an untested combination" in outside.lines()
    assert versions.compare(fake()).session == dict.fromkeys(versions.KEY_PACKAGES)


def test_doctor_reports_the_versions_section_from_fake_metadata():
    report = collect(env={}, runner=lambda argv: "", version_of=fake(torch="2.8.0", torchaudio="2.8.0",
                                                                      torch_xla="2.8.0", speechbrain="1.1.2"))  # fmt: skip
    text = render(report)
    section = text.split("== versions\n", 1)[1].split("\n== ", 1)[0]
    assert "this session: torch 2.8.0, torchaudio 2.8.0, torch_xla 2.8.0, speechbrain 1.1.2" in section
    assert "tested: the same versions as matrix leg(s) kaggle-tpu" in section
    assert text.index("== versions") < text.index("== training")
