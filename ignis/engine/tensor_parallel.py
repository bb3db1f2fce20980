"""Tensor parallelism: one engine, its model split over N ranks (ignis/model/sharding.py).

Rank 0 is the engine everyone knows: scheduler, block manager, prefix cache and sampler
live there, and its runner is a `TensorParallelRunner`.

Memory: every rank, rank 0 included, loads only its shard, by path (ignis.model.loader.
load_shard: the checkpoint is read on the CPU a tensor at a time and only the rank's slices
go to its device), so no device ever holds the full model; a LoadedModel's own weights, if
it has any, are not used (a TP server loads it without: load_model(weights=False)). The
start is two-phase (`start_tensor_parallel`, then `TensorParallelStart.runner`): every
rank loads, then rank 0 sizes the KV cache from its shard's KV heads and the device
memory left beside the shard, and every rank allocates that many blocks. Every step it broadcasts the
step's inputs once (ignis/engine/tp_group.py); the workers (ranks 1..N-1) run the same
sharded forward, join its all-reduces and send their slice of the logits to rank 0, then
wait for the next step. Rank 0 ends them with a shutdown message when the engine stops.

Launch, either way:
- `engine.tensor_parallel_size=N` alone: rank 0 (the server) spawns N-1 worker processes
  (torch.multiprocessing, spawn) and they meet over a tcp:// rendezvous on 127.0.0.1.
- under `torchrun` (several hosts): every process runs `ignis.serve` with the same
  arguments; RANK 0 serves, the others call `run_worker` (env:// rendezvous).

Failure: a worker that exits makes rank 0's next collective raise (gloo notices the closed
connection at once; the compute group's timeout is the backstop), and a watcher thread
notices a spawned worker's exit even while the engine idles. Either way the engine learns
through `FatalRunnerError` / `on_failure` and stops: open requests fail, /health says 503.
Workers exit when rank 0 goes (the control broadcast fails, and a spawned worker also
watches its parent's pid), so none outlives the server.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing.connection import wait
from typing import Any

import torch

import ignis_kernels
from ignis.engine.model_runner import FatalRunnerError, ModelRunner, StepResult
from ignis.engine.scheduler import ScheduledBatch
from ignis.engine.tp_group import RunnerSpec, ShardSpec, TPGroup
from ignis.model.sharding import plan_shard, shard_parameter_bytes
from ignis.model.transformer import Transformer

log = logging.getLogger(__name__)

# Seconds a stopping rank 0 waits for its workers to exit before killing them.
_JOIN_TIMEOUT = 15.0
_MIB = 1 << 20


class TensorParallelRunner(ModelRunner):
    """A ModelRunner over one rank's shard: rank 0 steps it like any runner (execute); a
    worker serves rank 0's steps (serve_steps)."""

    def __init__(self, shard: Transformer, group: TPGroup, vocab_size: int, **kwargs: Any) -> None:
        super().__init__(shard, **kwargs)
        self.group = group
        self.vocab_size = vocab_size
        self.workers: list[Any] = []  # rank 0, spawned workers: their processes
        self.on_failure: Callable[[str], None] | None = None
        self.failure: str | None = None
        self._closing = False

    # -- rank 0 -----------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepResult:
        host = self.host_inputs(batch)  # a bad request fails here, before any worker hears of it
        if self.failure is not None:
            raise FatalRunnerError(self.failure)
        try:
            self.group.send_step(host)
            return self.run(batch, self.device_batch(host))
        except Exception as exc:
            # Past the broadcast the ranks are in one collective sequence: any fault leaves
            # them out of step, so no request is retried alone.
            self._fail(f"tensor-parallel step failed: {exc!r}")
            raise FatalRunnerError(self.failure) from exc

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        full = self.group.gather_logits(super().compute_logits(hidden))
        if full is None:  # a worker: its slice went to rank 0
            return hidden.new_empty(0)
        return full[:, : self.vocab_size]

    def watch(self, processes: list[Any]) -> None:
        """Rank 0: report the first spawned worker that exits while the engine runs."""
        self.workers = processes
        if processes:
            threading.Thread(target=self._watch, name="ignis-tp-watch", daemon=True).start()

    def _watch(self) -> None:
        by_sentinel = {p.sentinel: p for p in self.workers}
        ready = wait(list(by_sentinel))
        if self._closing:
            return
        p = by_sentinel[ready[0]]
        p.join(1.0)
        self._fail(f"tensor-parallel worker {p.name} (pid {p.pid}) exited with code {p.exitcode}")

    def _fail(self, message: str) -> None:
        if self.failure is not None or self._closing:
            return
        self.failure = message
        log.error("%s: the engine stops", message)
        if self.on_failure is not None:
            self.on_failure(message)

    def close(self) -> None:
        """Rank 0: stop the workers (a shutdown message, then join; kill stragglers)."""
        if self._closing:
            return
        self._closing = True
        stopped = False
        if self.failure is None:
            try:
                self.group.send_shutdown()
                stopped = True
            except Exception as exc:  # noqa: BLE001 - a worker already gone: kill the rest
                log.warning("tensor parallel: shutdown message failed (%r)", exc)
        if stopped:
            _stop_processes(self.workers)
        else:  # the survivors are out of step with rank 0: nothing to wait for
            _stop_processes_now(self.workers)
        self.group.close()

    # -- workers ----------------------------------------------------------------------

    @torch.inference_mode()
    def serve_steps(self) -> None:
        """A worker's loop: rank 0's steps until its shutdown message."""
        while (host := self.group.recv_step()) is not None:
            self.forward(self.device_batch(host))


def _stop_processes(processes: list[Any]) -> None:
    deadline = time.monotonic() + _JOIN_TIMEOUT
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            log.warning("tensor parallel: worker %s did not exit; killing it", p.name)
            p.kill()
            p.join(5.0)


# -- launch -----------------------------------------------------------------------------


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when this process was launched by torchrun (or any env:// launcher)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_threads_per_rank(world: int, configured: int | None) -> int:
    """CPU ranks on one host share its cores: each gets its share unless engine.cpu_threads says."""
    if configured:
        return int(configured)
    return max(1, (os.cpu_count() or 1) // world)


class TensorParallelStart:
    """Rank 0 between loading and serving: every rank holds (or is loading) its shard, and
    no KV cache exists yet, so that the engine sizes it from the memory left beside the
    shard. `runner` then finishes the start; `abort` undoes it."""

    def __init__(self, group: TPGroup, shard: Transformer, processes: list[Any], launcher: str) -> None:
        self.group, self.shard, self.processes, self.launcher = group, shard, processes, launcher

    @property
    def ranks_on_host(self) -> int:
        """Ranks sharing this host's memory: every rank when spawned, torchrun's local count."""
        if self.launcher == "torchrun":
            return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return self.group.world

    def runner(self, spec: RunnerSpec) -> TensorParallelRunner:
        try:
            self.group.share(spec)
            runner = TensorParallelRunner(self.shard, self.group, self.shard.config.vocab_size, **asdict(spec))
            self.group.ready()
        except BaseException:
            self.abort()
            raise
        runner.watch(self.processes)
        log.info("tensor parallel: %d ranks ready (%s)", self.group.world, self.launcher)
        return runner

    def abort(self) -> None:
        _stop_processes_now(self.processes)
        self.group.close()


def start_tensor_parallel(loaded: Any, world: int, *, kernel_backend: str, cpu_threads: int) -> TensorParallelStart:
    """Rank 0: start (or join) the workers, and load rank 0's shard from the checkpoint at
    `loaded.path` while they load theirs; the weights of `loaded`, if any, are not used."""
    if loaded.kind == "scripted":
        raise ValueError("tensor parallelism needs a real checkpoint (not the scripted model)")
    plan_shard(loaded.config, 0, world)  # a config error before any process starts
    device: torch.device = loaded.device
    env = torchrun_env()
    processes: list[Any] = []
    if env is not None:
        if env != (0, world):
            raise ValueError(f"engine.tensor_parallel_size={world}, but torchrun started rank {env[0]} "
                             f"of {env[1]} here (rank 0 serves; WORLD_SIZE must equal the size)")
        init_method = "env://"
    else:
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        ctx = torch.multiprocessing.get_context("spawn")
        for rank in range(1, world):
            p = ctx.Process(target=_spawned_worker, args=(rank, world, device.type, init_method, os.getpid()),
                            name=f"ignis-tp{rank}", daemon=True)
            p.start()
            processes.append(p)
    group: TPGroup | None = None
    try:
        group = TPGroup(0, world, init_method, device)
        group.share(ShardSpec(model_path=loaded.path, model_kind=loaded.kind,
                              dtype=str(loaded.dtype).removeprefix("torch."), device_type=device.type,
                              kernel_backend=kernel_backend, cpu_threads=cpu_threads))
        shard = _load_shard(loaded.path, loaded.kind, 0, world, group, loaded.dtype, device)
        log.info("tensor parallel: the full model's weights would take %.1f MiB on one device",
                 shard_parameter_bytes(loaded.config, 0, 1, loaded.dtype) / _MIB)
    except BaseException:
        _stop_processes_now(processes)
        if group is not None:
            group.close()
        raise
    return TensorParallelStart(group, shard, processes, "torchrun" if env else "spawned workers")


def _load_shard(path: str, kind: str, rank: int, world: int, group: TPGroup, dtype: torch.dtype,
                device: torch.device) -> Transformer:
    from ignis.model.loader import load_shard

    start = time.perf_counter()
    shard = load_shard(path, kind, rank, world, group.all_reduce, dtype=dtype, device=device)
    log.info("tensor parallel: rank %d loaded its shard, %.1f MiB of weights on %s, in %.1f s", rank,
             sum(t.nbytes for t in shard.parameters()) / _MIB, device, time.perf_counter() - start)
    return shard


def _stop_processes_now(processes: list[Any]) -> None:
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join(5.0)


# -- workers ----------------------------------------------------------------------------


def run_worker(rank: int, world: int, device_type: str, init_method: str = "env://",
               local_rank: int | None = None) -> int:
    """A worker's life: join, load the shard of the checkpoint rank 0 names, build the
    runner rank 0 sizes, serve its steps. device_type is rank 0's ("cuda": this worker takes
    GPU local_rank, default its rank)."""
    # Ctrl-C reaches every process of the terminal's group: rank 0 drains and then stops
    # the workers itself, so they must not die first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", (rank if local_rank is None else local_rank) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    group = TPGroup(rank, world, init_method, device)
    try:
        spec: ShardSpec = group.share(None)
        ignis_kernels.set_backend(spec.kernel_backend)  # type: ignore[arg-type]
        torch.set_num_threads(spec.cpu_threads)
        shard = _load_shard(spec.model_path, spec.model_kind, rank, world, group, getattr(torch, spec.dtype), device)
        sizes: RunnerSpec = group.share(None)
        runner = TensorParallelRunner(shard, group, shard.config.vocab_size, **asdict(sizes))
        group.ready()
        runner.serve_steps()
        log.info("tensor parallel: rank %d stopping", rank)
        return 0
    finally:
        group.close()


def _spawned_worker(rank: int, world: int, device_type: str, init_method: str, parent: int) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s tp{rank} %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent,), name="ignis-tp-parent", daemon=True).start()
    try:
        code = run_worker(rank, world, device_type, init_method)
    except Exception:
        log.exception("tensor-parallel worker %d failed", rank)
        code = 1
    sys.exit(code)


def _exit_with_parent(parent: int) -> None:
    """A spawned worker whose server is gone (even while it still loads) exits."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


__all__ = ["TensorParallelRunner", "TensorParallelStart", "cpu_threads_per_rank", "run_worker", "start_tensor_parallel",
           "torchrun_env"]
