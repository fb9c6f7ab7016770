"""Tests for pipeline.safety, the static submission-safety check (check-safety)."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from pipeline.safety import Finding, analyse, check_notebook, main

REPO = Path(__file__).resolve().parents[2]


def make_project(root: Path, modules: dict[str, str] | None = None) -> Path:
    """Write a fake project: ``pipeline/__init__.py`` plus ``modules`` (relative path -> source)."""
    files = {"pipeline/__init__.py": ""}
    files.update(modules or {})
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def write_nb(path: Path, *cells: str | tuple[str, str]) -> Path:
    """Write a notebook; a plain string is a code cell, ``("markdown", text)`` a markdown cell."""
    nb_cells = [
        new_markdown_cell(c[1]) if isinstance(c, tuple) else new_code_cell(c)  # type: ignore[index]
        for c in cells
    ]
    nb = new_notebook(cells=nb_cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def rules(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(
        tmp_path, {"pipeline/infer.py": "import numpy as np\n\n\ndef predict(x):\n    return x\n"}
    )


def check_cell(root: Path, source: str) -> list[Finding]:
    return check_notebook(write_nb(root / "notebooks" / "infer.ipynb", source))


# --- clean notebook and CLI -------------------------------------------------------------------


def test_clean_notebook_has_no_findings_and_exit_0(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = write_nb(
        project / "notebooks" / "infer.ipynb",
        ("markdown", "# Inference\n!pip install speechbrain\nimport torch_xla"),  # markdown: not code
        "import numpy as np\nfrom pipeline.infer import predict",
        "%pip install --no-index --find-links /kaggle/input/wheels speechbrain",
    )
    report = analyse(nb)
    assert report.findings == []
    assert report.modules == ["pipeline", "pipeline.infer"]
    assert main([str(nb)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("check-safety: ") and "is submission-safe" in out[-1]
    assert "2 modules checked: pipeline, pipeline.infer" in out[-1]


def test_main_reports_path_cell_and_line_and_returns_1(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nb = write_nb(project / "notebooks" / "infer.ipynb", "import os", "x = 1\nimport torch_xla")
    assert main([str(nb)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r".*notebooks/infer\.ipynb:cell 2 line 2: xla-import: .*torch_xla.*", lines[0])
    assert lines[-1] == f"check-safety: 1 problem in {lines[0].split(':cell')[0]}"


def test_main_usage_errors_return_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing.ipynb")]) == 2
    assert "missing.ipynb" in capsys.readouterr().err
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    assert main([str(bad)]) == 2
    assert "bad.ipynb" in capsys.readouterr().err
    assert main([]) == 2  # no target: argparse usage error, returned instead of SystemExit
    ok = write_nb(tmp_path / "ok.ipynb", "x = 1")
    assert main([str(ok), "--root", str(tmp_path / "nope")]) == 2


# --- xla-import -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import torch_xla",
        "import torch_xla.core.xla_model as xm",
        "from torch_xla import runtime",
        "from torch_xla.distributed import parallel_loader as pl",
        "import importlib\nimportlib.import_module('torch_xla.core.xla_model')",
        "from importlib import import_module as im\nim('torch_xla')",
        "xm = __import__('torch_xla')",
        "try:\n    import torch_xla\nexcept ImportError:\n    torch_xla = None",
        "%time import torch_xla",
    ],
)
def test_xla_import_in_cell(project: Path, source: str) -> None:
    findings = check_cell(project, source)
    assert rules(findings) == ["xla-import"]
    expected_line = source.count("\n", 0, source.index("torch_xla")) + 1
    assert (findings[0].cell, findings[0].line) == (1, expected_line)


@pytest.mark.parametrize(
    "source",
    [
        "import torch_xlafoo",
        "import importlib.util\nimportlib.util.find_spec('torch_xla')",  # probing is not importing
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch_xla",
        "s = 'import torch_xla'",
    ],
)
def test_not_an_xla_import(project: Path, source: str) -> None:
    assert check_cell(project, source) == []


def test_xla_two_hops_away_reports_module_line_and_chain(tmp_path: Path) -> None:
    make_project(
        tmp_path,
        {
            "pipeline/infer.py": "import numpy\nfrom pipeline import util\n",
            "pipeline/util.py": (
                '"""Helpers."""\n\n\ndef device():\n    import torch_xla.core.xla_model as xm\n\n'
                "    return xm.xla_device()\n"
            ),
            # Not imported by the notebook: must not be reported.
            "pipeline/train.py": "import torch_xla\n",
        },
    )
    nb = write_nb(tmp_path / "notebooks" / "infer.ipynb", "# setup", "import pipeline.infer")
    findings = check_notebook(nb)
    assert len(findings) == 1
    f = findings[0]
    assert (f.rule, f.line, f.cell) == ("xla-import", 5, None)
    assert Path(f.path).as_posix().endswith("pipeline/util.py")
    assert f.chain[0].endswith("infer.ipynb:cell 2 line 1")
    assert f.chain[1:] == ("pipeline.infer line 2", "pipeline.util line 5")
    assert "pipeline.infer line 2 -> pipeline.util line 5" in f.format()
    assert f.format().startswith(f"{f.path}:5: xla-import: ")


def test_relative_import_chain(tmp_path: Path) -> None:
    make_project(
        tmp_path,
        {
            "pipeline/infer.py": "from .models import build\n",
            "pipeline/models/__init__.py": "from . import backbone\n\nbuild = backbone.build\n",
            "pipeline/models/backbone.py": "from ..devices import pick\n\nbuild = pick\n",
            "pipeline/devices.py": "import os\nfrom torch_xla import runtime\n",
        },
    )
    nb = write_nb(tmp_path / "infer.ipynb", "from pipeline.infer import build")
    findings = check_notebook(nb, root=tmp_path)
    assert rules(findings) == ["xla-import"]
    assert findings[0].path.endswith("devices.py") and findings[0].line == 2
    assert findings[0].chain[1:] == (
        "pipeline.infer line 1",
        "pipeline.models line 1",
        "pipeline.models.backbone line 1",
        "pipeline.devices line 2",
    )


def test_from_package_import_submodule_and_package_init_are_followed(tmp_path: Path) -> None:
    # `from pipeline.sub import tool` runs pipeline/__init__.py, pipeline/sub/__init__.py and,
    # since tool is a submodule, pipeline/sub/tool.py.
    make_project(
        tmp_path,
        {
            "pipeline/__init__.py": "from importlib import import_module\nimport_module('pipeline.dyn')\n",
            "pipeline/dyn.py": "import torch_xla  # reached via import_module\n",
            "pipeline/sub/__init__.py": "",
            "pipeline/sub/tool.py": "\n\nimport torch_xla.debug.metrics\n",
        },
    )
    nb = write_nb(tmp_path / "nb" / "infer.ipynb", "from pipeline.sub import tool")
    report = analyse(nb)
    assert sorted((Path(f.path).name, f.line) for f in report.findings) == [("dyn.py", 1), ("tool.py", 3)]
    assert set(report.modules) == {"pipeline", "pipeline.sub", "pipeline.sub.tool", "pipeline.dyn"}


def test_third_party_modules_are_not_followed(tmp_path: Path) -> None:
    make_project(tmp_path, {"numpy/__init__.py": "import torch_xla\n"})  # a fake "third-party" package
    nb = write_nb(tmp_path / "infer.ipynb", "import numpy as np")
    report = analyse(nb, root=tmp_path)
    assert report.findings == [] and report.modules == []
    # ...whereas naming it as a project package does follow it (so the test above can fail).
    assert rules(check_notebook(nb, root=tmp_path, packages=("pipeline", "numpy"))) == ["xla-import"]


def test_package_option_and_root_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = tmp_path / "proj"
    make_project(proj, {"mypkg/__init__.py": "", "mypkg/run.py": "import torch_xla\n"})
    nb = write_nb(tmp_path / "elsewhere" / "infer.ipynb", "import mypkg.run")
    assert main([str(nb), "--root", str(proj)]) == 0  # mypkg is not a followed package by default
    capsys.readouterr()
    assert main([str(nb), "--root", str(proj), "--package", "pipeline", "--package", "mypkg"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"mypkg/run\.py:1: xla-import: ", out)


def test_python_dash_m_of_a_project_module_is_followed(project: Path) -> None:
    make_project(project, {"pipeline/train.py": "import torch_xla\n"})
    findings = check_cell(project, "!python -m pipeline.train --epochs 1")
    assert rules(findings) == ["xla-import"]
    assert findings[0].path.endswith("train.py")


def test_python_dash_m_of_the_package_runs_its_main(project: Path) -> None:
    make_project(project, {"pipeline/__main__.py": "import sys\nimport torch_xla\n"})
    findings = check_cell(project, "import subprocess\nsubprocess.run(['python', '-m', 'pipeline', 'train'])")
    assert [(Path(f.path).name, f.line, f.rule) for f in findings] == [("__main__.py", 2, "xla-import")]


def test_python_dash_c_code_is_checked(project: Path) -> None:
    findings = check_cell(project, "x = 1\n!python -c 'import torch_xla; print(1)'")
    assert [(f.rule, f.cell, f.line) for f in findings] == [("xla-import", 1, 2)]


def test_ipython_help_syntax_falls_back_to_ipython_transformer(project: Path) -> None:
    findings = check_cell(project, "import os\nos.path?\n!pip install speechbrain")
    assert [(f.rule, f.line) for f in findings] == [("pip-online", 3)]


def test_missing_project_module_is_reported(project: Path) -> None:
    findings = check_cell(project, "import pipeline.nope")
    assert rules(findings) == ["unresolved"]
    assert "pipeline.nope" in findings[0].message


# --- pip-online -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "!pip install speechbrain",
        "%pip install speechbrain",
        "%pip install -q -U speechbrain==1.0.2",
        "!pip3 install speechbrain",
        "!python -m pip install speechbrain",
        "import sys\n!{sys.executable} -m pip install speechbrain",
        "!pip install --find-links /kaggle/input/wheels speechbrain",  # still falls back to PyPI
        "!cd /tmp && pip install speechbrain",
        "!pip install --no-index -f /w a; pip install b",  # the second install is online
        "if True:\n    !pip install speechbrain",
        "out = !pip install speechbrain",
        "%%bash\npip install speechbrain",
        "%%capture\n!pip install speechbrain",
        "import subprocess\nsubprocess.run(['pip', 'install', 'speechbrain'], check=True)",
        "import subprocess, sys\nsubprocess.check_call([sys.executable, '-m', 'pip', 'install', 'x'])",
        "import os\nos.system('pip install speechbrain')",
        "import os\npkg = 'x'\nos.system(f'pip install {pkg}')",
        "from subprocess import run\nrun('bash -c \"pip install x\"', shell=True)",
        "get_ipython().run_line_magic('pip', 'install speechbrain')",
        "!conda install -y ffmpeg",
        "import pip\npip.main(['install', 'speechbrain'])",
        "from pip._internal import main\nmain(['install', '-q', 'speechbrain'])",
        "from pip._internal.cli.main import main as pip_main\npip_main(['install', 'x'])",
    ],
)
def test_pip_online(project: Path, source: str) -> None:
    findings = check_cell(project, source)
    assert rules(findings) == ["pip-online"]
    assert findings[0].cell == 1
    assert findings[0].line == source.count("\n") + 1  # the install is on the last line


@pytest.mark.parametrize(
    "source",
    [
        "!pip install --no-index --find-links /kaggle/input/wheels speechbrain",
        "%pip install --no-index -f /kaggle/input/wheels speechbrain",
        "!python -m pip install --no-index --find-links=/kaggle/input/w x",
        "import subprocess\nsubprocess.run(['pip', 'install', '--no-index', '--find-links', '/w', 'x'])",
        "!pip list",
        "!pip uninstall -y torch_xla",
        "import pip\npip.main(['install', '--no-index', '--find-links', '/kaggle/input/w', 'x'])",
        "from pip._internal import main\nmain(['list'])",
        "print('pip install speechbrain')",
        "x = 10\ny = (x\n  % 3)",
    ],
)
def test_pip_offline_or_not_an_install(project: Path, source: str) -> None:
    assert check_cell(project, source) == []


def test_pip_line_number_inside_cell(project: Path) -> None:
    findings = check_cell(project, "import os\n\n%pip install speechbrain\nx = 1")
    assert [(f.rule, f.cell, f.line) for f in findings] == [("pip-online", 1, 3)]


# --- download ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import urllib.request\nurllib.request.urlopen('https://example.com/x')",
        "from urllib.request import urlretrieve\nurlretrieve('https://example.com/x', 'x')",
        "import requests\nrequests.get('https://example.com')",
        "import httpx\nhttpx.get('https://example.com')",
        "import torch\ntorch.hub.load('snakers4/silero-vad', 'silero_vad')",
        "from torch.hub import load_state_dict_from_url\nload_state_dict_from_url('https://x/y.pt')",
        "from huggingface_hub import snapshot_download\nsnapshot_download('speechbrain/spkrec-xvect')",
        "import huggingface_hub as hh\nhh.hf_hub_download('a/b', 'c.ckpt')",
        "from speechbrain.inference.speaker import EncoderClassifier\n"
        "EncoderClassifier.from_hparams(source='speechbrain/spkrec-ecapa-voxceleb', savedir='tmp')",
        "EncoderClassifier.from_hparams('speechbrain/spkrec-ecapa-voxceleb')",
        "from transformers import AutoModel\nAutoModel.from_pretrained('bert-base-uncased')",
        "from datasets import load_dataset\nload_dataset('user/speakers')",
        "import torchaudio\ntorchaudio.datasets.LIBRISPEECH('/tmp', download=True)",
        "!wget https://example.com/model.ckpt",
        "!curl -L -o m.ckpt https://example.com/m",
        "!git clone https://github.com/speechbrain/speechbrain",
        "!kaggle datasets download -d owner/data",
        "!kaggle competitions download -c some-comp",
        "import subprocess\nsubprocess.run('wget -q https://x', shell=True)",
        "import socket\nsocket.create_connection(('example.com', 443))",
        "import socket\ns = socket.socket()\ns.connect(('example.com', 80))",
        "import socket\nwith socket.socket(socket.AF_INET) as conn:\n    conn.connect_ex(('1.2.3.4', 80))",
        "from speechbrain.utils.fetching import fetch\nfetch('hyperparams.yaml', 'speechbrain/spkrec-ecapa-voxceleb')",
        "import speechbrain.utils.fetching as f\nf.fetch('x.ckpt', source='https://example.com/m', savedir='m')",
        "from speechbrain.utils.data_utils import download_file\ndownload_file('https://x/y.zip', 'y.zip')",
        "import torchaudio\ntorchaudio.utils.download_asset('tutorial-assets/x.wav')",
        "import ftplib\nftplib.FTP('ftp.example.com')",
    ],
)
def test_download(project: Path, source: str) -> None:
    findings = check_cell(project, source)
    assert rules(findings) == ["download"]
    assert findings[0].line == source.count("\n") + 1


@pytest.mark.parametrize(
    "source",
    [
        "artifact_dir = '/kaggle/input/ecapa'\nEncoderClassifier.from_hparams(source=artifact_dir)",
        "EncoderClassifier.from_hparams(source='/kaggle/input/ecapa', savedir='/kaggle/working/e')",
        "EncoderClassifier.from_hparams(source='./ecapa')",
        "EncoderClassifier.from_hparams(source=f'{ROOT}/ecapa')",
        "EncoderClassifier.from_hparams(source='models/ecapa')",  # exists under the project root
        "AutoModel.from_pretrained('owner/name', local_files_only=True)",
        "import torch\ntorch.hub.load('/kaggle/input/silero', 'silero_vad', source='local')",
        "from datasets import load_dataset\nload_dataset('csv', data_files='/kaggle/input/x.csv')",
        "import requests",
        "!ls /kaggle/input/wget-models",
        "from pipeline.infer import predict\npredict(download=False)",
        "from speechbrain.utils.fetching import fetch\nfetch('hyperparams.yaml', '/kaggle/input/ecapa')",
        "import socket\nsocket.gethostname()",
        "import socket\nserver = socket.socket()\nserver.bind(('', 0))",
        "conn = make()\nconn.connect('db.sqlite')",  # not a socket
    ],
)
def test_not_a_download(project: Path, source: str) -> None:
    (project / "models" / "ecapa").mkdir(parents=True)
    assert check_cell(project, source) == []


def test_socket_made_in_one_cell_connected_in_another(project: Path) -> None:
    nb = write_nb(
        project / "notebooks" / "infer.ipynb",
        "import socket\nsock = socket.socket()",
        "sock.connect(('h', 1))",
    )
    findings = check_notebook(nb)
    assert [(f.rule, f.cell, f.line) for f in findings] == [("download", 2, 1)]


def test_download_in_followed_module(tmp_path: Path) -> None:
    make_project(
        tmp_path,
        {
            "pipeline/infer.py": "from .model import load\n",
            "pipeline/model.py": (
                "from speechbrain.inference.speaker import EncoderClassifier\n\n\ndef load(d):\n"
                "    ok = EncoderClassifier.from_hparams(source=d)\n"
                "    return EncoderClassifier.from_hparams(source='speechbrain/spkrec-ecapa-voxceleb')\n"
            ),
        },
    )
    findings = check_notebook(write_nb(tmp_path / "infer.ipynb", "import pipeline.infer"))
    assert [(Path(f.path).name, f.line, f.rule) for f in findings] == [("model.py", 6, "download")]
    assert findings[0].chain[-1] == "pipeline.model line 6"


# --- syntax errors, .py targets ---------------------------------------------------------------


def test_syntax_error_in_module_is_a_finding_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_project(tmp_path, {"pipeline/infer.py": "import os\n\ndef broken(:\n    pass\n"})
    nb = write_nb(tmp_path / "infer.ipynb", "import pipeline.infer")
    findings = check_notebook(nb)
    assert [(Path(f.path).name, f.line, f.rule) for f in findings] == [("infer.py", 3, "syntax-error")]
    assert main([str(nb)]) == 1
    assert re.search(r"pipeline/infer\.py:3: syntax-error: ", capsys.readouterr().out)


def test_syntax_error_in_cell(project: Path) -> None:
    findings = check_cell(project, "x = 1\ndef f(:\n    pass")
    assert [(f.rule, f.cell, f.line) for f in findings] == [("syntax-error", 1, 2)]


def test_jupytext_percent_script_reports_file_lines(project: Path) -> None:
    nb = new_notebook(
        cells=[
            new_markdown_cell("!pip install not-code"),
            new_code_cell("import os\n!pip install speechbrain"),
            new_code_cell("%%bash\nwget https://example.com/x"),
            new_code_cell("%%writefile helper.py\nimport torch_xla"),  # written, not executed
            new_code_cell("from pipeline.infer import predict\nimport torch_xla"),
        ]
    )
    script = project / "notebooks" / "infer.py"
    script.parent.mkdir(exist_ok=True)
    jupytext.write(nb, script, fmt="py:percent")
    text = script.read_text().splitlines()

    def line_of(fragment: str) -> int:
        return next(i for i, line in enumerate(text, start=1) if fragment in line and "writefile" not in line)

    findings = check_notebook(script)
    assert [(f.rule, f.line, f.cell) for f in findings] == [
        ("pip-online", line_of("# !pip install speechbrain"), None),
        ("download", line_of("wget"), None),
        ("xla-import", max(i for i, line in enumerate(text, 1) if line == "import torch_xla"), None),
    ]


def test_jupytext_light_script_magics_but_not_plain_module_comments(project: Path) -> None:
    nb = new_notebook(cells=[new_code_cell("import os\n!pip install speechbrain")])
    light = project / "light.py"
    jupytext.write(nb, light, fmt="py:light")
    assert rules(check_notebook(light)) == ["pip-online"]
    plain = project / "plain.py"
    plain.write_text("import os\n# !pip install speechbrain  (just a comment in a module)\n")
    assert check_notebook(plain) == []


def test_plain_module_target_with_relative_imports(tmp_path: Path) -> None:
    make_project(
        tmp_path,
        {"pipeline/infer.py": "from . import util\n", "pipeline/util.py": "import torch_xla\n"},
    )
    findings = check_notebook(tmp_path / "pipeline" / "infer.py")
    assert [(Path(f.path).name, f.line) for f in findings] == [("util.py", 1)]


# --- the real project -------------------------------------------------------------------------


def test_real_inference_notebook_is_submission_safe() -> None:
    notebook = REPO / "notebooks" / "infer.ipynb"
    if not notebook.exists():
        pytest.skip("notebooks/infer.ipynb not present yet")
    report = analyse(notebook, root=REPO)
    assert report.findings == [], "\n".join(f.format() for f in report.findings)
    assert "pipeline" in report.modules
