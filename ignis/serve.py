"""`python -m ignis.serve +model=NAME [key=value ...]`: compose the config, load the model,
start the engine and serve the OpenAI-compatible API (see ignis.server.app).

    python -m ignis.serve +model=smollm2-135m server.port=8000 server.api_key=sk-local
    python -m ignis.serve --server-port 8000 --server-socket-idle-close 60

`--server-KEY VALUE` is an alias of `server.KEY=VALUE` (ignis.cli_flags); with no model
named at all, the embedded model's group is used (`+model=smollm2-135m`).

One process (Sanic's `single_process=True`): the model and the KV cache live here. With
`engine.tensor_parallel_size=N` it starts N-1 worker processes for the model's other
shards (ignis/engine/tensor_parallel.py); under `torchrun` every rank runs this entry
point, rank 0 serves and the others become workers. Every rank, this one included, holds
only its shard of the weights.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from ignis.config import IgnisConfig, config_object, register

log = logging.getLogger("ignis.serve")

register()


def run(cfg: IgnisConfig) -> int:
    import ignis_kernels
    from ignis.engine import AsyncEngine
    from ignis.model import load_model_from_config
    from ignis.model.weight_plan import UnsupportedWeightForm
    from ignis.server.app import create_app
    from ignis.server.websocket_protocol import IgnisWebSocketProtocol

    ignis_kernels.set_backend(cfg.engine.kernel_backend.value)
    tp = cfg.engine.tensor_parallel_size
    if tp > 1:
        from ignis.engine.tensor_parallel import torchrun_env

        env = torchrun_env()
        if env is not None and env[0] != 0:  # a torchrun worker: rank 0 serves, this one computes
            return _torchrun_worker(cfg, *env)
        _dense_weights_for_tp(cfg)
    # Tensor parallelism: no full copy of the weights here; the engine loads rank 0's shard
    # from the checkpoint itself, as every worker loads its own.
    try:
        loaded = load_model_from_config(cfg.model, cfg.engine.max_num_seqs, weights=tp == 1)
    except UnsupportedWeightForm as exc:  # a form this CPU cannot run: one line, no traceback
        raise SystemExit(f"ignis.serve: {exc}") from None
    engine = AsyncEngine(loaded, cfg.engine)
    app = create_app(cfg, loaded, engine)
    log.info("serving %s on http://%s:%d (OpenAI base_url http://%s:%d/v1)", loaded.name, cfg.server.host,
             cfg.server.port, cfg.server.host, cfg.server.port)
    app.run(
        host=cfg.server.host,
        port=cfg.server.port,
        single_process=True,
        protocol=IgnisWebSocketProtocol,
        access_log=False,
        motd=False,
    )
    return 0


def _dense_weights_for_tp(cfg: IgnisConfig) -> None:
    """Tensor parallelism shards dense weights: auto picks float32, a packed form is an error."""
    from ignis.config import WeightForm

    if cfg.model.weight_form == WeightForm.auto:
        log.info("engine.tensor_parallel_size=%d: model.weight_form auto -> float32 (dense weights)",
                 cfg.engine.tensor_parallel_size)
        cfg.model.weight_form = WeightForm.float32
    elif cfg.model.weight_form != WeightForm.float32:
        raise SystemExit(f"ignis.serve: engine.tensor_parallel_size > 1 needs model.weight_form=float32 "
                         f"(or auto), not {cfg.model.weight_form.value}")


def _torchrun_worker(cfg: IgnisConfig, rank: int, world: int) -> int:
    import os

    from ignis.engine.tensor_parallel import run_worker
    from ignis.model.loader import resolve_device

    if world != cfg.engine.tensor_parallel_size:
        raise SystemExit(f"ignis.serve: torchrun started {world} processes, engine.tensor_parallel_size "
                         f"is {cfg.engine.tensor_parallel_size}")
    device = resolve_device(cfg.model.device)
    return run_worker(rank, world, device.type, "env://", int(os.environ.get("LOCAL_RANK", rank)))


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(dcfg: DictConfig) -> int:
    cfg: IgnisConfig = config_object(dcfg)
    sys.exit(run(cfg))


def cli() -> None:
    from ignis.cli_flags import FlagError, default_model, expand_server_flags

    try:
        sys.argv[1:] = default_model(expand_server_flags(sys.argv[1:]))
    except FlagError as exc:
        print(f"ignis.serve: {exc}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
