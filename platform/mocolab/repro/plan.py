"""Which studies the reproduction runs, with which settings: one list, read by the runner, the exporter and
the write-up, so that a study's command, its CSV file and its section in the document cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Study:
    """One study of the reproduction.

    ``name`` is the sweep's ``--name`` (so the same command resumes it), the baselines' set name and the CSV
    file's stem (``results/<name>.csv``).  ``by``: the config field its arms differ in.
    """

    name: str
    script: str
    preset: str
    by: str
    values: tuple[float, ...]
    seeds: int
    flag: str  # the script's flag that takes the values
    title: str
    extra: tuple[str, ...] = field(default=())  # more flags of the script; its --set values reach the baselines

    def overrides(self, precision: str) -> list[str]:
        """The ``--set`` values the trials and the baselines share: the pinned precision and ``extra``'s."""
        extra = [self.extra[i + 1] for i, a in enumerate(self.extra) if a == "--set"]
        return [f"run.precision={precision}", *extra]

    def command(self, precision: str, threads: int) -> list[str]:
        """The study's command line (relative to the repository), with precision and threads pinned."""
        sets = [a for kv in [*self.overrides(precision), f"run.threads={threads}"] for a in ("--set", kv)]
        rest = [a for i, a in enumerate(self.extra) if a != "--set" and (i == 0 or self.extra[i - 1] != "--set")]
        return ["experiments/" + self.script, "--preset", self.preset, self.flag,
                ",".join(f"{v:g}" for v in self.values), "--seeds", str(self.seeds), "--name", self.name,
                "--workers-per-trial", "0", *sets, *rest]


MOMENTA = (0.0, 0.9, 0.99, 0.999, 0.9999)

STUDIES: tuple[Study, ...] = (
    Study("momentum-cpu-quick", "momentum_ablation.py", "cpu-quick", "moco.m", MOMENTA, 5, "--momenta",
          "Momentum of the key encoder, cpu-quick budget"),
    Study("momentum-cpu-full", "momentum_ablation.py", "cpu-full", "moco.m", MOMENTA, 5, "--momenta",
          "Momentum of the key encoder, cpu-full budget"),
)


def study(name: str) -> Study:
    for s in STUDIES:
        if s.name == name:
            return s
    raise ValueError(f"--study: no study {name!r}; the reproduction has {[s.name for s in STUDIES]}")
