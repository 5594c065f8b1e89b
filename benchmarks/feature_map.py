"""What a run's feature map costs: t-SNE (analysis/feature_maps.embed_2d: PCA initialisation, seed 0, one thread)
of N class-balanced features of D dimensions, wall and CPU seconds, on features shaped like a trained encoder's
(ten well-separated classes with noise).

    nice -n 10 .venv/bin/python benchmarks/feature_map.py --images 2000 --dims 128,512 --repeats 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mocolab.analysis.feature_maps import embed_2d


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--dims", default="128,512")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    for d in (int(v) for v in args.dims.split(",")):
        y = np.repeat(np.arange(10), args.images // 10)
        x = rng.normal(size=(10, d))[y] * 3 + rng.normal(size=(len(y), d))
        for r in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            embed_2d(x)
            print(f"{len(y)} x {d}: {time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU "
                  f"(repeat {r + 1})", flush=True)


if __name__ == "__main__":
    main()
