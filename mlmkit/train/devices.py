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
    if not native_bf16_cpu():
        raise ConfigError(
            "--bf16: this CPU has no native bf16 (torch falls back to a kernel ~24x slower than fp32)",
            "drop --bf16 on this machine, or train on a GPU",
        )


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX)."""
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
                or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


BF16_MIN_HIDDEN = 128
"""The smallest hidden size bf16 autocast was measured faster at (the tiny preset, H128: 1.16x at the
same loss); below it, where the casts weigh more against smaller products, training stays fp32 unless
--bf16 asks."""


def use_bf16(asked: bool | None, device: torch.device, model: torch.nn.Module | None = None) -> bool:
    """--bf16 / --no-bf16 as given; undecided (None): on where it was measured faster at the same
    held-out loss, a CPU with native bf16 and a model of hidden size BF16_MIN_HIDDEN or more
    (docs/performance.md, "GEMM ceilings and CPU kinds"; the Trainer says so when the run starts);
    off on a GPU unless asked, and on a CPU without native bf16."""
    if asked is not None:
        if asked:
            check_bf16(device)
        return asked
    hidden = next((h for m in (model.modules() if model is not None else ())
                   if isinstance(h := getattr(getattr(m, "config", None), "hidden_size", None), int)), 0)
    return device.type == "cpu" and hidden >= BF16_MIN_HIDDEN and native_bf16_cpu()


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
