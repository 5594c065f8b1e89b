"""The tracked tree travels: the GPU machines that checks run on take at most 64 MiB of working tree, and a
clone should stay cheap. 48 MiB leaves room to grow; the reproduction's store is committed packed
(results/runs.db.xz) and expanded into an ignored file."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT_MIB = 48


def _git(*args: str) -> str:
    res = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_tracked_tree_is_at_most_48_mib():
    files = [REPO / name for name in _git("ls-files", "-z").split("\0") if name]
    sizes = {str(p.relative_to(REPO)): p.stat().st_size for p in files if p.is_file()}  # deleted ones are not there
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= LIMIT_MIB * 2**20, f"tracked tree {total / 2**20:.1f} MiB > {LIMIT_MIB} MiB; largest: {largest}"


def test_the_expanded_store_and_its_state_are_ignored_and_its_packed_form_is_not():
    ignored = _git("check-ignore", "--no-index", "results/runs.db", "results/runs.db.unpacked",
                   "results/runs.db-journal").split()
    assert ignored == ["results/runs.db", "results/runs.db.unpacked", "results/runs.db-journal"]
    res = subprocess.run(["git", "check-ignore", "--no-index", "-q", "results/runs.db.xz"], cwd=REPO, timeout=60)
    assert res.returncode == 1  # 1: not ignored
