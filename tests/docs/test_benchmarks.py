"""The performance page's benchmark blocks, each line run as written with a size override appended (fewer
steps, rounds, images, or images a step: the figures are RESULTS.md's, what is checked here is that each
line runs and prints them).

The lines come from docs/performance.md (the blocks after its speed-benchmarks and time-benchmarks
marks), so the page and this test cannot drift apart. The peer line needs lightly beside
the venv (README says how to put it there; that needs PyPI), and is skipped
where it is not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from readme_blocks import commands

REPO = Path(__file__).resolve().parents[2]
# what each script must print: its figures, not just a clean exit; and the size override appended
EXPECTED = {
    "step_ab.py": ("--rounds 1 --steps 1 --set data.subset=1024 --set queue.size=256 --set optim.batch_size=64",
                   [r"variant\s+images/s", r"all\s+\d+\s+\d+\.\d\d"]),
    "roofline.py": ("--steps 2 --warmup 1 --preset smoke",
                    [r"dense matmul peak \(fp32", r"GFLOP per step, [\d.]+ steps/s .* of the fp32 matmul peak",
                     r"(?m)^(dense matmul peak \(bf16|bf16: not measured, this CPU has no native bf16)"]),
    "profile_step.py": ("--steps 1 --warmup 1", [r"steps, batch 256", r"Self CPU time total"]),
    "augment_vs_torchvision.py": ("--batches 2 --batch 64", [r"mocolab TwoViews \(batched\)\s+\d+ images/s",
                                                  r"per PIL image\s+\d+ images/s"]),
    "peer_lightly.py": ("--steps 2 --warmup 1", [r"lightly-style pipeline, with mocolab's allocator setting:\s+\d+",
                                                 r"mocolab step, fp32:\s+\d+"]),
}


def _lines() -> list[str]:
    return commands("speed-benchmarks")


def _script(line: str) -> str:
    """The script a benchmark line runs, ``benchmarks/<group>/<script>.py``, by its file name."""
    return re.search(r"benchmarks/\w+/(\w+\.py)", line).group(1)


def _run_and_check(script: str, command: str, patterns: list[str]) -> None:
    """A README benchmark line in bash from the repository root: it exits 0 and prints its figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != "RAY_ADDRESS"}
    out = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for pattern in patterns:
        assert re.search(pattern, out.stdout), f"{script}: no {pattern!r} in\n{out.stdout[-3000:]}"


def test_readme_block_names_every_benchmark_once():
    scripts = [_script(line) for line in _lines()]
    assert sorted(scripts) == sorted(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_readme_benchmark_line_runs_with_a_size_override(script):
    line = next(line for line in _lines() if _script(line) == script)
    if "lightly-pkgs" in line and not (Path("/tmp/lightly-pkgs") / "lightly").is_dir():
        pytest.skip("lightly is not installed beside the venv (README: pip install --no-deps --target ...)")
    extra, patterns = EXPECTED[script]
    _run_and_check(script, f"{line} {extra}", patterns)


# README's time-to-result block, each line with a size override appended (its figures are RESULTS.md's)
TIME_OVERRIDES = {
    "trial_overhead.py": ("--steps 2 --warmup 1 --set data.subset=1024 --set queue.size=256 --set eval.knn_bank=512 "
                          "--set eval.linear_train=512 --set eval.linear_steps=5", [r"not training: [\d.]+%"]),
    "feature_batch.py": ("--images 512 --repeats 1 --batches 256,64", [r"\n\s+256\s+[\d.]+\s+\d+\s+1.00x"]),
    "probe_layout.py": ("--seeds 1 --set data.subset=2048 --set queue.size=256 --set eval.linear_steps=5",
                        [r"init, seed 0\s+float32\s+[\d.]+\s+[\d.]+\s+[\d.]+",
                         r"raw pixels\s+float64(\s+[\d.+-]+x?){7}",
                         r"speed-up of the probe's fit, median over 4 fits: [\d.]+x"]),
    "eval_precision.py": ("--seeds 1 --steps 0 --set data.subset=2048 --set queue.size=256 "
                          "--set eval.linear_train=1024 --set eval.linear_steps=5",
                          [r"over 1 encoders: at most \d+ kNN and \d+ linear-probe test images"]),
    "sweep_overhead.py": ("--trials 1 --set data.subset=512 --set queue.size=256 --set optim.max_steps=2 "
                          "--set eval.knn_bank=512 "
                          "--set eval.knn_test=200 --set eval.linear_train=512 --set eval.linear_steps=5",
                          [r"loop of mocolab train\s+[\d.]+",
                           r"study, --workers-per-trial 0\s+[\d.]+\s+[\d.]+\s+[\d.]+x"]),
    "oversubscription.py": ("--steps 4 --repeats 1", [r"2 at once, default threads\s+[\d.]+ s\s+[\d.]+x",
                                                      r"each pinned to its cores\s+[\d.]+ s"]),
    "torchrun_vs_ray.py": ("--steps 2 --warmup 1 --report-every 1 --set data.subset=1024 --set queue.size=256 "
                           "--set optim.batch_size=64",
                           [r"torchrun \+ DDP\s+checkpoint every 1\s+[\d.]+\s+[\d.]+",
                            r"Ray Train\s+no checkpoint\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+%\s+[\d.]+"]),
    "online_probe_cost.py": ("--steps 1 --warmup 1 --set data.subset=1024 --set queue.size=256 "
                             "--set optim.batch_size=64",
                             [r"the online probe's hooks [\d.]+ ms = [\d.]+ % of it"]),
    "stream_decode.py": ("--images 128 --sizes 64 --repeats 1",
                         [r"stream as it is: reduced-scale, batched\s+\d+\s+\d+\s+[\d.]+x",
                          r"ImageFolder \+ DataLoader\(\d+ workers\)\s+\d+\s+\d+\s+[\d.]+x"]),
}


def test_readme_time_block_names_each_time_benchmark_once():
    scripts = [_script(line) for line in commands("time-benchmarks")]
    assert sorted(scripts) == sorted(TIME_OVERRIDES)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TIME_OVERRIDES))
def test_readme_time_benchmark_runs_with_a_size_override(script):
    line = next(line for line in commands("time-benchmarks") if _script(line) == script)
    extra, patterns = TIME_OVERRIDES[script]
    _run_and_check(script, f"{line} {extra}", patterns)


# The GPU script's figures (benchmarks/gpu/gpu.py), in the order it writes them, and the step's variants: the
# compile variant last, after every other figure, since its cold start is the longest
GPU_FIGURES = ["machine", "syncs", "step", "peak_memory", "decode_cpus", "views", "step", "step", "step", "step",
               "step", "step", "jpeg_decode", "final_eval", "step", "done"]
GPU_VARIANTS = ["base", "drift probes off", "online probe off", "plain BN", "channels_last", "fp32", "fp16", "compile"]


@pytest.mark.slow
def test_gpu_script_dry_run_writes_each_figure_as_it_comes(tmp_path):
    """``benchmarks/gpu/gpu_run.sh --dry-run`` as the GPU machine runs it (its ``$OUT``, the script refusing Ray and
    MLflow, which that machine lacks), at toy sizes on this CPU: each figure is a JSON line of figures.jsonl,
    measured (none skipped), and each line is in the file while the run goes on, so a run cut off still
    reports: the file, read as the run goes, holds one count of lines after another, not a few bursts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k != "RAY_ADDRESS"}
    env.update(PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    figures, log = tmp_path / "out" / "figures.jsonl", tmp_path / "log"
    seen: set[int] = set()  # the counts of whole lines the file held while the run was going
    with log.open("w") as sink:
        proc = subprocess.Popen(["bash", "benchmarks/gpu/gpu_run.sh", "--dry-run"], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                if figures.exists():
                    seen.add(figures.read_text().count("\n"))
                time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    lines = [json.loads(line) for line in figures.read_text().splitlines()]
    assert [line["figure"] for line in lines] == GPU_FIGURES, output[-4000:]
    assert len(seen - {0}) >= len(GPU_FIGURES) // 2, f"the lines came in bursts: {sorted(seen)}"
    assert [line["variant"] for line in lines if line["figure"] == "step"] == GPU_VARIANTS
    assert not [line for line in lines if "skipped" in line or "error" in line], output[-4000:]
    steps = [line for line in lines if line["figure"] == "step"]
    assert all(s["images_per_s"] > 0 and s["first_step_s"] > 0 for s in steps), steps
    assert {s["preset"] for s in steps} == {"imagenet-resnet50"}
    by_name = {line["figure"]: line for line in lines}
    assert by_name["syncs"]["steps"] >= 1 and isinstance(by_name["syncs"]["dispatch_counts"], dict)
    assert by_name["jpeg_decode"]["cpu_one_core_images_per_s"] > 0
    assert by_name["final_eval"]["knn_s"] > 0 and by_name["final_eval"]["probe_s"] > 0
    assert by_name["done"]["loaded"] == [] and by_name["done"]["failed"] == []  # neither Ray nor MLflow


def test_the_table_of_contents_lists_every_script_with_sections_results_md_has():
    """benchmarks/README.md, a table per group folder: each file of each folder once, and each RESULTS.md
    section it names a heading there, so a moved script or a renamed section cannot leave it stale."""
    bench = REPO / "benchmarks"
    listed, sections, group = [], [], None
    for line in (bench / "README.md").read_text().splitlines():
        if m := re.match(r"## (\w+)/", line):
            group = m.group(1)
        elif line.startswith("## "):
            group = None
        elif group and (m := re.match(r"\| `([\w.]+)` \|[^|]*\|(.*)\|$", line)):
            listed.append(f"{group}/{m.group(1)}")
            sections += re.findall(r'"([^"]+)"', m.group(2))
    on_disk = sorted(str(p.relative_to(bench)) for p in bench.glob("*/*") if p.suffix in (".py", ".sh"))
    assert sorted(listed) == on_disk
    headings = {line.lstrip("#").strip() for line in (bench / "RESULTS.md").read_text().splitlines()
                if line.startswith("#")}
    assert sections and not [s for s in sections if s not in headings]
