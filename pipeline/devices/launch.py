"""Run ``worker(rank, world_size, *args)`` in N processes from a notebook or a script.

It avoids the two errors the seed notebooks hit on Kaggle's T4 x2:

(a) "RuntimeError: Cannot re-initialize CUDA in forked subprocess": a forked child inherits a CUDA context
    it cannot use. Processes are started with ``spawn`` (fresh interpreters), and ``fork`` is refused when
    the parent already initialised CUDA.
(b) "AttributeError: Can't get attribute 'worker' on <module '__main__'>": a spawned child unpickles the
    worker by module + name, and a notebook's ``__main__`` does not exist in the child. Workers must live in
    an importable module; notebook-defined workers are refused before anything starts.

Each child gets MASTER_ADDR / MASTER_PORT / RANK / LOCAL_RANK / WORLD_SIZE in its environment before the
worker (and so torch.distributed) is imported. Each rank's return value comes back through a pickle file.
If a rank fails, the others are killed and ``WorkerFailed`` names the rank and carries its traceback; on
timeout ``LaunchTimeout``. Children exit on their own if the parent dies, so nothing is left orphaned.

Under torchrun the processes already exist: ``launch`` refuses to spawn again; call the worker directly:
``worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), ...)`` (see ``running_under_torchrun``).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..core.progress import HEARTBEAT_VARIABLE as _HEARTBEAT  # workers touch it through progress.heartbeat()
from .probe import cuda_initialized as _cuda_initialized

_KILL_GRACE_SECONDS = 3.0
RELAY_INTERVAL = 0.5  # seconds between copies of the children's output to ours
_CHILD_MARKER = "PIPELINE_LAUNCH_CHILD"  # set in every child so a nested launch() is caught


class LaunchError(RuntimeError):
    """The launch was refused or did not complete."""


class WorkerFailed(LaunchError):
    """A rank raised or died; ``rank`` and the child's ``traceback`` text are attached."""

    def __init__(self, rank: int, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback_text


class LaunchTimeout(LaunchError):
    """Ranks were still running when the timeout expired (they have been killed)."""


# --------------------------------------------------------------------------------------------- checks


def running_under_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """True if this process is one rank of a torchrun (or similar) launch: RANK, WORLD_SIZE, LOCAL_RANK set.

    Then the caller runs ``worker(rank, world_size, ...)`` itself instead of calling ``launch``.
    """
    e = os.environ if env is None else env
    return all(e.get(k) not in (None, "") for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def check_worker_importable(
    worker: Callable[..., Any], start_method: str = "spawn", main_module: ModuleType | None = None
) -> None:
    """Raise LaunchError if spawned children could not import ``worker`` by module and name.

    A worker from ``__main__`` is accepted only when ``__main__`` is a file (``python script.py`` or
    ``python -m pkg.mod``: multiprocessing re-imports it in the child); a notebook or ``python -c`` has no
    file, so the child fails with "Can't get attribute 'worker' on <module '__main__'>".
    """
    if start_method == "fork":
        return  # fork copies the parent's memory: nothing is imported by name
    target = getattr(worker, "func", worker)  # functools.partial: the wrapped function is what is pickled
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", getattr(target, "__name__", repr(target)))
    main = sys.modules.get("__main__") if main_module is None else main_module
    if module == "__main__" and not getattr(main, "__file__", None):
        raise LaunchError(
            f"worker {qualname!r} is defined in the notebook / __main__, so spawned processes cannot find "
            f"it: they would die with \"AttributeError: Can't get attribute '{qualname}' on "
            "<module '__main__'>\". Move it into an importable module (e.g. a file under pipeline/) "
            "and pass it by reference: `from pipeline.<module> import worker; launch(worker, ...)`."
        )
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise LaunchError(
            f"worker {qualname!r} is a lambda or a nested function, which spawned processes cannot import; "
            "define it at module level in an importable module (e.g. under pipeline/), pass it by reference"
        )


class _SpawnProcessWithoutMain(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj):  # noqa: N802 - multiprocessing's name
        # While the child is being started, __main__ has no file or spec: nothing for spawn to re-import.
        main = sys.modules["__main__"]
        saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
        try:
            return multiprocessing.context.SpawnProcess._Popen(process_obj)
        finally:
            main.__dict__.update(saved)


class _SpawnWithoutMain(multiprocessing.context.SpawnContext):
    Process = _SpawnProcessWithoutMain


def helper_spawn_context() -> multiprocessing.context.BaseContext:
    """The start method for helper processes (DataLoader workers, the audio decoding pool): spawn -- safe after
    CUDA was initialised, in a notebook and in DDP ranks -- except that the children do not re-run the main
    script. They need nothing from it (their code lives in pipeline), and a script that calls train() at top
    level, as torchrun scripts usually do, would otherwise be run again in every worker and hang the run."""
    return _SpawnWithoutMain()


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- child


def _exit_when_orphaned(parent_pid: int) -> None:
    # If the launcher is killed (kernel restart, SIGKILL) nobody would reap us: leave instead of lingering.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(3)


def _child_main(rank: int, env_updates: dict[str, str], payload: bytes, result_path: str) -> None:
    """Entry point of every child: set env, then unpickle (= import) the worker, run it, store the outcome."""
    os.environ.update(env_updates)
    # A child's own stdout is the kernel's terminal, which a notebook never shows: write Python-level output
    # to a file the parent relays into its (notebook-captured) streams.
    sys.stdout = sys.stderr = open(f"{result_path}.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the child
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    ok = False
    try:
        worker, args = pickle.loads(payload)
        blob = pickle.dumps(("ok", worker(rank, int(env_updates["WORLD_SIZE"]), *args)))
        ok = True
    except Exception as exc:
        blob = pickle.dumps(("error", (f"{type(exc).__name__}: {exc}", traceback.format_exc())))
    tmp = f"{result_path}.tmp"
    Path(tmp).write_bytes(blob)
    os.replace(tmp, result_path)  # atomic: the parent never reads half a result
    if not ok:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


# --------------------------------------------------------------------------------------------- parent


@contextlib.contextmanager
def _patched_environ(updates: Mapping[str, str]) -> Iterator[None]:
    """Temporarily set env vars in this process (spawned children copy os.environ when they start)."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _descendants(pid: int) -> list[Any]:
    try:
        import psutil
    except ImportError:  # without psutil only the direct children are killed
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(procs: list[multiprocessing.process.BaseProcess]) -> None:
    """SIGTERM every live child (and its descendants), wait a moment, then SIGKILL what is left."""
    alive = [p for p in procs if p.exitcode is None]
    grandchildren = [d for p in alive for d in _descendants(p.pid)]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + _KILL_GRACE_SECONDS
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            p.kill()
            p.join(5.0)
    for d in grandchildren:
        with contextlib.suppress(Exception):
            d.kill()


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def launch(
    worker: Callable[..., Any],
    nprocs: int,
    args: tuple = (),
    *,
    start_method: str = "spawn",
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    stall_timeout: float | None = None,
    cuda_initialized: Callable[[], bool] | None = None,
) -> list[Any]:
    """Run ``worker(rank, nprocs, *args)`` for rank 0..nprocs-1 and return the results in rank order.

    ``env`` adds variables to every rank (e.g. CUDA_VISIBLE_DEVICES, PJRT_DEVICE). ``timeout`` (seconds)
    bounds the whole run; ``stall_timeout`` bounds the time between two ``heartbeat()`` calls of a rank (a
    hung GPU stops one rank's progress long before any total time limit would notice). ``nprocs == 1`` runs
    in this process. ``cuda_initialized`` replaces the ``torch.cuda.is_initialized`` check (tests).
    Raises LaunchError (refused), WorkerFailed, LaunchTimeout.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise LaunchError(f"nprocs must be an integer >= 1; got {nprocs!r}")
    if timeout is not None and timeout <= 0:
        raise LaunchError(f"timeout must be > 0 seconds or None; got {timeout!r}")
    if os.environ.get(_CHILD_MARKER) == "1":
        raise LaunchError(
            "launch() was called inside a launched worker process. If your script is the main module, spawn "
            're-imports it in every child: put the launch call under `if __name__ == "__main__":`'
        )
    if running_under_torchrun():
        raise LaunchError(
            "already running under torchrun (RANK, WORLD_SIZE, LOCAL_RANK are set): do not spawn again; "
            "call worker(int(os.environ['RANK']), int(os.environ['WORLD_SIZE']), ...) directly"
        )
    if start_method not in multiprocessing.get_all_start_methods():
        raise LaunchError(
            f"start_method={start_method!r} is not available here; "
            f"choose from {multiprocessing.get_all_start_methods()} (spawn is the default)"
        )
    if start_method == "fork" and (cuda_initialized or _cuda_initialized)():
        raise LaunchError(
            "start_method='fork' after CUDA was initialised in this process: forked children fail with "
            "\"RuntimeError: Cannot re-initialize CUDA in forked subprocess\". Use start_method='spawn' "
            "(the default) with a worker from an importable module."
        )
    if nprocs > 1:
        check_worker_importable(worker, start_method)

    port = str(find_free_port())
    base_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(nprocs), **(env or {})}
    if nprocs == 1:
        with _patched_environ({**base_env, "RANK": "0", "LOCAL_RANK": "0"}):
            try:
                return [worker(0, 1, *args)]
            except Exception as exc:
                summary = f"{type(exc).__name__}: {exc}"
                raise WorkerFailed(0, f"rank 0 failed: {summary}", traceback.format_exc()) from exc

    try:
        payload = pickle.dumps((worker, tuple(args)))
    except Exception as exc:
        raise LaunchError(f"worker or args cannot be pickled for the child processes: {exc}") from exc

    ctx = multiprocessing.get_context(start_method)
    procs: list[multiprocessing.process.BaseProcess] = []
    deadline = time.monotonic() + (math.inf if timeout is None else timeout)
    stall_limit = math.inf if stall_timeout is None else stall_timeout
    with tempfile.TemporaryDirectory(prefix="launch-") as tmp:
        paths = [os.path.join(tmp, f"rank{r}.pkl") for r in range(nprocs)]
        beats = [os.path.join(tmp, f"rank{r}.beat") for r in range(nprocs)]
        try:
            for rank in range(nprocs):
                Path(beats[rank]).touch()
                rank_env = {
                    **base_env,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    _CHILD_MARKER: "1",
                    _HEARTBEAT: beats[rank],
                }
                p = ctx.Process(
                    target=_child_main,
                    args=(rank, rank_env, payload, paths[rank]),
                    name=f"launch-rank{rank}",
                    daemon=False,  # daemonic processes may not have children (DataLoader workers)
                )
                with _patched_environ(rank_env):  # present from interpreter start, before any import
                    p.start()
                procs.append(p)

            results: dict[int, Any] = {}
            pending = {p.sentinel: rank for rank, p in enumerate(procs)}
            relay = _OutputRelay([f"{path}.log" for path in paths])
            while pending:
                wait_for = max(0.0, min(RELAY_INTERVAL, deadline - time.monotonic()))
                ready = multiprocessing.connection.wait(list(pending), timeout=wait_for)
                relay.pump()
                running, now = sorted(pending.values()), time.time()
                stalled = [r for r in running if now - os.path.getmtime(beats[r]) > stall_limit]
                if not ready and stalled:
                    raise LaunchTimeout(
                        f"rank(s) {stalled} made no progress for {stall_timeout} s (no heartbeat); "
                        "all ranks killed"
                    )
                if not ready and time.monotonic() >= deadline:
                    raise LaunchTimeout(
                        f"timeout after {timeout} s with rank(s) {running} still running; all ranks killed"
                    )
                for sentinel in ready:
                    rank = pending.pop(sentinel)
                    procs[rank].join()
                    relay.pump()
                    results[rank] = _result_or_raise(rank, procs[rank].exitcode, paths[rank])
            return [results[rank] for rank in range(nprocs)]
        finally:
            _kill_all(procs)


class _OutputRelay:
    """Copies what each child wrote to its log file to this process's stdout: rank 0 as is (it is the one
    that logs progress), other ranks prefixed with their rank."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.offsets = [0] * len(paths)

    def pump(self) -> None:
        for rank, path in enumerate(self.paths):
            try:  # bytes: the offset must count what is on disk, \r\n included
                with open(path, "rb") as handle:
                    handle.seek(self.offsets[rank])
                    data = handle.read()
            except FileNotFoundError:
                continue
            if not (complete := data.rfind(b"\n") + 1):  # relay whole lines only; the rest comes next time
                continue
            self.offsets[rank] += complete
            lines = data[:complete].decode("utf-8", errors="replace")
            if rank:
                lines = "".join(f"[rank {rank}] {line}" for line in lines.splitlines(keepends=True))
            sys.stdout.write(lines)
            sys.stdout.flush()


def _result_or_raise(rank: int, exitcode: int | None, path: str) -> Any:
    """The rank's return value from its result file, or WorkerFailed with its traceback or exit status."""
    if not os.path.exists(path):
        raise WorkerFailed(
            rank,
            f"rank {rank} {_describe_exit(exitcode)} without reporting a result (crashed before or while "
            "running the worker; see its output above)",
        )
    status, value = pickle.loads(Path(path).read_bytes())
    if status == "error":
        summary, tb = value
        raise WorkerFailed(
            rank, f"rank {rank} failed: {summary}\n\n--- traceback from rank {rank} ---\n{tb}", tb
        )
    if exitcode != 0:
        raise WorkerFailed(rank, f"rank {rank} returned a result but {_describe_exit(exitcode)}")
    return value
