"""Where a run computes and in which precision: ``run.device`` and ``run.precision``."""

from __future__ import annotations

import ctypes
import os
import platform
import sys

import torch

from mocolab.config.choices import DEVICES, PRECISIONS  # noqa: F401  (run.device, run.precision: config/choices.py)


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """None for float32; bfloat16 for 'bf16', or for 'auto' where the hardware computes it natively
    (AVX-512 BF16 / AMX on CPU, Ampere+ on GPU) - elsewhere emulated bf16 would be slower than fp32.
    float16 for 'fp16' only, as asked (the trainer scales its loss: ``GradScaler``): the fast half precision
    of GPUs without bf16 (V100, T4), where 'auto' stays float32 rather than change a run's numerics unasked."""
    if name not in PRECISIONS:
        raise ValueError(f"run.precision: unknown value {name!r}; choose one of {list(PRECISIONS)}")
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if name == "fp16":
        return torch.float16
    if device.type == "cuda":  # emulation counted out: V100 and T4 report bf16 and run it slower than fp32
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else None
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    return torch.bfloat16 if native else None


def configure_device(device: torch.device) -> None:
    """What a GPU run sets once for training: TF32 for float32 matrix products and convolutions (Ampere and
    later; fp32 runs keep their accuracy well inside what a probe tells), and cuDNN's autotuner, since a
    training step's shapes never change.  Nothing on the CPU.  Evaluation turns TF32 off again while it
    runs (``evaluation.precision.full_fp32``): the kNN and the probe score features in full float32, so
    the same features score the same on a GPU and a CPU."""
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high")  # cuBLAS TF32 on
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"run.device: unknown value {name!r}; choose one of {list(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("run.device: 'cuda' was asked for but no GPU is visible; use 'auto' or 'cpu'")
    return torch.device(name)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_ALLOCATOR_TUNED: bool | None = None


def keep_freed_memory() -> bool:
    """Let this process reuse the memory it frees instead of handing it back to the OS; True if it took effect.

    A training step allocates and frees the same tensors, megabytes each, every
    step.  glibc serves blocks above its mmap threshold with fresh mappings and
    may trim the heap's free top, so a process can fault its activations in
    page by page every step.  Whether it does depends on the heap's layout,
    which differs from one fresh process to the next (benchmarks/RESULTS.md,
    "Performance: the faster step").  Here blocks up to 32 MiB (glibc's ceiling) come
    from the heap and up to 1 GiB of free heap is kept, in every process.  The
    resident memory stays near its peak, which a training process reaches
    every step anyway.  Linux with glibc only; elsewhere nothing changes.
    ``run_training`` calls it, which in-process runs and every Ray Train worker
    go through.  Idempotent.
    """
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED is not None:
        return _ALLOCATOR_TUNED
    _ALLOCATOR_TUNED = False

    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no libc.so.6)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _ALLOCATOR_TUNED = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20)))
    return _ALLOCATOR_TUNED


def cpu_description() -> str:
    """The CPU as a time or accuracy figure must name it: model, cores this process may use, and the vector
    extensions torch's kernels pick from (they set a run's speed: benchmarks/RESULTS.md,
    "Time to a result, second part: the evaluation, and Ray Train against torchrun")."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine()):
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = [name for name, flag in (("AVX-512 BF16", "avx512_bf16"), ("AVX-512", "avx512f"), ("AVX2", "avx2"))
           if flag in flags]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores" + (f", {isa[0]}" if isa else "")


def provenance(device: torch.device, precision: torch.dtype | None) -> dict[str, str]:
    """What a result depends on beyond its config: torch, the device and the precision ``auto`` resolved to.
    Logged as run tags (``mocolab.*``) so that pooled results from other machines are told apart."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_description()
    return {"mocolab.torch": torch.__version__, "mocolab.device": where,
            "mocolab.precision": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(precision, "fp32")}


MAX_THREADS_ENV = "MOCOLAB_MAX_THREADS"


def usable_cores() -> int:
    """The cores this process's torch threads may use: its CPU affinity (taskset, a cpuset), capped by
    $MOCOLAB_MAX_THREADS where set (several jobs sharing a machine, a parallel test suite).  OpenMP threads
    that outnumber the cores spin against each other (benchmarks/RESULTS.md, "Two trainings on two cores:
    threads against cores")."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cap = os.environ.get(MAX_THREADS_ENV, "")
    if cap.isdigit() and int(cap) > 0:
        cores = min(cores, int(cap))
    return max(1, cores)
