"""The process groups of a tensor-parallel engine and the messages between its ranks.

Two groups over the same ranks:
- control (gloo, host tensors, a long timeout): rank 0's start-up specs and each step's
  inputs. Workers wait here between steps, for as long as the server idles.
- compute (NCCL on CUDA, gloo on the CPU, a short timeout): the all-reduces of the
  row-parallel projections and the logits gather. A peer that dies closes its
  connections, and gloo raises at once ("Connection closed by peer"); the timeout is the
  backstop, so rank 0 never waits forever.

A step is two broadcasts on the control group, none per layer: a fixed header (kind and
sizes), then one int64 payload with every array the forward needs.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from ignis.engine.model_runner import HostStep

log = logging.getLogger(__name__)

# How long a collective of the forward may wait for a peer (first steps compile kernels).
COMPUTE_TIMEOUT = datetime.timedelta(seconds=300)
# Workers wait on the control group between steps: an idle server must not time them out.
CONTROL_TIMEOUT = datetime.timedelta(days=365)

_HEADER = 8
_STEP, _SHUTDOWN = 1, 2


@dataclass(frozen=True)
class ShardSpec:
    """What rank 0 tells every worker first: the checkpoint to load its shard from, and how.
    Every rank loads at once; the KV cache is sized only after (RunnerSpec), from the
    device memory left beside rank 0's shard."""

    model_path: str
    model_kind: str
    dtype: str  # "float32", "bfloat16", ...
    device_type: str  # "cpu" or "cuda"
    kernel_backend: str
    cpu_threads: int


@dataclass(frozen=True)
class RunnerSpec:
    """Then the engine's shape, so that every rank allocates the same KV cache and builds
    the same batches."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    pack_cpu_weights: bool
    native_decode: bool = True
    kv_cache_dtype: torch.dtype | None = None  # None: the model's dtype


Spec = TypeVar("Spec", ShardSpec, RunnerSpec)


class TPGroup:
    """This process's membership of the tensor-parallel group."""

    def __init__(self, rank: int, world: int, init_method: str, device: torch.device) -> None:
        self.rank, self.world, self.device = rank, world, device
        # The default group is the control group: gloo, so that host tensors travel on CUDA too.
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                timeout=CONTROL_TIMEOUT)
        self.control = dist.group.WORLD
        backend = "nccl" if device.type == "cuda" else "gloo"
        self.compute = dist.new_group(list(range(world)), timeout=COMPUTE_TIMEOUT, backend=backend)
        self._header = torch.zeros(_HEADER, dtype=torch.int64)
        log.info("tensor parallel: rank %d of %d joined (%s)", rank, world, backend)

    # -- start-up -------------------------------------------------------------------

    def share(self, spec: Spec | None) -> Spec:
        """Rank 0 sends its spec; every other rank receives it."""
        box: list[Any] = [spec]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def ready(self) -> None:
        """Every rank has its shard and KV cache (rank 0 raises here if a worker failed)."""
        dist.barrier(group=self.control)

    # -- the forward --------------------------------------------------------------------

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.compute)
        return t

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor | None:
        """Each rank's vocabulary slice [N, V/world] -> [N, padded V] on rank 0 (None elsewhere)."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(local, parts, dst=0, group=self.compute)
        return torch.cat(parts, dim=1) if parts is not None else None

    # -- steps --------------------------------------------------------------------------

    def send_step(self, host: HostStep) -> None:
        S, W = host.block_tables.shape
        has_idx = host.sample_idx is not None
        header = self._header
        header[:] = torch.tensor([_STEP, len(host.input_ids), S, W, len(host.sampling), int(has_idx), 0, 0])
        dist.broadcast(header, src=0, group=self.control)
        parts = [host.input_ids, host.positions, host.slot_mapping, host.block_tables.reshape(-1),
                 host.query_start_loc, host.query_lens, host.seq_lens]
        if has_idx:
            parts.append(host.sample_idx)  # type: ignore[arg-type]
        payload = torch.from_numpy(np.concatenate(parts).astype(np.int64, copy=False))
        dist.broadcast(payload, src=0, group=self.control)

    def recv_step(self) -> HostStep | None:
        """A worker's next step (None: shut down)."""
        header = self._header
        dist.broadcast(header, src=0, group=self.control)
        kind, T, S, W, n_sampling, has_idx = (int(v) for v in header[:6])
        if kind == _SHUTDOWN:
            return None
        size = 3 * T + S * W + (S + 1) + 2 * S + (n_sampling if has_idx else 0)
        payload = torch.empty(size, dtype=torch.int64)
        dist.broadcast(payload, src=0, group=self.control)
        flat = payload.numpy()
        cuts = np.cumsum([T, T, T, S * W, S + 1, S, S])
        ids, pos, slots, tables, qsl, q_lens, seq_lens, idx = np.split(flat, cuts)
        return HostStep(
            order=list(range(S)),  # rank 0's batch order: workers never map rows back
            input_ids=ids,
            positions=pos,
            slot_mapping=slots,
            block_tables=tables.astype(np.int32).reshape(S, W),
            query_start_loc=qsl,
            query_lens=q_lens,
            seq_lens=seq_lens,
            sampling=list(range(n_sampling)),
            sample_idx=idx if has_idx else None,
        )

    def send_shutdown(self) -> None:
        self._header[:] = 0
        self._header[0] = _SHUTDOWN
        dist.broadcast(self._header, src=0, group=self.control)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["COMPUTE_TIMEOUT", "CONTROL_TIMEOUT", "RunnerSpec", "ShardSpec", "TPGroup"]
