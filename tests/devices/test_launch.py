"""pipeline.devices.launch with real processes: spawned gloo ranks, failures, timeouts, and the seed
notebook's "Can't get attribute 'worker' on <module '__main__'>" reproduced through papermill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import nbformat
import psutil
import pytest
from launch_fixtures import workers  # tests/ is on sys.path (pytest rootdir-less test dir)

from pipeline.devices.launch import (
    LaunchError,
    LaunchTimeout,
    WorkerFailed,
    check_worker_importable,
    launch,
    running_under_torchrun,
)

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def _children() -> set[int]:
    """Live descendants of pytest, except multiprocessing's long-lived resource_tracker helper."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _assert_dead(pids: list[int]) -> None:
    for pid in pids:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"pid {pid} still alive ({status})"


# ----------------------------------------------------------------------------------- launch, in pytest


@pytest.mark.timeout(120)
def test_two_gloo_ranks_allreduce_and_see_their_env() -> None:
    results = launch(workers.allreduce_rank, 2, timeout=100)
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["dist_rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 0 + 1 for r in results)
    for rank, r in enumerate(results):
        env = r["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.1"
    assert results[0]["env"]["MASTER_PORT"] == results[1]["env"]["MASTER_PORT"]
    assert "RANK" not in os.environ  # the parent's environment is left as it was


@pytest.mark.timeout(120)
def test_results_come_back_in_rank_order_with_extra_env() -> None:
    assert launch(workers.square_shard, 2, args=([0, 1, 2, 3],), timeout=60) == [[0, 4], [1, 9]]
    (r0, w0, var0, pid0), (r1, w1, var1, pid1) = launch(
        workers.env_and_pid, 2, env={"LAUNCH_TEST_VAR": "hello"}, timeout=60
    )
    assert (r0, r1, w0, w1, var0, var1) == (0, 1, 2, 2, "hello", "hello")
    assert os.getpid() not in (pid0, pid1) and pid0 != pid1
    assert "LAUNCH_TEST_VAR" not in os.environ


@pytest.mark.timeout(120)
def test_failing_rank_is_named_with_its_traceback() -> None:
    with pytest.raises(WorkerFailed) as info:
        launch(workers.fail_on_rank, 2, args=(1,), timeout=60)
    assert info.value.rank == 1
    assert "rank 1" in str(info.value) and "ValueError: boom from rank 1" in str(info.value)
    assert "fail_on_rank" in info.value.traceback
    assert _children() == set()


@pytest.mark.timeout(120)
def test_timeout_kills_every_rank(tmp_path: Path) -> None:
    timeout = 8.0
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match=r"rank\(s\) \[0, 1\] still running"):
        launch(workers.hang, 2, args=(str(tmp_path),), timeout=timeout)
    assert time.monotonic() - start < timeout + 10  # +kill grace, never the worker's "forever"
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]
    assert len(pids) == 2  # both ranks really ran before being killed
    _assert_dead(pids)
    assert _children() == set()


@pytest.mark.timeout(120)
def test_stall_timeout_kills_ranks_that_stop_calling_heartbeat(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(LaunchTimeout, match=r"rank\(s\) \[0, 1\] made no progress for 3.0 s"):
        launch(workers.hang, 2, args=(str(tmp_path),), timeout=100, stall_timeout=3.0)
    assert time.monotonic() - start < 60  # the stall check fired, long before the total timeout
    _assert_dead([int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))])
    assert _children() == set()


@pytest.mark.timeout(60)
def test_single_process_runs_in_process_with_rank_env() -> None:
    [(rank, world, var, pid)] = launch(workers.env_and_pid, 1, env={"LAUNCH_TEST_VAR": "one"})
    assert (rank, world, var, pid) == (0, 1, "one", os.getpid())
    assert "LAUNCH_TEST_VAR" not in os.environ and "RANK" not in os.environ


@pytest.mark.timeout(60)
def test_notebook_worker_is_refused_before_starting() -> None:
    def worker(rank: int, world_size: int) -> int:
        return rank

    worker.__module__ = "__main__"
    worker.__qualname__ = "worker"
    notebook_main = types.ModuleType("__main__")  # a notebook's __main__ has no __file__
    with pytest.raises(LaunchError) as info:
        check_worker_importable(worker, "spawn", main_module=notebook_main)
    msg = str(info.value)
    assert "Can't get attribute 'worker' on <module '__main__'>" in msg
    assert "importable module" in msg and "by reference" in msg

    script_main = types.ModuleType("__main__")
    script_main.__file__ = "/somewhere/train.py"  # python script.py: spawn re-imports it, so it works
    check_worker_importable(worker, "spawn", main_module=script_main)


@pytest.mark.timeout(60)
def test_nested_function_is_refused_without_starting_processes() -> None:
    def local_worker(rank: int, world_size: int) -> int:
        return rank

    before = _children()
    with pytest.raises(LaunchError, match="lambda or a nested function"):
        launch(local_worker, 2)
    with pytest.raises(LaunchError, match="lambda or a nested function"):
        launch(lambda rank, world: rank, 2)
    assert _children() == before


@pytest.mark.timeout(60)
def test_fork_is_refused_once_cuda_is_initialised() -> None:
    before = _children()
    with pytest.raises(LaunchError) as info:
        launch(workers.square_shard, 2, args=([1, 2],), start_method="fork", cuda_initialized=lambda: True)
    assert "Cannot re-initialize CUDA in forked subprocess" in str(info.value)
    assert "spawn" in str(info.value)
    assert _children() == before


@pytest.mark.timeout(60)
def test_fork_works_when_cuda_is_untouched() -> None:
    out = launch(
        workers.square_shard, 2, args=([1, 2, 3],), start_method="fork", cuda_initialized=lambda: False
    )
    assert out == [[1, 9], [4]]


@pytest.mark.timeout(60)
def test_child_output_is_relayed_once_whole_lines_and_crlf_or_bad_utf8_included(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.devices.launch import _OutputRelay

    logs = [tmp_path / "0.log", tmp_path / "1.log"]
    relay = _OutputRelay([str(p) for p in logs])
    relay.pump()  # nothing written yet
    logs[0].write_bytes(b"epoch 1\r\nbad \xff byte\npart")
    logs[1].write_bytes(b"rank one\n")
    relay.pump()
    with logs[0].open("ab") as handle:
        handle.write(b"ial line\n")
    relay.pump()
    relay.pump()  # nothing new: nothing repeated
    assert capsys.readouterr().out == "epoch 1\r\nbad \ufffd byte\n[rank 1] rank one\npartial line\n"


def test_under_torchrun_launch_refuses_to_spawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not running_under_torchrun({})
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert running_under_torchrun(env)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(LaunchError, match="torchrun"):
        launch(workers.square_shard, 2, args=([1],))


@pytest.mark.timeout(30)
def test_bad_arguments() -> None:
    with pytest.raises(LaunchError, match="nprocs"):
        launch(workers.square_shard, 0)
    with pytest.raises(LaunchError, match="start_method"):
        launch(workers.square_shard, 2, start_method="teleport")


# ------------------------------------------------------------------------------ notebooks via papermill


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c).strip()) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _kill_tree(root: psutil.Process) -> list[psutil.Process]:
    """Freeze the tree (so a Pool cannot respawn workers meanwhile), then SIGKILL all of it."""
    procs = [root]
    for _ in range(3):
        for p in list(procs):
            try:
                p.suspend()
                procs.extend(c for c in p.children(recursive=True) if c not in procs)
            except psutil.NoSuchProcess:
                pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return procs


def _run_papermill(
    nb_in: Path, tmp_path: Path, timeout: float, stop_when: str | None = None
) -> tuple[int | None, str]:
    """Run papermill with the venv's python in its own session; return (exit code or None, stdout+stderr).

    Returns early (and kills everything it started) once ``stop_when`` appears in the output.
    """
    log = tmp_path / f"{nb_in.stem}.log"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),
    }
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTEST_CURRENT_TEST"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "papermill", str(nb_in), str(tmp_path / f"{nb_in.stem}.out.ipynb")]
    cmd += ["--kernel", "python3", "--log-output", "--cwd", str(tmp_path)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    root = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    code = None
    try:
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None or (stop_when and stop_when in log.read_text(errors="replace")):
                break
            time.sleep(0.5)
    finally:
        procs = _kill_tree(root) if proc.poll() is None else [root]
        proc.wait(10)
        _, alive = psutil.wait_procs([p for p in procs if p.pid != proc.pid], timeout=10)
        assert not alive, f"left alive: {alive}"
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything else left in papermill's session
        except ProcessLookupError:
            pass
    return code, log.read_text(errors="replace")


def _cell_text(nb_path: Path) -> str:
    nb = nbformat.read(nb_path, as_version=4)
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(
                o.get("text", "") + o.get("evalue", "") + str(o.get("data", {}).get("text/plain", ""))
            )
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_seed_error_b_notebook_worker_with_spawn_pool(tmp_path: Path) -> None:
    """The naive way: the pool never returns, every child dies with the seed notes' AttributeError."""
    nb = _notebook(
        tmp_path / "naive_pool.ipynb",
        """
        import multiprocessing

        def worker(x):
            return x * x

        with multiprocessing.get_context("spawn").Pool(2) as pool:
            print(pool.map(worker, range(4)))
        """,
    )
    needle = "AttributeError: Can't get attribute 'worker' on <module '__main__'"
    code, output = _run_papermill(nb, tmp_path, timeout=90, stop_when=needle)
    assert needle in output, output[-3000:]
    assert code is None  # it did not finish: it was hanging and got killed


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_with_importable_worker_succeeds(tmp_path: Path) -> None:
    nb = _notebook(
        tmp_path / "with_launch.ipynb",
        """
        from pipeline.devices.launch import launch
        from launch_fixtures.workers import square_shard

        parts = launch(square_shard, 2, args=(list(range(4)),), timeout=60)
        print("RESULT", sorted(x for part in parts for x in part))
        """,
    )
    code, output = _run_papermill(nb, tmp_path, timeout=100)
    assert code == 0, output[-3000:]
    assert "RESULT [0, 1, 4, 9]" in _cell_text(tmp_path / "with_launch.out.ipynb")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_defined_worker_fails_fast_with_launch_error(tmp_path: Path) -> None:
    nb = _notebook(
        tmp_path / "notebook_worker.ipynb",
        """
        import time
        from pipeline.devices.launch import launch

        def worker(rank, world_size):
            return rank

        t0 = time.monotonic()
        try:
            launch(worker, 2, timeout=60)
        finally:
            print(f"launch returned after {time.monotonic() - t0:.2f} s")
        """,
    )
    code, output = _run_papermill(nb, tmp_path, timeout=100)
    assert code not in (None, 0)
    assert "LaunchError" in output
    assert "defined in the notebook / __main__" in output
    assert "Can't get attribute 'worker' on <module '__main__'>" in output
    text = _cell_text(tmp_path / "notebook_worker.out.ipynb")
    seconds = float(text.split("launch returned after ")[1].split(" s")[0])
    assert seconds < 1.0  # refused before any process started
