"""pipeline.devices.probe driven by fake env vars, fake /dev and /sys trees and a fake nvidia-smi."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import requires_torch_xla

from pipeline.devices import probe
from pipeline.devices.probe import Topology, detect_topology

REPO = Path(__file__).resolve().parents[2]

T4_X2 = "0, GPU-aaaa1111, Tesla T4, 15360, 7.5\n1, GPU-bbbb2222, Tesla T4, 15360, 7.5\n"
A100 = "0, GPU-cccc3333, NVIDIA A100-SXM4-40GB, 40960, 8.0\n"


def fake_smi(rows: str, *, old_driver: bool = False):
    """A stand-in for running nvidia-smi: answers the --query-gpu call with `rows`."""

    def run(argv: Sequence[str]) -> str:
        assert argv[0] == "nvidia-smi"
        query = next(a for a in argv if a.startswith("--query-gpu="))
        if "compute_cap" in query:
            if old_driver:
                raise subprocess.CalledProcessError(2, list(argv), 'Field "compute_cap" is not a valid field')
            return rows
        return "\n".join(", ".join(line.split(", ")[:4]) for line in rows.strip().splitlines()) + "\n"

    return run


def no_smi(argv: Sequence[str]) -> str:
    raise FileNotFoundError(argv[0])


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch):
    # Tests describe the machine themselves: torch_xla "installed", a CUDA build of torch.
    probe.clear_caches()
    monkeypatch.setattr(probe, "torch_xla_importable", lambda: True)
    monkeypatch.setattr(probe, "_torch_cuda_built", lambda: True)
    yield
    probe.clear_caches()


def detect(
    tmp_path: Path, env: dict[str, str], accelerator: str = "auto", devices: int | None = None, runner=no_smi
):
    return detect_topology(accelerator, devices, env=env, runner=runner, root=str(tmp_path))


def touch(root: Path, *relpaths: str, text: str = "") -> None:
    for rel in relpaths:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


# ------------------------------------------------------------------------------------------------ TPU


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("acc_type", "kind"),
    [("v5litepod-8", "TPU v5e"), ("v3-8", "TPU v3")],
)
def test_kaggle_tpu_vm(tmp_path: Path, acc_type: str, kind: str) -> None:
    topo = detect(tmp_path, {"ISTPUVM": "1", "TPU_ACCELERATOR_TYPE": acc_type})
    assert topo == Topology("tpu", 8, kind, True, f"TPU_ACCELERATOR_TYPE={acc_type}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("acc_type", "expected"),
    [
        ("v2-8", ("TPU v2", 8)),
        ("v3-32", ("TPU v3", 8)),  # a pod slice: one host still sees 8 cores
        ("v4-8", ("TPU v4", 4)),  # N counts TensorCores; megacore makes 1 device per chip
        ("v5p-8", ("TPU v5p", 4)),
        ("v5litepod-4", ("TPU v5e", 4)),
        ("v6e-8", ("TPU v6e", 8)),
        ("V5LITEPOD-8", ("TPU v5e", 8)),
        ("tpu-x", None),
        ("v9z-8", None),
    ],
)
def test_parse_tpu_accelerator_type(acc_type: str, expected: tuple[str, int] | None) -> None:
    assert probe.parse_tpu_accelerator_type(acc_type) == expected


@pytest.mark.timeout(30)
def test_tpu_count_from_device_files(tmp_path: Path) -> None:
    env = {"ISTPUVM": "1"}
    (tmp_path / "dev").mkdir()
    assert detect(tmp_path, env).num_devices == 8  # no type, no files: the 8 both Kaggle shapes have
    probe.clear_caches()

    touch(tmp_path, *(f"dev/accel{i}" for i in range(4)))  # v3-8: 4 chip files x 2 cores
    topo = detect(tmp_path, env)
    assert (topo.accelerator, topo.num_devices, topo.device_kind) == ("tpu", 8, "TPU v3")


@pytest.mark.timeout(30)
def test_tpu_count_from_vfio_and_pci(tmp_path: Path) -> None:
    vfio = tmp_path / "vfio_root"
    touch(vfio, "dev/vfio/vfio", *(f"dev/vfio/{i}" for i in range(8)))  # v5e-8: one file per chip
    topo = detect_topology(env={}, runner=no_smi, root=str(vfio))  # files alone are enough for auto
    assert (topo.accelerator, topo.num_devices, topo.device_kind) == ("tpu", 8, "TPU v5e")

    pci = tmp_path / "pci_root"
    for i in range(4):  # v3-8 seen on PCI: 4 chips of device id 0x0027, 2 cores each
        touch(pci, f"sys/bus/pci/devices/0000:00:0{i}.0/vendor", text="0x1ae0\n")
        touch(pci, f"sys/bus/pci/devices/0000:00:0{i}.0/device", text="0x0027\n")
    touch(pci, "sys/bus/pci/devices/0000:00:09.0/vendor", text="0x8086\n")  # not Google
    touch(pci, "sys/bus/pci/devices/0000:00:09.0/device", text="0x0027\n")
    topo = detect_topology("tpu", env={}, runner=no_smi, root=str(pci))
    assert (topo.num_devices, topo.device_kind) == (8, "TPU v2/v3")


@pytest.mark.timeout(30)
def test_xla_cpu_stand_in_for_tpu(tmp_path: Path) -> None:
    topo = detect(tmp_path, {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}, "tpu")
    assert (topo.accelerator, topo.num_devices, topo.bf16_native) == ("tpu", 8, True)
    assert topo.device_kind == "XLA CPU (stand-in for TPU)"
    assert detect(tmp_path, {"PJRT_DEVICE": "CPU"}, "tpu").num_devices == 1  # CPU_NUM_DEVICES default
    # auto never picks the stand-in, even on a TPU VM where the user forced PJRT_DEVICE=CPU
    assert detect(tmp_path, {"PJRT_DEVICE": "CPU", "ISTPUVM": "1"}).accelerator == "cpu"
    with pytest.raises(ValueError, match="CPU_NUM_DEVICES"):
        detect(tmp_path, {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "eight"}, "tpu")


@pytest.mark.timeout(30)
def test_tpu_requested_but_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="PJRT_DEVICE=CPU"):
        detect(tmp_path, {}, "tpu")
    monkeypatch.setattr(probe, "torch_xla_importable", lambda: False)
    assert not probe.tpu_available({"ISTPUVM": "1"}, root=str(tmp_path))
    assert detect(tmp_path, {"ISTPUVM": "1"}).accelerator == "cpu"
    with pytest.raises(RuntimeError, match="torch_xla is not installed"):
        detect(tmp_path, {"ISTPUVM": "1"}, "tpu")


# ----------------------------------------------------------------------------------------------- CUDA


@pytest.mark.timeout(30)
def test_two_t4s(tmp_path: Path) -> None:
    topo = detect(tmp_path, {}, runner=fake_smi(T4_X2))
    assert (topo.accelerator, topo.num_devices, topo.device_kind, topo.bf16_native) == (
        "cuda",
        2,
        "Tesla T4",
        False,
    )
    assert "7.5, 7.5" in topo.detail
    info = probe.gpu_info({}, runner=fake_smi(T4_X2))
    assert [(g["index"], g["name"], g["memory_mib"], g["compute_capability"]) for g in info] == [
        (0, "Tesla T4", 15360, (7, 5)),
        (1, "Tesla T4", 15360, (7, 5)),
    ]


@pytest.mark.timeout(30)
def test_a100_is_bf16_native(tmp_path: Path) -> None:
    topo = detect(tmp_path, {}, "cuda", runner=fake_smi(A100))
    assert (topo.num_devices, topo.device_kind, topo.bf16_native) == (1, "NVIDIA A100-SXM4-40GB", True)


@pytest.mark.timeout(30)
def test_old_driver_without_compute_cap_field(tmp_path: Path) -> None:
    info = probe.gpu_info({}, runner=fake_smi(T4_X2 + A100.replace("0, ", "2, ", 1), old_driver=True))
    assert [g["compute_capability"] for g in info] == [(7, 5), (7, 5), (8, 0)]  # from the names
    mixed = fake_smi(T4_X2 + A100.replace("0, ", "2, ", 1), old_driver=True)
    assert not detect(tmp_path, {}, runner=mixed).bf16_native  # a T4 among them: not native


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("cvd", "indices"),
    [("1", [1]), ("1,0", [1, 0]), ("", []), ("0,0", []), ("0,5,1", [0]), ("-1", []), ("GPU-bbbb", [1])],
)
def test_cuda_visible_devices(cvd: str, indices: list[int]) -> None:
    env = {"CUDA_VISIBLE_DEVICES": cvd}
    assert [g["index"] for g in probe.gpu_info(env, runner=fake_smi(T4_X2))] == indices
    assert probe.cuda_device_count(env, runner=fake_smi(T4_X2)) == len(indices)


@pytest.mark.timeout(30)
def test_cpu_only_torch_ignores_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "_torch_cuda_built", lambda: False)
    assert detect(tmp_path, {}, runner=fake_smi(T4_X2)).accelerator == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        detect(tmp_path, {}, "cuda", runner=fake_smi(T4_X2))


@pytest.mark.timeout(30)
def test_pynvml_is_used_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    handles = {0: ("Tesla T4", "GPU-1"), 1: ("Tesla T4", "GPU-2")}
    fake = types.ModuleType("pynvml")
    fake.__spec__ = importlib.machinery.ModuleSpec("pynvml", None)
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: len(handles)
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: handles[h][0].encode()  # old pynvml returns bytes
    fake.nvmlDeviceGetUUID = lambda h: handles[h][1]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=15360 * 2**20)
    fake.nvmlDeviceGetCudaComputeCapability = lambda h: (7, 5)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = probe.gpu_info({"CUDA_VISIBLE_DEVICES": "1"})
    assert info == [
        {"index": 1, "uuid": "GPU-2", "name": "Tesla T4", "memory_mib": 15360, "compute_capability": (7, 5)}
    ]


# ----------------------------------------------------------------------------------- auto and devices


@pytest.mark.timeout(30)
def test_nothing_means_one_cpu(tmp_path: Path) -> None:
    topo = detect(tmp_path, {})
    assert (topo.accelerator, topo.num_devices, topo.device_kind, topo.bf16_native) == (
        "cpu",
        1,
        "cpu",
        False,
    )
    assert topo.to_dict()["accelerator"] == "cpu"


@pytest.mark.timeout(30)
def test_auto_prefers_tpu_then_cuda(tmp_path: Path) -> None:
    both = {"ISTPUVM": "1", "TPU_ACCELERATOR_TYPE": "v3-8"}
    assert detect(tmp_path, both, runner=fake_smi(T4_X2)).accelerator == "tpu"
    assert detect(tmp_path, {}, runner=fake_smi(T4_X2)).accelerator == "cuda"
    assert detect(tmp_path, {}, "gpu", runner=fake_smi(T4_X2)).accelerator == "cuda"  # alias


@pytest.mark.timeout(30)
def test_devices_override(tmp_path: Path) -> None:
    t4 = fake_smi(T4_X2)
    assert detect(tmp_path, {}, devices=1, runner=t4).num_devices == 1
    assert detect(tmp_path, {}, devices=2, runner=t4).num_devices == 2
    with pytest.raises(ValueError, match=r"devices=3 but only 2 Tesla T4"):
        detect(tmp_path, {}, devices=3, runner=t4)
    tpu = {"ISTPUVM": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8"}
    assert detect(tmp_path, tpu, devices=8).num_devices == 8
    for fewer_or_more in (4, 16):  # SPMD uses every device: refused here, not later inside torch_xla
        with pytest.raises(ValueError, match=f"devices={fewer_or_more} but TPU training uses all 8"):
            detect(tmp_path, tpu, devices=fewer_or_more)
    with pytest.raises(ValueError, match="set CPU_NUM_DEVICES instead"):
        detect(tmp_path, {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}, "tpu", devices=8)
    assert detect(tmp_path, {}, "cpu", devices=4).num_devices == 4  # 4 gloo processes
    limit = 4 * (os.cpu_count() or 1)
    assert detect(tmp_path, {}, "cpu", devices=limit).num_devices == limit
    with pytest.raises(ValueError, match="devices="):
        detect(tmp_path, {}, "cpu", devices=limit + 1)
    for bad in (0, -1, True, "2", 2.0):
        with pytest.raises(ValueError, match="devices"):
            detect(tmp_path, {}, devices=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_unknown_accelerator(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"accelerator must be one of 'auto', 'tpu', 'cuda', 'cpu'; got 'mps'"
    ):
        detect(tmp_path, {}, "mps")


# ------------------------------------------------------------------- the probe leaves CUDA and XLA alone

_SIDE_EFFECT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pipeline.devices import probe

    def bad_fork():
        # torch marks a process whose CUDA runtime was touched ("poison fork"); a forked child then
        # reports _is_in_bad_fork() -- measurable without any GPU.
        import torch
        pid = os.fork()
        if pid == 0:
            os._exit(7 if torch.cuda._is_in_bad_fork() else 0)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7

    stand_in = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}
    topologies = [
        probe.detect_topology().to_dict(),
        probe.detect_topology("cpu", devices=2).to_dict(),
        probe.detect_topology("tpu", env=stand_in).to_dict(),
    ]
    probe.gpu_info()
    probe.cuda_device_count()
    probe.tpu_available()
    import torch
    out = {
        "topologies": topologies,
        "cuda_initialized": torch.cuda.is_initialized(),
        "torch_xla_imported": "torch_xla" in sys.modules,
        "bad_fork": bad_fork(),
    }
    if hasattr(torch._C, "_cuda_getDeviceCount"):  # control: the call the probe avoids does poison fork
        torch._C._cuda_getDeviceCount()
        out["bad_fork_after_cudaGetDeviceCount"] = bad_fork()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.timeout(120)
@requires_torch_xla
def test_probe_does_not_initialise_cuda_or_import_torch_xla() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "PJRT_", "XLA_", "CPU_NUM"))}
    env.pop("ISTPUVM", None)
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-c", _SIDE_EFFECT_SCRIPT], env=env, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert out["topologies"][2]["num_devices"] == 8
    assert out["cuda_initialized"] is False
    assert out["torch_xla_imported"] is False
    assert out["bad_fork"] is False
    if "bad_fork_after_cudaGetDeviceCount" in out:
        assert out["bad_fork_after_cudaGetDeviceCount"] is True  # the check above can see poisoning


@pytest.mark.timeout(30)
def test_gpus_nothing_can_count_are_said_loudly_not_skipped_silently(tmp_path: Path, monkeypatch) -> None:
    """Issue 13: with no NVML at all (no pynvml, no nvidia-smi, no libnvidia-ml) `auto` chose the CPU on a GPU
    machine without a word."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    monkeypatch.setattr(probe, "_physical_gpus_default", lambda: ())
    monkeypatch.setattr(probe, "_torch_nvml_count", lambda: -1)
    with pytest.warns(RuntimeWarning, match=r"GPU device files exist .*nvidia0.*accelerator='cuda'"):
        topology = detect_topology(env={}, root=str(tmp_path))
    assert topology.accelerator == "cpu"
    (tmp_path / "dev" / "nvidia0").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no device files: a CPU machine, nothing to say
        assert detect_topology(env={}, root=str(tmp_path)).accelerator == "cpu"
