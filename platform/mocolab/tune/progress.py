"""What a person reads while a sweep runs: one line per trial per epoch, a progress line, the outcome.

Ray's own output (Tune's status tables, the workers' and actors' logs, Ray
Train's warnings) goes to Ray's log files; ``--verbose`` also prints it.
These lines come from Tune's callbacks in the driver, fed by the metrics
rank 0 reports each epoch, so they print once per epoch whatever the number
of workers, and nothing else has to reach the driver's console.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ray.tune import Callback

PROGRESS_EVERY_S = 60.0  # the sweep line: after each trial's end, and otherwise at most this often


def fmt_duration(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _pct(value) -> str:
    return "—" if value is None or value != value else f"{100 * float(value):.2f}%"


def trial_label(config: dict, trial_id: str) -> str:
    """The label a trial's lines carry: the grid's label, or what a search sampled (as the trial names it)."""
    if "trial" in config:
        return config["trial"]["label"]
    sampled = " ".join(f"{k.split('.')[-1]}={v}" for k, v in config.items() if "." in k)
    return f"{sampled} [{trial_id}]"


class SweepProgress(Callback):
    """Tune callback: prints the lines above through ``say``."""

    def __init__(self, total_trials: int, epochs: int, say: Callable[[str], None] = print,
                 every_s: float = PROGRESS_EVERY_S, on_change: Callable[[], None] | None = None,
                 change_every_s: float = 30.0) -> None:
        self.total, self.epochs, self.say, self.every_s = total_trials, max(1, epochs), say, every_s
        self.on_change, self.change_every_s, self.last_change = on_change, change_every_s, 0.0
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._pending = False
        self.t0 = time.monotonic()
        self.started: dict[str, float] = {}
        self.epoch: dict[str, int] = {}
        self.done: dict[str, str] = {}  # trial id -> outcome
        self.failed: dict[str, str] = {}  # trial id -> label, of the trials that failed
        self.last_line = 0.0

    def __getstate__(self) -> dict:
        """Tune saves its callbacks with the experiment's state: the printer and writer stay behind (a
        restored sweep makes new ones)."""
        state = self.__dict__.copy()
        state.update(_lock=None, _writer=None, on_change=None, say=print)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- Tune's hooks
    def on_trial_start(self, iteration, trials, trial, **info):
        self.started.setdefault(trial.trial_id, time.monotonic())

    def on_trial_result(self, iteration, trials, trial, result, **info):
        label = trial_label(trial.config, trial.trial_id)
        if "status" in result and result.get("final"):  # the trial function's own last report: its outcome
            took = fmt_duration(time.monotonic() - self.started.get(trial.trial_id, self.t0))
            if result["status"] == "finished":
                self.say(f"[{label}] finished in {took}: linear top-1 {_pct(result.get('linear_top1'))}, "
                         f"kNN top-1 {_pct(result.get('knn_top1'))}")
            else:
                self.say(f"[{label}] {result['status']} after {took} (final loss {result.get('final_loss')})")
            return
        if "loss" not in result or result.get("final"):  # checkpoint-only reports, the Train run's final report
            return
        epoch = int(result.get("epoch", 0))
        self.epoch[trial.trial_id] = epoch
        knn, val = result.get("knn_top1"), result.get("val_knn_top1")  # the monitor reads the validation split
        monitor = (f"val kNN {_pct(val)}" if val is not None else f"kNN {_pct(knn)}" if knn is not None
                   else "kNN (at the end)")  # when there is one
        self.say(f"[{label}] epoch {epoch}/{self.epochs}  loss {result['loss']:.4f}  {monitor}  "
                 f"{result.get('images_per_s', 0):,.0f} img/s")
        if time.monotonic() - self.last_line >= self.every_s:
            self.say(self.line(trials))
        self.changed()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.done[trial.trial_id] = "finished"
        self.say(self.line(trials))
        self.changed(force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.done[trial.trial_id] = "failed"
        self.failed[trial.trial_id] = label = trial_label(trial.config, trial.trial_id)
        where = getattr(trial, "path", None) or getattr(trial, "local_path", None) or "its Tune folder"
        self.say(f"[{label}] failed: Tune's error.txt is in {where}")
        self.say(self.line(trials))
        self.changed(force=True)

    def retrying(self, labels: set[str]) -> None:
        """Trials run again after their process was lost: their failed attempt no longer counts as done."""
        for trial_id in [t for t, label in self.failed.items() if label in labels and t in self.done]:
            del self.done[trial_id]

    def changed(self, force: bool = False) -> None:
        """The live report (``--watch``): rewritten when a trial ends, else at most every change_every_s.

        Written in a thread of its own, so Tune's event loop never waits on MLflow queries and plots; a
        rewrite asked for while one is under way is taken up when it ends (``pending``)."""
        if self.on_change is None or (not force and time.monotonic() - self.last_change < self.change_every_s):
            return
        self.last_change = time.monotonic()
        with self._lock:
            if self._writer is not None and self._writer.is_alive():
                self._pending = True
                return
            self._writer = threading.Thread(target=self._write, name="mocolab-live-report", daemon=True)
            self._writer.start()

    def _write(self) -> None:
        while True:
            try:
                self.on_change()
            except Exception as err:  # noqa: BLE001 - a report is not worth stopping a sweep for
                self.say(f"live report not written ({type(err).__name__}: {err})")
            with self._lock:
                if not self._pending:
                    return
                self._pending = False

    def close(self) -> None:
        """Wait for a live report being written: the study's final report must not race it."""
        writer = self._writer
        if writer is not None:
            writer.join()

    # ---------------------------------------------------------------- the sweep line
    def line(self, trials) -> str:
        self.last_line = time.monotonic()
        # Tune marks a trial TERMINATED only after its complete hook: count outcomes seen here instead
        finished = len(self.done)
        live = [t for t in trials if t.status == "RUNNING" and t.trial_id not in self.done]
        running = len(live)
        pending = max(0, self.total - finished - running)
        # a running trial past its last epoch still evaluates: it counts as nearly, not wholly, done
        done_part = finished + sum(min(0.95, self.epoch.get(t.trial_id, 0) / self.epochs) for t in live)
        elapsed = time.monotonic() - self.t0
        fraction = done_part / max(1, self.total)
        eta = ("done" if finished >= self.total else
               f"ETA {fmt_duration(elapsed * (1 - fraction) / fraction)}" if fraction > 0 else
               "ETA after the first epoch")
        return (f"sweep: {finished}/{self.total} trials done, {running} running, {pending} pending; "
                f"elapsed {fmt_duration(elapsed)}, {eta}")
