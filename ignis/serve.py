"""`python -m ignis.serve +model=NAME [key=value ...]`: compose the config, load the model,
start the engine and serve the OpenAI-compatible API (see ignis.server.app).

    python -m ignis.serve +model=smollm2-135m server.port=8000 server.api_key=sk-local

One process (Sanic's `single_process=True`): the model and the KV cache live here.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ignis.config import IgnisConfig, register

log = logging.getLogger("ignis.serve")

register()


def run(cfg: IgnisConfig) -> int:
    import kernels
    from ignis.engine import AsyncEngine
    from ignis.model import load_model_from_config
    from ignis.server.app import create_app
    from ignis.server.websocket_protocol import IgnisWebSocketProtocol

    kernels.set_backend(cfg.engine.kernel_backend.value)
    loaded = load_model_from_config(cfg.model)
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


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(dcfg: DictConfig) -> int:
    logging.basicConfig(
        level=dcfg.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg: IgnisConfig = OmegaConf.to_object(dcfg)  # type: ignore[assignment]
    except MissingMandatoryValue as exc:
        # e.g. `+model=hf` without `model.path=DIR`: one line, not a traceback.
        print(f"ignis: missing config value {exc.full_key} (set it with {exc.full_key}=...)", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(cfg))


if __name__ == "__main__":
    main()
