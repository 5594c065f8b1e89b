"""Methods from outside the package (method/plugins.py): found by entry point or by module:Class path, checked
against the Method protocol and their own fields at the door, trained by ``mocolab train`` in this process and
on Ray workers, swept by ``mocolab sweep``, logged and scored like the built-ins, and keyed on their own code.

The plugin is examples/plugins/mocolab-byol, installed by ``make setup-test`` (an editable install: its entry
point ``byol`` is in this environment's metadata, so Ray's workers see it as they see mocolab). Plugins that
break the rules are written into the test's folder and named by path. Training is a few steps of a 4-wide
convnet on synthetic 16-px images.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from conftest import mlflow_store
from mlflow.tracking import MlflowClient
from readme_blocks import commands

from mocolab.cli.commands import main
from mocolab.config import apply_overrides, build_config, config_file_overrides, to_yaml
from mocolab.training.code_fingerprint import CodeFingerprint, _closure, _fingerprint, code_fingerprint
from mocolab.config.schema import Config
from mocolab.method import plugins
from mocolab.method.plugins import installed, method_modules

REPO = Path(__file__).resolve().parents[2]
BYOL_FILE = REPO / "examples" / "plugins" / "mocolab-byol" / "mocolab_byol.py"
TINY = {"data.name": "synthetic", "data.synthetic_size": 256, "data.image_size": 16, "model.width": 4,
        "optim.batch_size": 32, "optim.max_steps": 3, "eval.knn_bank": 256, "eval.knn_test": 64,
        "eval.linear_train": 256, "eval.linear_test": 64, "eval.linear_steps": 3, "eval.drift_probes": 0,
        "run.log_models": False, "run.system_metrics_s": 0}
TINY_ARGS = [a for k, v in TINY.items() for a in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]


@pytest.fixture(autouse=True)
def _fresh_plugins():
    """Each test loads its plugins afresh (a command is a new process): the loader's and the fingerprint's
    caches emptied, and the modules the test wrote forgotten."""
    before = set(sys.modules)
    yield
    plugins.load.cache_clear()
    _fingerprint.cache_clear()
    for name in set(sys.modules) - before:
        if name.startswith("tplug_"):
            del sys.modules[name]


def _quickstart() -> dict[str, list[list[str]]]:
    """docs/methods.md's block for plugins, its lines split into the install, the trainings and the sweeps."""
    out: dict[str, list[list[str]]] = {"install": [], "train": [], "sweep": []}
    for line in commands("plugin-quickstart"):
        argv = shlex.split(line)
        if argv[0].endswith("/mocolab"):
            out[argv[1]].append(argv[1:])
        else:
            out["install"].append(argv)
    return out


def _module(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def _cfg(**over):
    return build_config("smoke", {**TINY, **over})


def _refused(over: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        _cfg(**over)
    assert message in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ found and checked
def test_an_installed_plugin_is_found_by_its_entry_point_and_names_its_runs():
    # installed as the docs and make setup-test install it
    [install] = _quickstart()["install"]
    assert install == [".venv/bin/python", "-m", "pip", "install", "-q", "-e", "examples/plugins/mocolab-byol"]
    assert "$(PY) -m pip install -q -e examples/plugins/mocolab-byol" in (REPO / "Makefile").read_text()
    [ep] = installed()["byol"]
    assert ep.value == "mocolab_byol:BYOL"
    plugin = plugins.load("byol")
    assert plugin.target.__name__ == "BYOL" and "entry point byol = mocolab_byol:BYOL" in plugin.origin
    cfg = _cfg(**{"method.name": "byol"})
    # validated, the config holds every field the plugin declares, typed, at its defaults
    assert cfg.method.options == {"byol.symmetric": True, "byol.predictor": True}
    flat = cfg.flatten()
    assert flat["method.name"] == "byol" and flat["method.byol.symmetric"] is True and "method.options" not in flat
    assert cfg.run_name.startswith("smoke-byol-m0.99-s0-")
    assert not cfg.uses_queue  # queue.size is MoCo's: a plugin's method is not held to its bounds
    # the built-ins' configs name their runs as before the field existed
    assert build_config("smoke").flatten()["method.name"] == "" and "method" not in build_config("smoke").run_name


def test_an_unknown_or_malformed_method_name_is_refused_with_what_there_is():
    _refused({"method.name": "byl"}, "method.name: 'byl' is no installed plugin (entry point group "
                                     "mocolab.methods); installed: ['byol']; closest: ['byol']")
    _refused({"method.name": "in_batch"}, "'in_batch' is a built-in method: choose it with moco.negatives=in_batch")
    _refused({"method.name": "v3"}, "choose it with moco.version=v3")
    _refused({"method.name": "my byol"}, "method.name: 'my byol' is neither a plugin's name")
    _refused({"method.name": "tplug_nowhere:BYOL"}, "method.name: cannot import 'tplug_nowhere' (of "
                                                   "'tplug_nowhere:BYOL')")
    _refused({"method.name": "mocolab_byol:Byol"}, "has no 'Byol'; its classes: ['BYOL', 'Options']")
    _refused({"method.name": "byol", "moco.negatives": "memory_bank"},
             "moco.negatives: 'memory_bank' picks a built-in method, and method.name=byol picks the method")


def test_a_plugin_s_own_fields_are_namespaced_typed_and_refused_when_mistyped(tmp_path):
    _refused({"method.name": "byol", "method.byol.symetric": False},
             "unknown config key 'method.byol.symetric'; the plugin 'byol' has ['method.byol.symmetric', "
             "'method.byol.predictor'] (did you mean method.byol.symmetric?)")
    _refused({"method.name": "byol", "method.byol.symmetric": "maybe"}, "method.byol.symmetric: 'maybe' is not a bool")
    _refused({"method.byol.symmetric": False}, "method.byol.symmetric: a field of the plugin 'byol', and "
                                               "method.name is empty")
    _refused({"method.name": "byol", "method.simclr.tau": 0.1}, "method.simclr.tau: a field of the plugin "
                                                                "'simclr', and method.name is 'byol'")
    _refused({"method.name": "byol", "method.symmetric": False}, "unknown config key 'method.symmetric'")
    # the plugin's own check of the rest of the config
    _refused({"method.name": "byol", "moco.bn": "shuffle", "run.num_workers": 2, "optim.batch_size": 32},
             "moco.bn: 'shuffle' shuffles MoCo's key batch")
    one_way = _cfg(**{"method.name": "byol", "method.byol.symmetric": "false"})
    assert one_way.method.options["byol.symmetric"] is False
    # a default set explicitly and a string for a bool are the same config: the same run
    assert _cfg(**{"method.name": "byol", "method.byol.symmetric": False}).run_name == one_way.run_name
    assert _cfg(**{"method.name": "byol", "method.byol.predictor": True}).run_name == _cfg(
        **{"method.name": "byol"}).run_name
    # --print-config's YAML reads back as --config; the flattened form (MLflow, a manifest) rebuilds it
    mine = tmp_path / "mine.yaml"
    mine.write_text(to_yaml(one_way))
    again = build_config("cpu-quick", config_file_overrides(mine))
    assert again.flatten() == one_way.flatten()
    assert apply_overrides(Config(), one_way.flatten()).flatten() == one_way.flatten()


BROKEN = '''
from torch import nn


class Half(nn.Module):
    """A forward and little else."""
    negatives = "none"

    def forward(self, x1, x2, index=None):
        return None

    def checkpoint_parts(self):
        return {}


class NotAModule:
    negatives = "none"
    from_config = forward = checkpoint_parts = describe = uniform_loss = classmethod(lambda cls, *a: None)
'''

OPTIONS = '''
from dataclasses import dataclass, field
from mocolab_byol import BYOL


class Wide(BYOL):
    @dataclass
    class Options:
        hidden: int = 64
        symmetric: bool = True
        predictor: bool = True

        def __post_init__(self):
            if self.hidden < 1:
                raise ValueError(f"hidden: {self.hidden} is out of range; allowed >= 1")


class NoDefault(BYOL):
    @dataclass
    class Options:
        hidden: int


class ListField(BYOL):
    @dataclass
    class Options:
        sizes: list = field(default_factory=list)


def build(cfg, parts, options):
    """A builder: no class of its own, no fields."""
    return BYOL.from_config(cfg, parts, BYOL.Options())


def build_nothing(cfg, parts, options):
    return object()
'''


def test_a_plugin_is_checked_against_the_method_protocol_and_its_fields_when_loaded(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _module(tmp_path, "tplug_broken", BROKEN)
    _module(tmp_path, "tplug_options", OPTIONS)
    _refused({"method.name": "tplug_broken:Half"}, "Half lacks from_config, describe, uniform_loss of the Method "
                                                   "protocol")
    _refused({"method.name": "tplug_broken:NotAModule"}, "lacks nn.Module as a base class")
    _refused({"method.name": "tplug_options:NoDefault"}, "NoDefault.Options.hidden has no default")
    _refused({"method.name": "tplug_options:ListField"}, "ListField.Options.sizes is of type <class 'list'>")
    # the plugin's range check names its field; the namespace of a path is the name after its colon
    _refused({"method.name": "tplug_options:Wide", "method.Wide.hidden": 0},
             "method.Wide.hidden: 0 is out of range; allowed >= 1")
    assert _cfg(**{"method.name": "tplug_options:Wide", "method.Wide.hidden": "8"}).method.options["Wide.hidden"] == 8
    _refused({"method.name": "tplug_options:build", "method.build.x": 1}, "declares no fields of its own")

    # a builder is checked on what it builds, the protocol's every member named
    import torch

    from mocolab.method.protocol import MethodParts
    from mocolab.method.registry import build_method
    from mocolab.training.build import encoder_factory

    def built(name: str):
        cfg = _cfg(**{"method.name": name})
        return build_method(cfg, MethodParts(encoder_factory(cfg, 1, 16, torch.device("cpu")), 256, 32))

    assert type(built("tplug_options:build")).__name__ == "BYOL"
    with pytest.raises(ValueError, match="built an object of type object that lacks nn.Module .*, "
                                         "checkpoint_parts, describe, dictionary, encoder_q, key_encoder, "
                                         "negatives, shuffle_generator, step, uniform_loss, writer of the Method"):
        built("tplug_options:build_nothing")


def test_a_module_class_path_is_also_found_in_the_current_folder(tmp_path, monkeypatch):
    """As ``python -m`` finds it; the ``mocolab`` command's own path holds no current folder."""
    shutil.copy(BYOL_FILE, tmp_path / "tplug_here.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    cfg = _cfg(**{"method.name": "tplug_here:BYOL", "method.BYOL.symmetric": False})
    assert cfg.run_name.startswith("smoke-BYOL-") and cfg.method.options["BYOL.symmetric"] is False
    assert plugins.load("tplug_here:BYOL").ship == (str(tmp_path),)  # what Ray's workers get on their path
    assert plugins.load("byol").ship == ()  # installed: every worker of the environment has it


def test_a_bad_plugin_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for bad in ("method.byol.symetric=false", "method.name=byl"):
        assert main(["train", "--preset", "smoke", "--set", "method.name=byol", "--set", bad]) == 2
        assert "mocolab: error: " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no MLflow store, no run folder


# ------------------------------------------------------------------------------------------ its code
PACKAGE = {"__init__.py": "from .method import Thing\n",
           "method.py": "from . import helper\nfrom mocolab.method.protocol import MethodOutput\n\n\nclass Thing:\n"
                        "    pass\n",
           "helper.py": "X = 1\n", "unused.py": "Y = 2\n"}


def test_a_plugin_s_modules_join_the_code_fingerprint(tmp_path, monkeypatch):
    cfg = _cfg(**{"method.name": "byol"})
    assert method_modules(cfg) == ("mocolab_byol",) and method_modules(build_config("smoke")) == ()
    base, with_byol = code_fingerprint(), code_fingerprint(extra=method_modules(cfg))
    assert set(with_byol.modules) - set(base.modules) == {"mocolab_byol"} and with_byol.digest != base.digest
    # a plugin package: the modules it imports, relative imports too, and not the ones it does not
    for name, text in PACKAGE.items():
        (tmp_path / "tplug_pkg").mkdir(exist_ok=True)
        (tmp_path / "tplug_pkg" / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = set(_closure(["tplug_pkg"]))
    assert {"tplug_pkg", "tplug_pkg.method", "tplug_pkg.helper", "mocolab.method.protocol"} <= found
    assert "tplug_pkg.unused" not in found


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    # the next command is a new process: it imports the plugin again and fingerprints the code again
    plugins.load.cache_clear()
    _fingerprint.cache_clear()
    sys.modules.pop(path.stem, None)


@pytest.mark.slow
def test_a_changed_plugin_trains_a_new_run_and_a_reworded_one_reports_the_old(tmp_path, monkeypatch):
    from mocolab.training import fit

    plugin = tmp_path / "plugin" / "tplug_story.py"
    plugin.parent.mkdir()
    shutil.copy(BYOL_FILE, plugin)
    monkeypatch.syspath_prepend(str(plugin.parent))
    uri = mlflow_store(tmp_path)
    cfg = _cfg(**{"method.name": "tplug_story:BYOL", "run.output_dir": str(tmp_path / "runs"),
                  "run.experiment": "test-plugins"})
    first = fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    assert first.status == "finished" and first.steps == 3 and not first.resumed
    code = MlflowClient(uri).get_run(first.mlflow_run_id).data.tags["mocolab.code_fingerprint"]
    assert code == code_fingerprint(extra=("tplug_story",)).digest != code_fingerprint().digest

    _edit(plugin, '"""BYOL, Bootstrap', '"""A reworded docstring: BYOL, Bootstrap')  # no code changed
    said: list[str] = []
    same = fit(cfg, tracking_uri=uri, progress=said.append)
    assert same.run_name == first.run_name and same.mlflow_run_id == first.mlflow_run_id
    assert any("nothing to train" in line for line in said), said

    _edit(plugin, "return (2 - 2 * (p * z).sum(dim=1)).mean()", "return 2 - 2 * (p * z).sum(dim=1).mean()")
    changed = fit(cfg, tracking_uri=uri, progress=lambda _m: None)
    new_code = code_fingerprint(extra=("tplug_story",))
    assert changed.run_name == f"{first.run_name}-c{new_code.short}" and changed.mlflow_run_id != first.mlflow_run_id
    started = json.loads((tmp_path / "runs" / first.run_name / "manifest.json").read_text())["code"]
    assert started["digest"] == code and new_code.differences(CodeFingerprint.from_dict(started)) == [
        "tplug_story: changed"]


# ------------------------------------------------------------------------------------------ trained and swept
def _run(uri: str, run_id: str):
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["mocolab.status"] == "finished"
    for key in ("linear_top1", "knn_top1", "loss", "m", "pretext_acc"):
        assert key in run.data.metrics, key
    return run


@pytest.mark.slow
def test_mocolab_train_trains_the_plugin_in_this_process_logs_and_scores_it(tmp_path, capsys):
    """docs/methods.md's training lines: each a valid config as written; the first trained (W = 0)."""
    trains = _quickstart()["train"]
    for argv in trains:  # on synthetic data: what is checked is the plugin's config, not the data's
        assert main([*argv, "--set", "data.name=synthetic", "--print-config"]) == 0, argv
        assert "method:\n  name: byol\n  options:\n    byol.symmetric: true\n" in capsys.readouterr().out
    uri = mlflow_store(tmp_path)
    argv = [*trains[0], *TINY_ARGS, "--set", "method.byol.symmetric=false", "--tracking-uri", uri,
            "--storage", str(tmp_path / "runs")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "BYOL: no negatives, an EMA target, one-way loss" in out  # the method's own line
    assert ", method byol, " in out and "MoCo v2" not in out  # the run's first line names the plugin
    [run] = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("mocolab").experiment_id])
    run = _run(uri, run.info.run_id)
    params = run.data.params
    assert params["method.name"] == "byol" and params["method.byol.symmetric"] == "False"
    assert params["method.byol.predictor"] == "True" and params["run.num_workers"] == "0"
    assert params["moco.m"] == "0.996" and params["moco.m_schedule"] == "cosine"
    metrics = run.data.metrics
    # one direction of 2 − 2·cos: about 2 for unrelated directions, at most 4 (both directions: about 4)
    assert 0 < metrics["loss"] == metrics["final_loss"] < 3, metrics
    # the paper's cosine schedule from 0.996 towards 1, at the last of 3 steps: 1 − 0.004·(cos(2π/3) + 1)/2
    assert metrics["m"] == pytest.approx(1 - 0.004 * (math.cos(2 * math.pi / 3) + 1) / 2)
    assert metrics["staleness_max"] == float(run.data.tags["mocolab.max_staleness_bound"]) == 0  # no negatives
    for key in ("linear_top1", "knn_top1"):  # scored on the 64 test images asked for (eval.*_test)
        assert 0 <= metrics[key] <= 1 and (metrics[key] * 64) == round(metrics[key] * 64), (key, metrics[key])
    # the run's config.yaml is a --config the same plugin run reads back
    from mocolab.config import build_config, config_file_overrides

    saved = MlflowClient(uri).download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    again = build_config("smoke", config_file_overrides(saved))
    assert again.method.name == "byol" and again.method.options["byol.symmetric"] is False


@pytest.mark.slow
def test_ray_workers_find_an_installed_plugin_and_get_a_path_plugin_shipped(tmp_path, monkeypatch, ray_session):
    """W = 1: the entry point is in the workers' environment; a module named by path is on this process's path
    only (not Ray's: its workers started elsewhere), so the run sends it to its workers."""
    from mocolab.training import fit

    uri = mlflow_store(tmp_path)
    shutil.copy(BYOL_FILE, tmp_path / "tplug_shipped.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("byol", "tplug_shipped:BYOL"):
        cfg = _cfg(**{"method.name": name, "run.num_workers": 1, "run.output_dir": str(tmp_path / "runs"),
                      "run.experiment": "test-plugins"})
        out = fit(cfg, tracking_uri=uri, progress=lambda _m: None, ray_train_info=False)
        assert out.status == "finished" and out.steps == 3, name
        run = _run(uri, out.mlflow_run_id)
        assert run.data.params["method.name"] == name and run.data.params["run.num_workers"] == "1"


@pytest.mark.slow
def test_mocolab_sweep_sweeps_a_plugin_s_own_field(tmp_path, ray_session, capsys):
    """docs/methods.md's sweep line: two trials, each in its trial's process (W = 0)."""
    uri = mlflow_store(tmp_path)
    [sweep] = _quickstart()["sweep"]
    argv = [*sweep, *TINY_ARGS, "--name", "byol-sweep", "--experiment", "test-plugins", "--workers-per-trial", "0",
            "--max-concurrent", "2", "--tracking-uri", uri, "--storage", str(tmp_path / "sweeps")]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("test-plugins").experiment_id])
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.params["method.byol.symmetric"] for r in kids) == ["False", "True"]
    for run in kids:
        _run(uri, run.info.run_id)
        assert run.data.params["method.name"] == "byol"
    # the same command again finds both trials done: the sweep keys them on the plugin's code as fit does
    capsys.readouterr()
    assert main(argv) == 0
    assert "2 trial(s) already done, 0 to run" in capsys.readouterr().out
