"""A picture of a run's features: a 2-D map of a fixed, class-balanced set of test images, coloured by class.

A researcher reads an ablation faster from four pictures than from four numbers (solo-learn's ``auto_umap``).
The map is scikit-learn's t-SNE (PCA initialisation, a fixed seed), which needs nothing new on a worker; UMAP
(``method="umap"``) where ``umap-learn`` is installed, never as a dependency (it brings numba and LLVM).
Each run logs the features at its end (``FEATURES_FILE``, float16); ``mocolab report`` maps them (the first
seed of each arm), logs the map's coordinates and picture back to the run (``MAP_FILE``: a later report reads
them, not the features) and lays the arms' maps side by side (``map_panels``). t-SNE costs seconds of CPU per
run (benchmarks/RESULTS.md), which a worker would pay beside the other trials' training. Matplotlib, numpy and
scikit-learn only: no MLflow, no torch.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mocolab.analysis.probe_curves import arms  # noqa: E402

MAP_DIR = "feature_map"  # the run's artifacts: features.npz, then tsne.npz (coordinates, labels) and tsne.png
FEATURES_NAME, MAP_NAME, PICTURE_NAME = "features.npz", "tsne.npz", "tsne.png"
FEATURES_FILE, MAP_FILE = f"{MAP_DIR}/{FEATURES_NAME}", f"{MAP_DIR}/{MAP_NAME}"
PANELS_NAME = "feature_maps.png"  # a report's figure: one panel per arm, side by side
# Runs of one arm tried for its map: an arm's seeds share its config, so where its first finished runs logged no
# features the others did not either, and a report of a thousand such trials would ask the store for every
# one's files. And the arms drawn: beyond a few, panels are too small to compare (a random search has an arm
# per trial).
MAP_TRIES, MAP_PANELS = 2, 8
DEFAULT_IMAGES = 2000
MIN_IMAGES = 50  # below this a t-SNE map (perplexity up to 30) says nothing
CAPTION = ("Each panel is its own t-SNE map (PCA initialisation, seed 0) of the same class-balanced test images: "
           "distances and orientation do not compare across panels; how well the classes separate does.")
CLASS_NAMES = {"fashion-mnist": ("T-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
                                 "bag", "boot"),
               "cifar10": ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")}


def balanced_sample(batches: Iterable[tuple[Any, Any]], n: int, classes: int) -> tuple[Any, Any] | None:
    """The first ``n // classes`` images of each class in the split's own order, from (images, labels) batches
    (torch tensors or numpy arrays): the same images for every run of the same data, whatever it trained.
    Reading stops once every class is full. None when no image was taken."""
    per_class = max(1, n // max(classes, 1))
    counts = np.zeros(classes, dtype=np.int64)
    kept_images, kept_labels = [], []
    for images, labels in batches:
        lab = np.asarray(labels).astype(np.int64)
        take = []
        for i, c in enumerate(lab):
            if 0 <= c < classes and counts[c] < per_class:
                counts[c] += 1
                take.append(i)
        if take:
            index = np.asarray(take)
            kept_images.append(images[index])  # numpy indexes a torch tensor too
            kept_labels.append(lab[index])
        if (counts >= per_class).all():
            break
    if not kept_labels:
        return None
    if isinstance(kept_images[0], np.ndarray):
        return np.concatenate(kept_images), np.concatenate(kept_labels)
    import torch  # noqa: PLC0415 - torch tensors came in: torch is loaded already

    return torch.cat(kept_images), np.concatenate(kept_labels)


def embed_2d(features: np.ndarray, seed: int = 0, method: str = "tsne") -> np.ndarray:
    """N×D features -> N×2 float32 map. t-SNE: PCA initialisation, ``seed``, perplexity 30 (less for few
    points, as it must stay below N / 3). ``method="umap"`` needs umap-learn installed."""
    x = np.asarray(features, dtype=np.float32)
    if x.ndim != 2 or len(x) < MIN_IMAGES:
        raise ValueError(f"a feature map needs an N×D array of at least {MIN_IMAGES} rows, got shape {x.shape}")
    if method == "umap":
        try:
            import umap  # noqa: PLC0415 - optional, never a dependency
        except ImportError:
            raise ValueError("feature map method 'umap' needs umap-learn installed (pip install umap-learn); "
                             "allowed without it: tsne") from None
        return umap.UMAP(n_components=2, random_state=seed).fit_transform(x).astype(np.float32)
    if method != "tsne":
        raise ValueError(f"feature map method {method!r}: allowed tsne, umap")
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    perplexity = min(30.0, (len(x) - 1) / 3.0)
    # one thread: t-SNE's OpenMP threads on a busy machine (other trials, other work) wait on each other
    # (benchmarks/RESULTS.md, "The feature map's cost (t-SNE of 2,000 test features)")
    with threadpool_limits(1):
        return TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity,
                    n_jobs=1).fit_transform(x).astype(np.float32)


def save_map(path: Path | str, coords: np.ndarray, labels: np.ndarray, class_names: Sequence[str] = ()) -> Path:
    """The map's coordinates and labels as an .npz: what the report redraws side by side (a few tens of KB)."""
    path = Path(path)
    np.savez_compressed(path, coords=np.asarray(coords, np.float32), labels=np.asarray(labels, np.int16),
                        class_names=np.asarray(list(class_names), dtype=str))
    return path


def save_features(path: Path | str, features: np.ndarray, labels: np.ndarray,
                  class_names: Sequence[str] = ()) -> Path:
    """N×D features as float16 with their labels: 2,000 × 512 is 2 MB, t-SNE's input to float16 precision."""
    path = Path(path)
    np.savez_compressed(path, features=np.asarray(features, np.float16), labels=np.asarray(labels, np.int16),
                        class_names=np.asarray(list(class_names), dtype=str))
    return path


def load_features(path: Path | str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    with np.load(path, allow_pickle=False) as f:
        return f["features"].astype(np.float32), f["labels"].astype(np.int64), [str(c) for c in f["class_names"]]


def load_map(path: Path | str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    with np.load(path, allow_pickle=False) as f:
        return f["coords"], f["labels"].astype(np.int64), [str(c) for c in f["class_names"]]


def _scatter(ax, coords: np.ndarray, labels: np.ndarray, title: str) -> None:
    ax.scatter(coords[:, 0], coords[:, 1], c=labels % 10, cmap="tab10", vmin=0, vmax=9, s=2, linewidths=0,
               rasterized=True)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def _legend(fig, labels: np.ndarray, class_names: Sequence[str], bottom: float) -> None:
    classes = sorted({int(c) for c in labels})
    cmap = plt.get_cmap("tab10")
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=cmap(c % 10),
                          label=class_names[c] if c < len(class_names) else f"class {c}") for c in classes]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, bottom), ncol=min(5, len(handles)),
               fontsize=7, frameon=False)


def draw_map(coords: np.ndarray, labels: np.ndarray, path: Path | str, title: str,
             class_names: Sequence[str] = ()) -> Path:
    """One run's map, for its artifacts."""
    return map_panels([(title, coords, labels)], path, class_names, caption="")


def map_panels(panels: Sequence[tuple[str, np.ndarray, np.ndarray]], path: Path | str,
               class_names: Sequence[str] = (), caption: str = CAPTION) -> Path:
    """One panel per (title, coords, labels), side by side (at most four a row), one class legend, and
    ``caption`` under them."""
    if not panels:
        raise ValueError("map_panels: no panels to draw")

    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    text = textwrap.fill(caption, width=38 * cols) if caption else ""
    below = 0.45 + 0.14 * (text.count("\n") + 1 if text else 0)  # inches: the legend's two rows, the caption
    height = 3.2 * rows + below
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, height), dpi=90, squeeze=False)
    for ax, (title, coords, labels) in zip(axes.flat, panels):
        _scatter(ax, coords, labels, title)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    caption_h = (below - 0.45) / height
    _legend(fig, np.concatenate([p[2] for p in panels]), class_names, caption_h)
    if text:
        fig.text(0.5, 0.01, text, ha="center", va="bottom", fontsize=7)
    fig.tight_layout(rect=(0, below / height, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def run_map(store: Any, run_id: str, title: str, folder: Path) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """A run's map: its logged coordinates, else made from its logged features and logged back to it (with
    its picture); None where it logged neither."""

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per small file is noise
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return load_map(store.client.download_artifacts(run_id, MAP_FILE, str(folder)))
    except Exception:  # noqa: BLE001 - not mapped yet (or the store has no artifacts): from the features
        pass
    try:
        features, labels, names = load_features(store.client.download_artifacts(run_id, FEATURES_FILE,
                                                                                str(folder)))
    except Exception:  # noqa: BLE001 - a run that logged no features, or no labels
        return None
    coords = embed_2d(features)
    made = folder / "made"
    made.mkdir()
    paths = [save_map(made / MAP_NAME, coords, labels, names),
             draw_map(coords, labels, made / PICTURE_NAME, f"{title}: t-SNE of {len(coords)} test images", names)]
    try:
        for path in paths:
            store.client.log_artifact(run_id, str(path), MAP_DIR)
    except Exception:  # noqa: BLE001 - a read-only store: drawn, not kept
        pass
    return coords, labels, names


def feature_map_panels(store: Any, df: Any, varying: list[str], path: Path) -> tuple[str, Path] | None:
    """(caption, figure) of one map per arm side by side (the first ``MAP_PANELS`` arms): the first finished seed
    of each arm that logged features, of its first ``MAP_TRIES``. None where no run did. ``store``: a
    ``tracking.Store`` (this module speaks no MLflow)."""


    panels, names, tried = [], [], 0
    every = arms(df, varying)
    with tempfile.TemporaryDirectory() as tmp:
        for label, trials in every:
            if len(panels) == MAP_PANELS or tried >= MAP_PANELS * MAP_TRIES:
                break
            ended = [row for row in trials.itertuples() if row.status in ("finished", "diverged")]
            for row in ended[:MAP_TRIES]:
                tried += 1
                found = run_map(store, row.run_id, label, Path(tmp) / str(tried))
                if found is not None:
                    panels.append((label, found[0], found[1]))
                    names = found[2]
                    break
    if not panels:
        return None
    caption = (f"The features of each arm: t-SNE maps of the same {len(panels[0][2])} class-balanced test images "
               "(one seed per arm). Distances and orientation do not compare across panels; how well the classes "
               "separate does.")
    if len(every) > MAP_PANELS:
        caption += f" Drawn: {len(panels)} of the {len(every)} arms, the first in order (at most {MAP_PANELS})."
    return caption, map_panels(panels, path, names)
