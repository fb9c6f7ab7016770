"""`python -m pipeline doctor` on this CPU machine, on a fake TPU v5e-8 VM and with a fake T4 x2 nvidia-smi."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import requires_torch_xla
from helpers import ROOT

from pipeline.devices import probe
from pipeline.tooling.doctor import collect, render

T4_X2 = "0, GPU-aaaa1111, Tesla T4, 15360, 7.5\n1, GPU-bbbb2222, Tesla T4, 15360, 7.5\n"
# After the report: did anything initialise CUDA or import torch_xla? (A launcher started later must work.)
CHECK = "import sys, torch; print('cuda initialised', torch.cuda.is_initialized(), 'torch_xla', 'torch_xla' in sys.modules)"


def doctor(env: dict[str, str], cwd: Path = ROOT) -> str:
    """Run the CLI as a user would, in a clean environment plus `env`."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("ISTPUVM", "TPU_ACCELERATOR_TYPE", "PJRT_DEVICE", "KAGGLE_KERNEL_RUN_TYPE")}  # fmt: skip
    code = f"from pipeline.__main__ import main; main(['doctor'])\n{CHECK}"
    run = subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**base, **env}, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_on_this_cpu_machine():
    out = doctor({})
    assert f"CPU: {os.cpu_count()} cores" in out
    assert "TPU: none" in out and "GPU: none visible" in out
    assert "precision fp32; model size 'small'; per-device batch 32, global batch 32" in out
    assert "not a Kaggle session" in out
    for fact in ("P100 is retired", "v3-8", "T4 (Turing, sm_75) has no native bf16", "kaggle quota"):
        assert fact in out
    assert out.strip().endswith("cuda initialised False torch_xla False")


@requires_torch_xla
def test_on_a_kaggle_tpu_v5e_vm(tmp_path):
    (tmp_path / "input").mkdir()
    out = doctor({"ISTPUVM": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8", "PJRT_DEVICE": "TPU",
                  "KAGGLE_KERNEL_RUN_TYPE": "Batch", "KAGGLE_ROOT": str(tmp_path)})  # fmt: skip
    assert "TPU: TPU v5e, 8 XLA devices (TPU_ACCELERATOR_TYPE=v5litepod-8)" in out
    assert "TPU: 8 XLA devices (XLA SPMD, TPU v5e)" in out
    assert "precision bf16; model size 'voxceleb'; per-device batch 128, global batch 1024" in out
    assert "run type Batch" in out and "session limit 9 h" in out
    assert "(this session) Weekly quotas" in out
    assert out.strip().endswith("cuda initialised False torch_xla False")  # detected without importing it


@requires_torch_xla
def test_on_an_old_tpu_v3_8_the_replacement_note_comes_first(tmp_path):
    out = doctor({"ISTPUVM": "1", "TPU_ACCELERATOR_TYPE": "v3-8"})
    assert "TPU: TPU v3, 8 XLA devices" in out
    notes = [line for line in out.splitlines() if line.startswith("- ")]
    assert notes[0].startswith("- (this session) TPU v3-8 (4 chips x 2 cores) was replaced")


def test_with_a_fake_t4_x2_nvidia_smi_on_path(tmp_path):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    rows = T4_X2.replace("\n", "\\n")  # printf's escapes
    smi.write_text(f"#!/bin/sh\nprintf '{rows}'\n")  # answers every query with the two T4s
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    out = doctor({"PATH": f"{smi.parent}{os.pathsep}{os.environ['PATH']}"})
    assert "GPU 0: Tesla T4, 15.0 GiB, compute capability 7.5, bf16 NOT native (fp16 + loss scaling)" in out
    assert "GPU 1: Tesla T4" in out
    assert "CUDA: 2 GPUs (DDP, Tesla T4)" in out
    assert "precision fp16" in out and "global batch 64" in out
    assert "- (this session) T4 (Turing, sm_75) has no native bf16" in out
    assert out.strip().endswith("cuda initialised False torch_xla False")


def test_collect_with_an_injected_runner_and_a_bf16_gpu(monkeypatch):
    monkeypatch.setattr(probe, "_torch_cuda_built", lambda: True)  # a CUDA build, as on Kaggle
    a100 = "0, GPU-cccc3333, NVIDIA A100-SXM4-40GB, 40960, 8.0\n"
    report = collect(env={}, runner=lambda argv: a100)
    assert report.gpus[0]["bf16_native"] is True
    assert report.training["precision"] == "bf16"
    assert "bf16 native" in render(report)
