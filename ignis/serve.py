"""`python -m ignis.serve +model=NAME [key=value ...]`: compose the config and run ignis.

Until the HTTP server lands (the server issue), this loads the model and answers the
configured `prompt` once, streaming nothing: a smoke test of the whole model runtime.
"""

from __future__ import annotations

import logging
import sys
import time

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ignis.config import IgnisConfig, register

log = logging.getLogger("ignis.serve")

register()


def run(cfg: IgnisConfig) -> int:
    import kernels
    from ignis.model import generate, load_model

    kernels.set_backend(cfg.engine.kernel_backend.value)
    loaded = load_model(
        cfg.model.path,
        kind=None if cfg.model.format.value == "auto" else cfg.model.format.value,
        dtype=cfg.model.dtype.value,
        device=cfg.model.device,
        name=cfg.model.name,
    )
    log.info("serving is not implemented yet: answering one prompt with %s", loaded.name)
    start = time.perf_counter()
    [answer] = generate.chat(
        loaded,
        [[{"role": "user", "content": cfg.prompt}]],
        max_new_tokens=cfg.max_new_tokens,
        block_size=cfg.engine.block_size,
    )
    elapsed = time.perf_counter() - start
    print(answer.text)
    log.info(
        "%d prompt tokens, %d generated in %.2f s", answer.prompt_tokens, answer.output_tokens, elapsed
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
