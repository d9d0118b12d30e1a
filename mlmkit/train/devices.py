"""Devices: the device a run asks for (with a clear fallback), bf16 only where the hardware has it,
and torchrun's process group.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from mlmkit.errors import ConfigError

log = logging.getLogger("mlmkit")


# ---- devices and processes -----------------------------------------------------------------------
def resolve_device(name: str) -> torch.device:
    """``cuda`` when asked for and present; otherwise the CPU, saying so."""
    if name.startswith("cuda"):
        if torch.cuda.is_available():
            return torch.device(name)
        log.warning("--device cuda: no CUDA GPU is available to torch; running on the CPU")
        return torch.device("cpu")
    if name != "cpu":
        raise ConfigError(f"unknown device '{name}'", "use cpu or cuda")
    return torch.device("cpu")


def check_bf16(device: torch.device) -> None:
    """bf16 autocast only where the hardware has it: on a CPU without it a step is ~24x slower (docs/performance.md, "bf16 on a CPU without bf16 hardware")."""
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ConfigError("--bf16: this GPU has no bf16 support", "drop --bf16")
        return
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or getattr(
        torch.cpu, "_is_amx_tile_supported", lambda: False
    )()
    if not native:
        raise ConfigError(
            "--bf16: this CPU has no native bf16 (torch falls back to a kernel ~24x slower than fp32)",
            "drop --bf16 on this machine, or train on a GPU",
        )


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def init_distributed(device: torch.device) -> Dist:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
