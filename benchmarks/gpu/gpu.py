"""The first minutes on a GPU machine: the figures the CUDA path owes, in one run of at most 4 minutes on one
H100, with only what such a machine has (torch, torchvision, numpy, pyyaml, scipy; kornia carried as wheels).

    benchmarks/gpu/gpu_run.sh                                  # on the GPU machine (RESULTS.md's GPU section)
    .venv/bin/python benchmarks/gpu/gpu.py --dry-run --out /tmp/gpu   # every figure at toy sizes on this CPU

Each figure is one JSON line of ``<out>/figures.jsonl``, written and flushed as soon as it is measured (and
printed), so a run cut off by its time limit still reports what it got; compile runs last, its cold start
being the longest part.  A figure that cannot be measured there is a line with its reason (``skipped``); one
that fails, a line with its error, and the run goes on (its exit status is 1 at the end).  Ray and MLflow are
refused on import, as they are absent there: the step must run without them.

The figures, in order:

- ``machine``: the GPU, torch, kornia, torchvision.
- ``syncs``: imagenet-resnet50's step (bf16, its K = 65,536, batch 256 and 256 drift probes, 224 px
  generated images in memory) over ``--steps`` steps: the warnings of ``torch.cuda.set_sync_debug_mode
  ("warn")``, with where they came from, and a dispatch-mode count of host reads and blocking host-to-device
  copies (the CPU checks' count, tests/method/test_device_rules.py, on the real device).  The design is one
  read a step: the loss, the pretext accuracy and the divergence decision in one transfer.
- ``step``: one line per variant of that step, each against the same ``base``: drift probes 256/0, the
  online probe on/off, split/plain BN, channels_last, fp32/bf16/fp16, and (last) compile.  Images/s, ms a
  step, the first step's seconds (cuDNN's autotuning; compile's cold start) and the variant's peak memory.
- ``peak_memory``: ``torch.cuda.max_memory_allocated`` of the base step.
- ``decode_cpus``: the CPUs one GPU's stream needs at the base step's rate, at the stream's measured 469
  images per CPU-second (RESULTS.md, "Streaming decode"): docs/cluster.md's estimate, measured.
- ``views``: the augmentation alone (two views of a uint8 batch on the device).
- ``jpeg_decode``: ``torchvision.io.decode_jpeg(device="cuda")`` on a batch of generated 500x375 JPEGs,
  against torchvision's CPU decoder on one core.
- ``final_eval``: the preset's final kNN (bank ``eval.knn_bank``, k 200 and 20) and linear probe (L-BFGS,
  ``eval.linear_steps``) on random 2048-d features, 100,000 training and 50,000 test rows, through
  evaluation/knn.py and evaluation/probe.py as a run calls them (full fp32).
"""

from __future__ import annotations

import argparse
import gc
import importlib.abc
import json
import platform
import sys
import time
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

# Ray and MLflow are not on the GPU machine: refused here too, before anything imports, so a dry run on a
# machine that has them fails where the GPU machine would
ABSENT = ("ray", "mlflow")


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"benchmarks/gpu/gpu.py: {name} is not on the GPU machine, and the training "
                                      f"step must not need it", name=name)
        return None


sys.meta_path.insert(0, _Absent())
# the step benchmarks' shared helpers (held_batches), beside them in benchmarks/step
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "step"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from _steps import held_batches  # noqa: E402
from mocolab.config import build_config  # noqa: E402
from mocolab.data.sets import ImageDataset  # noqa: E402
from mocolab.evaluation.knn import knn_predict_ks  # noqa: E402
from mocolab.evaluation.probe import linear_probe  # noqa: E402
from mocolab.method.async_copy import to_device  # noqa: E402
from mocolab.training.trainer import Trainer  # noqa: E402

aten = torch.ops.aten
PRESET = "imagenet-resnet50"
# the stream's decode rate at 224 px, images per CPU-second (benchmarks/RESULTS.md, "Streaming decode")
STREAM_IMAGES_PER_CPU_S = 469
# A/B variants of the step: (name, overrides on top of the base)
VARIANTS = (
    ("base", {}),
    ("drift probes off", {"eval.drift_probes": 0}),
    ("online probe off", {"eval.online_probe": False}),
    ("plain BN", {"moco.bn": "plain"}),
    ("channels_last", {"run.channels_last": True}),
    ("fp32", {"run.precision": "fp32"}),
    ("fp16", {"run.precision": "fp16"}),
)
# last: the cold start is the longest; compile is refused beside the online probe (compare with its line)
COMPILE_VARIANT = ("compile", {"run.compile": True, "eval.online_probe": False})


class Figures:
    """``<out>/figures.jsonl``, one flushed line per figure; each also printed."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "figures.jsonl"
        self.file = self.path.open("w")
        self.t0 = time.perf_counter()

    def write(self, figure: str, **fields) -> None:
        line = json.dumps({"figure": figure, **fields, "at_s": round(time.perf_counter() - self.t0, 1)})
        self.file.write(line + "\n")
        self.file.flush()
        print(line, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


# --------------------------------------------------------------------------------------------- the step

def _on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "cpu"


def _host_to_device(src, dst_device, non_blocking) -> bool:
    """A copy from the host that blocks the host: not from pinned memory with ``non_blocking``."""
    return (isinstance(src, torch.Tensor) and src.device.type == "cpu" and dst_device is not None
            and torch.device(dst_device).type not in ("cpu", "meta") and not (non_blocking and src.is_pinned()))


class DeviceWaits(TorchDispatchMode):
    """Counts what makes the host wait for the device: reads of a device tensor's values (``item``,
    ``to_cpu``, ``nonzero``/``masked_select`` whose output size is data) and blocking host-to-device copies."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and _on_device(args[0]):
            self.counts["item"] += 1
        elif func is aten._to_copy.default:
            if _on_device(args[0]) and str(kwargs.get("device")) == "cpu":
                self.counts["to_cpu"] += 1
            elif _host_to_device(args[0], kwargs.get("device"), kwargs.get("non_blocking")):
                self.counts["blocking_h2d"] += 1
        elif func is aten.copy_.default:
            blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if _on_device(args[1]) and args[0].device.type == "cpu":
                self.counts["to_cpu"] += 1
            elif _host_to_device(args[1], args[0].device if _on_device(args[0]) else None, blocking):
                self.counts["blocking_h2d"] += 1
        elif func in (aten.nonzero.default, aten.masked_select.default) and _on_device(args[0]):
            self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **kwargs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _data(n: int, size: int, classes: int, seed: int) -> ImageDataset:
    """Random uint8 images: the step's cost does not depend on what the pixels show."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    return ImageDataset(images, torch.randint(0, classes, (n,), generator=g), classes, f"random-rgb{size}")


def _config(args, device: torch.device, overrides: dict):
    """The preset at its K, batch and probes (or the dry run's toy sizes), on data in memory, bf16 unless a
    variant says otherwise; no step of the benchmark records its per-step metrics (a run records 1 in ~2,000)."""
    return build_config(PRESET, {
        "data.name": "synthetic", "data.loader": "memory", "data.image_size": args.image_size,
        "data.synthetic_size": max(args.queue + 1, args.images), "optim.batch_size": args.batch,
        "queue.size": args.queue, "run.device": device.type, "run.precision": "bf16",
        "run.step_metrics_every": 10**9, "model.backbone": args.backbone,
        **({"model.width": TOY_CONVNET_WIDTH} if args.backbone == "convnet" else {}), **overrides})


def _release(device: torch.device) -> None:
    """The previous variant's memory back to the GPU, so each variant's peak is its own."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _trainer(args, device, overrides, train, test) -> tuple[Trainer, list]:
    _release(device)
    tr = Trainer(_config(args, device, overrides), train=train, test=test, device=device)
    tr.model.train()
    return tr, held_batches(tr, args.warmup + args.steps)


def _step(tr: Trainer, batch) -> None:
    images, index = batch
    tr.train_step(images, index, tr.schedule.momentum(tr.step))


def timed_variant(tr: Trainer, data: list, warmup: int, device: torch.device) -> dict:
    """Images/s over the batches after ``warmup``, the first step's seconds, and the peak memory."""
    with torch.random.fork_rng(devices=[]):
        t0 = time.perf_counter()
        _step(tr, data[0])
        _sync(device)
        first = time.perf_counter() - t0
        for batch in data[1:warmup]:
            _step(tr, batch)
        _sync(device)
        t0 = time.perf_counter()
        for batch in data[warmup:]:
            _step(tr, batch)
        _sync(device)
        seconds = time.perf_counter() - t0
    steps = len(data) - warmup
    return {"images_per_s": round(steps * tr.batch / seconds, 1), "ms_per_step": _three_figures(1000 * seconds / steps),
            "first_step_s": _three_figures(first), "peak_gib": _peak_gib(device)}


def _three_figures(value: float) -> float:
    """Three significant figures, so a toy-sized dry run's millisecond timings do not round to zero."""
    return float(f"{value:.3g}")


def _peak_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None


def count_syncs(tr: Trainer, data: list, device: torch.device) -> dict:
    """The waits of ``len(data)`` steps after one warm-up step: CUDA's sync warnings (where available) and the
    dispatch count, per step."""
    steps = len(data) - 1
    with torch.random.fork_rng(devices=[]):
        _step(tr, data[0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                with DeviceWaits() as waits:
                    for batch in data[1:]:
                        _step(tr, batch)
            finally:
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
    return {"steps": steps, "sync_debug_warnings": len(syncs) if device.type == "cuda" else None,
            "sync_debug_where": dict(where.most_common(10)), "dispatch_counts": dict(waits.counts),
            "per_step": round((len(syncs) if device.type == "cuda" else sum(waits.counts.values())) / steps, 2),
            "designed_per_step": 1}


# ------------------------------------------------------------------------------------------ the other parts

def time_views(tr: Trainer, data: list, device: torch.device, repeats: int) -> dict:
    """The augmentation alone on the device: uint8 batch in, two normalised views out."""
    batches = [to_device(images, device) for images, _ in data]
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        tr.augment(batches[0])
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            for x in batches:
                tr.augment(x)
        _sync(device)
        seconds = time.perf_counter() - t0
    n = repeats * sum(len(x) for x in batches)
    return {"images_per_s": round(n / seconds, 1), "ms_per_batch": round(1000 * seconds / (repeats * len(batches)), 2),
            "batch": tr.batch, "image_size": batches[0].shape[-1]}


def _jpegs(n: int, height: int, width: int, torchvision) -> list[torch.Tensor]:
    """Smooth colour fields with grain, quality 90: about 100 KiB a file, near ImageNet's 110 KB at 500x375."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(0, n, 32):
        k = min(32, n - i)
        base = torch.nn.functional.interpolate(torch.rand(k, 3, 12, 16, generator=g), size=(height, width),
                                               mode="bicubic", align_corners=False)
        x = (base * 255 + 22 * torch.randn(k, 3, height, width, generator=g)).clamp(0, 255).to(torch.uint8)
        out += [torchvision.io.encode_jpeg(im, quality=90) for im in x]
    return out


def time_jpeg_decode(device: torch.device, n: int, repeats: int) -> dict:
    try:
        import torchvision
        from torchvision.io import decode_jpeg
    except ImportError as e:
        return {"skipped": f"torchvision not importable: {e}"}
    files = _jpegs(n, 375, 500, torchvision)
    kib = sum(f.numel() for f in files) / len(files) / 1024
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        for f in files[: max(1, n // 4)]:
            decode_jpeg(f)
        cpu_rate = max(1, n // 4) / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    fig = {"images": n, "size": "500x375", "mean_kib": round(kib, 1), "torchvision": torchvision.__version__,
           "cpu_one_core_images_per_s": round(cpu_rate, 1)}
    if device.type != "cuda":
        return {**fig, "device_images_per_s": None, "note": "no GPU: the CPU decoder alone"}
    try:
        decode_jpeg(files, device=device)  # the first call sets nvJPEG up
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            decode_jpeg(files, device=device)
        _sync(device)
        rate = repeats * n / (time.perf_counter() - t0)
    except RuntimeError as e:
        return {**fig, "skipped": f"decode_jpeg(device='cuda'): {e}"}
    return {**fig, "device_images_per_s": round(rate, 1), "cpu_cores_it_stands_for": round(rate / cpu_rate, 1)}


def time_final_eval(tr_cfg, device: torch.device, rows: int, test_rows: int, dim: int, classes: int) -> dict:
    """The preset's final kNN and linear probe on random features (their cost does not depend on the values)."""
    e = tr_cfg.eval
    g = torch.Generator().manual_seed(0)
    f_train, f_test = torch.randn(rows, dim, generator=g), torch.randn(test_rows, dim, generator=g)
    l_train = torch.randint(0, classes, (rows,), generator=g)
    l_test = torch.randint(0, classes, (test_rows,), generator=g)
    bank = min(e.knn_bank or rows, rows)
    knn_test = min(e.knn_test or test_rows, test_rows)
    _sync(device)
    t0 = time.perf_counter()
    knn_predict_ks(f_train[:bank], l_train[:bank], f_test[:knn_test], classes, (e.knn_k, e.knn_k_small), e.knn_t,
                   device=device)
    _sync(device)
    knn_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    linear_probe(f_train, l_train, f_test, l_test, classes, weight_decay=e.linear_wd, steps=e.linear_steps,
                 device=device)
    _sync(device)
    probe_s = time.perf_counter() - t0
    return {"train_rows": rows, "test_rows": test_rows, "dim": dim, "classes": classes, "knn_bank": bank,
            "knn_test": knn_test, "knn_s": _three_figures(knn_s), "probe_steps": e.linear_steps,
            "probe_s": _three_figures(probe_s), "peak_gib": _peak_gib(device)}


# ------------------------------------------------------------------------------------------------- the run

TOY_CONVNET_WIDTH = 8  # the dry run's backbone: the step's code path at a fraction of ResNet-50's cost
TOY = {"backbone": "convnet", "image_size": 32, "batch": 16, "queue": 256, "images": 64, "steps": 1, "warmup": 1,
       "jpegs": 4, "eval_rows": 1000, "eval_test": 200, "eval_dim": 64, "eval_classes": 10}
FULL = {"backbone": "resnet50", "image_size": 224, "batch": 256, "queue": 65536, "images": 2048, "steps": 8,
        "warmup": 2, "jpegs": 256, "eval_rows": 100_000, "eval_test": 50_000, "eval_dim": 2048, "eval_classes": 1000}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for figures.jsonl ($OUT on the GPU machine)")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: every figure, none of them real")
    ap.add_argument("--device", default=None, help="cuda (default), or cpu (the default of --dry-run)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds after which the remaining figures are written as skipped, compile's included "
                         "(default 225; none in a dry run)")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile's backend for the compile variant (default torch's, inductor; dry run: "
                         "eager, since inductor's C++ build takes minutes on a small CPU)")
    for name, value in FULL.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=None,
                        help=f"default {value} (dry run: {TOY[name]})")
    args = ap.parse_args(argv)
    for name, value in (TOY if args.dry_run else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    if args.budget_s is None:
        args.budget_s = float("inf") if args.dry_run else 225.0
    if args.compile_backend is None and args.dry_run:
        args.compile_backend = "eager"
    return args


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError as e:
        return f"missing: {e}"


def _machine(device: torch.device) -> dict:
    fig = {"device": str(device), "torch": torch.__version__, "python": platform.python_version(),
           "kornia": _version("kornia"), "torchvision": _version("torchvision"), "cpus": torch.get_num_threads()}
    if device.type == "cuda":
        fig.update(name=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)),
                   memory_gib=round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1))
    else:
        fig.update(name=platform.processor() or platform.machine())
    return fig


def _shape(tr: Trainer, args: argparse.Namespace) -> dict:
    cfg = tr.cfg
    return {"preset": PRESET, "batch": tr.batch, "queue": cfg.queue.size, "drift_probes": cfg.eval.drift_probes,
            "image_size": args.image_size, "backbone": cfg.model.backbone}


@contextmanager
def compile_backend(backend: str | None) -> Iterator[None]:
    """``nn.Module.compile`` (what ``run.compile`` calls) with ``backend`` inside, torch's default where None."""
    if backend is None:
        yield
        return
    original = torch.nn.Module.compile

    def compile(self, *a, **kw):
        return original(self, *a, **{"backend": backend, **kw})

    torch.nn.Module.compile = compile
    try:
        yield
    finally:
        torch.nn.Module.compile = original


def run(args: argparse.Namespace, out: Figures) -> list[str]:
    """Every figure, in order; returns the figures that failed (each written with its error)."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no GPU here (torch.cuda.is_available() is False); "
                         "use --dry-run for the CPU dry run")
    out.write("machine", **_machine(device), dry_run=args.dry_run)
    train = _data(args.images, args.image_size, args.eval_classes, 0)
    test = _data(64, args.image_size, args.eval_classes, 1)
    failed: list[str] = []
    kept: dict = {}  # the base step's trainer and batches, which the views reuse

    def measured(figure: str, measure: Callable[[], dict], **fields) -> dict | None:
        """The figure's line: measured, skipped once the budget is spent, or its error (one figure's failure
        must not cost the others on a machine lent for minutes)."""
        if out.elapsed() > args.budget_s:
            out.write(figure, **fields, skipped=f"past --budget-s {args.budget_s:g}")
            return None
        try:
            result = measure()
        except Exception as e:
            failed.append(figure)
            out.write(figure, **fields, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            return None
        out.write(figure, **fields, **result)
        return result

    def step(overrides: dict, keep: bool = False, backend: str | None = None) -> dict:
        kept.clear()
        _release(device)
        with compile_backend(backend):
            tr, data = _trainer(args, device, overrides, train, test)
            result = {**_shape(tr, args), **timed_variant(tr, data, args.warmup, device)}
        if keep:
            kept.update(tr=tr, data=data)
        return result

    def syncs() -> dict:
        tr, data = _trainer(args, device, {}, train, test)
        return {**_shape(tr, args), "precision": "bf16", **count_syncs(tr, data[: 1 + args.steps], device)}

    measured("syncs", syncs)
    for name, overrides in VARIANTS:
        base = measured("step", lambda: step(overrides, keep=name == "base"), variant=name, overrides=overrides)
        if name != "base":
            continue
        why = "the base step was not measured"
        out.write("peak_memory", **({"variant": "base", "peak_gib": base["peak_gib"]} if base else {"skipped": why}))
        out.write("decode_cpus", **({"gpu_images_per_s": base["images_per_s"],
                                     "stream_images_per_cpu_s": STREAM_IMAGES_PER_CPU_S,
                                     "decode_cpus_per_gpu": round(base["images_per_s"] / STREAM_IMAGES_PER_CPU_S, 1)}
                                    if base else {"skipped": why}))
        if base:
            measured("views", lambda: time_views(kept["tr"], kept["data"], device, repeats=2))
        else:
            out.write("views", skipped=why)
    kept.clear()
    _release(device)
    measured("jpeg_decode", lambda: time_jpeg_decode(device, args.jpegs, repeats=5))
    _release(device)
    measured("final_eval", lambda: time_final_eval(_config(args, device, {}), device, args.eval_rows, args.eval_test,
                                                   args.eval_dim, args.eval_classes))
    name, overrides = COMPILE_VARIANT
    backend = args.compile_backend
    measured("step", lambda: step(overrides, backend=backend), variant=name, overrides=overrides,
             backend=backend or "inductor")
    out.write("done", seconds=round(out.elapsed(), 1), failed=failed, loaded=[m for m in ABSENT if m in sys.modules])
    return failed


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Figures(Path(args.out))
    print(f"figures: {out.path}", flush=True)
    if run(args, out):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
