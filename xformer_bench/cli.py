"""``xbench``: the Hydra entry point.  Thin: composes the config, hands it to :mod:`run`."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from xformer_bench.errors import XbenchError
    from xformer_bench.run import execute

    hydra_cfg = HydraConfig.get()
    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        record = execute(config, dict(hydra_cfg.runtime.choices), list(hydra_cfg.overrides.task),
                         Path(hydra_cfg.runtime.output_dir))
    except XbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return None  # recorded (if it ran at all); the sweep goes on
        sys.exit(2)
    _report(record)
    final = record.get("final") or {}
    return final.get("val/bpb")


def _report(record: dict) -> None:
    final, test = record.get("final") or {}, record.get("test") or {}
    print(
        f"[xbench] {record['run_id']}: final val bpb {final.get('val/bpb', float('nan')):.4f}"
        f" | test bpb {test.get('test/bpb', float('nan')):.4f}"
        f" | {record['steps_per_sec']:.2f} steps/s, {record['tokens_per_sec']:,.0f} tokens/s"
        f" | {record['params']:,} params\n[xbench] record: {record['record_path']}"
    )


def _quiet_libraries() -> None:
    """Keep the terminal for xbench's own lines and the progress bar."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric.utilities.rank_zero").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def main() -> None:
    _quiet_libraries()
    _main()


if __name__ == "__main__":
    main()
