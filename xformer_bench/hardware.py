"""Whether this machine can run what ``trainer.*`` asks for: the accelerator, its number of
devices and the numeric precision -- checked before anything is built, so that a GPU asked for
where none is visible, or a precision Lightning does not know, is one ``error:`` line rather
than Lightning's exception once the run has started.  torch is imported only when a GPU is
asked for (``xbench --help`` stays fast)."""

from __future__ import annotations

from typing import Any

from xformer_bench.errors import ConfigError

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
"""``trainer.accelerator`` values Lightning accepts."""
GPU_ACCELERATORS = ("gpu", "cuda")
PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true",
              "transformer-engine", "transformer-engine-float16")
"""``trainer.precision`` values Lightning 2 accepts (plus its legacy aliases below)."""
LEGACY_PRECISIONS = (64, 32, 16, "64", "32", "16", "bf16")


def visible_gpus() -> int:
    """CUDA devices torch can see (0 without a GPU or a CUDA build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _trains_on_gpu(trainer: dict[str, Any]) -> bool:
    """Whether ``trainer`` (accelerator auto, gpu or cuda) trains on a visible GPU."""
    asks = trainer.get("accelerator", "auto") in ("auto", *GPU_ACCELERATORS)
    return asks and bool(visible_gpus())


def trained_on(trainer: dict[str, Any]) -> str:
    """The device a run with ``trainer`` trains on, as a record names it: the GPU's name
    (``NVIDIA H100 80GB HBM3``) where it runs on one, else ``cpu``."""
    if _trains_on_gpu(trainer):
        import torch

        return torch.cuda.get_device_name()
    return str(trainer.get("accelerator", "cpu")).replace("auto", "cpu")


def check_trainer_hardware(trainer: dict[str, Any]) -> None:
    """:class:`ConfigError` naming the fix when ``trainer`` asks for an accelerator, a number of
    devices or a precision this machine or Lightning cannot give."""
    accelerator, devices = trainer.get("accelerator", "auto"), trainer.get("devices", 1)
    if accelerator not in ACCELERATORS:
        raise ConfigError(f"trainer.accelerator={accelerator} is not an accelerator; choose one "
                          f"of: {', '.join(ACCELERATORS)}")
    if accelerator in GPU_ACCELERATORS:
        gpus = visible_gpus()
        if gpus == 0:
            raise ConfigError(f"trainer.accelerator={accelerator} but no GPU is visible (torch "
                              "sees no CUDA device): use trainer.accelerator=cpu, or auto to "
                              "take a GPU where there is one")
        if isinstance(devices, int) and devices > gpus:
            raise ConfigError(f"trainer.devices={devices} but {gpus} GPU(s) are visible: set "
                              f"trainer.devices={gpus} or fewer (or -1 for all)")
    strategy = str(trainer.get("strategy", "auto"))
    if strategy.startswith("fsdp") and (accelerator == "cpu" or
                                        (accelerator == "auto" and not visible_gpus())):
        raise ConfigError(f"trainer.strategy={strategy} (Lightning's FSDP) runs on GPUs only and "
                          "none is used here: use trainer=ddp on CPUs")
    precision = trainer.get("precision", "32-true")
    if precision not in ("auto", *PRECISIONS, *LEGACY_PRECISIONS):
        raise ConfigError(f"trainer.precision={precision} is not a Lightning precision; choose "
                          f"one of: auto, {', '.join(PRECISIONS)}")


def resolve_precision(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``trainer.precision=auto`` made concrete for this machine: bf16-mixed
    where training will run on a GPU that has bf16 (Ampere or later), else 32-true.  Resolved
    before the run id is computed, so a CPU run of ``auto`` is the run of ``32-true``."""
    trainer = config.get("trainer") or {}
    if trainer.get("precision") != "auto":
        return config
    precision = "32-true"
    if _trains_on_gpu(trainer):
        import torch

        precision = "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    return {**config, "trainer": {**trainer, "precision": precision}}
