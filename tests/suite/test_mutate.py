"""`make mutate`'s own rules (tests/mutate.py): the rewrite that lets mutmut reach decorated rules computes what
the decorated code computes, and every target names modules and tests that exist."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import libcst as cst
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import mutate  # noqa: E402  (tests/mutate.py: a script beside the tests, not a package)

SOURCE = '''
import functools
import torch


@torch.no_grad()
def scaled(x, m):
    """A docstring stays the function's."""
    y = x * m
    return y, torch.is_grad_enabled()


@functools.lru_cache(maxsize=4)
def cached(n):
    return [n]


class Holder:
    @property
    def value(self):
        return 3

    @functools.lru_cache(maxsize=2)
    def twice(self, n):
        return 2 * n

    @torch.no_grad()
    def step(self, x):
        return x + 1, torch.is_grad_enabled()
'''


def _rewritten(source: str) -> str:
    return cst.parse_module(source).visit(mutate._Undecorated()).code


def test_no_grad_and_module_caches_become_plain_functions_that_compute_the_same():
    code = _rewritten(SOURCE)
    tree = cst.parse_module(code)
    decorated = [n.name.value for n in tree.body if isinstance(n, cst.FunctionDef) and n.decorators]
    assert decorated == []  # mutmut mutates none of a decorated function
    holder = next(n for n in tree.body if isinstance(n, cst.ClassDef))
    methods = {n.name.value: n for n in holder.body.body if isinstance(n, cst.FunctionDef)}
    # a property and a method's cache stay (mutmut's methods are not module-level names), no_grad goes
    assert methods["value"].decorators and methods["twice"].decorators and not methods["step"].decorators

    before, after = {}, {}
    exec(compile(SOURCE, "before", "exec"), before)  # noqa: S102 - the probe's own source
    exec(compile(code, "after", "exec"), after)  # noqa: S102
    x = torch.ones(3, requires_grad=True)
    for ns in (before, after):
        y, grad_inside = ns["scaled"](x, 2.0)
        assert torch.equal(y, torch.full((3,), 2.0)) and not y.requires_grad and grad_inside is False
        assert ns["scaled"].__doc__ == "A docstring stays the function's."
        assert ns["cached"](1) is ns["cached"](1)  # still cached: the wrapper replaced the name
        assert ns["Holder"]().value == 3 and ns["Holder"]().step(x)[1] is False
    assert torch.is_grad_enabled()


def test_the_rules_mutmut_would_skip_are_rewritten_in_every_target(tmp_path):
    """The momentum update, the keys, the queue's writes and the shuffle are decorated in the source; in each
    target's scratch copy (``undecorate``, as ``_scratch`` calls it) no function is left under a decorator
    mutmut skips but those it must keep (a property, a method's cache)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "platform" / "mocolab", src / "mocolab", ignore=shutil.ignore_patterns("__pycache__"))
    for target in mutate.TARGETS.values():
        mutate.undecorate(src, target.modules)
    rules = {"method/moco.py": ["momentum_update", "MoCo.compute_keys"], "method/key_queue.py": ["KeyQueue.enqueue"],
             "method/shuffle.py": ["CrossRankShuffle.shuffle", "CrossRankShuffle.unshuffle"],
             "training/code_fingerprint.py": ["_fingerprint"]}
    for module, names in rules.items():
        before = _functions(cst.parse_module((REPO / "platform" / "mocolab" / module).read_text()))
        after = _functions(cst.parse_module((src / "mocolab" / module).read_text()))
        for name in names:
            assert before[name] and not after[name], (module, name)
    for target in mutate.TARGETS.values():
        for module in target.modules:
            for name, decorators in _functions(cst.parse_module((src / "mocolab" / module).read_text())).items():
                assert not {"torch.no_grad()", "functools.cache"} & set(decorators), (module, name)


def _functions(tree: cst.Module) -> dict[str, list[str]]:
    """Each function by its qualified name (``Class.method``) with its decorators as code (a cache's size
    left out)."""
    found: dict[str, list[str]] = {}
    scope: list[str] = []

    class Visit(cst.CSTVisitor):
        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            scope.append(node.name.value)

        def leave_ClassDef(self, node: cst.ClassDef) -> None:
            scope.pop()

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            name = ".".join([*scope, node.name.value])
            found[name] = [tree.code_for_node(d.decorator).split("(maxsize")[0] for d in node.decorators]
            scope.append(node.name.value)

        def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
            scope.pop()

    tree.visit(Visit())
    return found


@pytest.mark.parametrize("name", sorted(mutate.TARGETS))
def test_each_target_names_modules_and_tests_that_exist(name):
    target = mutate.TARGETS[name]
    for module in target.modules:
        assert (REPO / "platform" / "mocolab" / module).is_file(), module
    for test in target.tests:
        assert (REPO / test).exists(), test


def test_a_mutant_is_counted_under_its_module():
    """RESULTS.md keeps the survivors per module: the module is the name before mutmut's mangled function."""
    assert mutate._module("mocolab.method.moco.xǁMoCoǁforward__mutmut_3") == "mocolab.method.moco"
    assert mutate._module("mocolab.method.losses.x_nt_xent__mutmut_10") == "mocolab.method.losses"
    assert mutate._module("mocolab.models.named.x__catalogue__mutmut_2") == "mocolab.models.named"


def test_a_kept_copy_is_refreshed_from_the_checkout_and_keeps_mutmuts_results(tmp_path):
    """``--cache``: the copy's sources and tests are the checkout's again (a file gone from it is gone from the
    copy), and mutmut's ``mutants/`` (its verdicts and hashes) stays, so the next run re-tests only what changed."""
    target = mutate.TARGETS["code_fingerprint"]
    root = mutate._scratch(tmp_path / "code_fingerprint", target, None)
    verdicts = root / "mutants" / "src" / "mocolab" / "training" / "code_fingerprint.py.meta"
    verdicts.parent.mkdir(parents=True)
    verdicts.write_text('{"exit_code_by_key": {}}')
    stale = root / "src" / "mocolab" / "gone_from_the_checkout.py"
    stale.write_text("x = 1\n")
    (root / "src" / "mocolab" / "training" / "code_fingerprint.py").write_text("# an older edit\n")
    again = mutate._scratch(root, target, "fingerprint")
    assert again == root and verdicts.read_text() == '{"exit_code_by_key": {}}'
    assert not stale.exists()
    assert (root / "src" / "mocolab" / "training" / "code_fingerprint.py").read_text().startswith('"""')
    assert (root / "mutants" / "platform").resolve() == (root / "mutants" / "src").resolve()
    assert "-k\n    (fingerprint)" in (root / "setup.cfg").read_text()
