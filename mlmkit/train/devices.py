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
    """bf16 autocast only where the hardware has it: on a CPU without it a step is ~24x slower
    (docs/performance.md, "bf16 on a CPU without bf16 hardware")."""
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


TRIM_THRESHOLD = 2**31 - 1
"""Free memory at the top of the heap glibc keeps before giving it back (mallopt's largest, 2 GiB)."""


def keep_freed_memory() -> bool:
    """glibc only (elsewhere False, nothing changed): allocations come from the heap and freed memory
    stays there for the next one (mallopt: M_MMAP_MAX 0, M_TRIM_THRESHOLD TRIM_THRESHOLD). glibc maps
    every block over 32 MB on its own and unmaps it when it is freed; a training step at length 256
    frees and re-allocates dozens of such blocks (attention's (batch, heads, length, length) scores,
    probabilities and dropout masks, per layer), and the kernel faults in and zeroes their pages anew
    every step: a MiniLM-size step at length 256 ran 1.27x-1.53x faster without it on 2 cores
    (docs/performance.md, "Freed memory kept between training steps"). The process's peak memory stays
    near the step's (blocks whose sizes change from step to step can fragment the heap: SPLADE's
    vocabulary-wide blocks raised its peak 5-8%), and it is not given back between steps. The Trainer calls
    this on the CPU; it applies to the whole process. ``MLMKIT_KEEP_FREED_MEMORY=0`` in the
    environment turns it off (glibc's defaults stay)."""
    import ctypes
    import platform

    if os.environ.get("MLMKIT_KEEP_FREED_MEMORY", "1").strip() == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameter numbers
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


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


# ---- a model that runs its own backward passes under torchrun ---------------------------------------
def syncs_own_gradients(model: torch.nn.Module) -> bool:
    """Whether a model says (its ``syncs_own_gradients`` attribute, True) that its forward runs
    backward passes of its own (cached-mnrl's mini-batches, re-embedded inside the loss's backward).
    DistributedDataParallel's reducer allows one backward per forward, so the Trainer runs such a
    model without it and averages its gradients across the ranks itself, once a step
    (``average_gradients``)."""
    return bool(getattr(model, "syncs_own_gradients", False))


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Every rank starts from rank 0's parameters and buffers (what DistributedDataParallel does when
    it wraps a model)."""
    import torch.distributed as dist

    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0)


def average_gradients(model: torch.nn.Module) -> None:
    """The ranks' gradients averaged, in one all-reduce of one flat buffer: after it every rank holds
    DistributedDataParallel's gradients (a parameter no rank used keeps none). A parameter with no
    gradient on one rank counts as zeros there, so every rank reduces the same buffer."""
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    used = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                     + [used])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for p, u in zip(params, flat[-len(params):].tolist()):
        n = p.numel()
        if u > 0:
            p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n
