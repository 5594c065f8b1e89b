"""method/losses.py: each fused or distributed variant equals its definition (values and gradients), and the
definitions equal the losses written out term by term."""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from mocolab.method.losses import (contrastive_cross_entropy, fused_queue_info_nce, info_nce, nt_xent, queue_info_nce,
                                   sharded_queue_info_nce, v3_info_nce)
from mocolab.method.key_queue import KeyQueue

TAU = 0.2
B, W, C, K = 3, 2, 8, 24  # per-rank batch, simulated ranks, embedding dim, queue size


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


# ---------------------------------------------------------------------------------------------
# Definitions against the formula written out


def test_info_nce_is_the_cross_entropy_with_the_positive_first():
    l_pos = torch.tensor([[0.9], [0.1], [-0.3]])
    l_neg = torch.tensor([[0.2, -0.5, 0.1, 0.0], [0.8, 0.3, -0.1, 0.4], [0.0, 0.0, 0.5, -0.9]])
    tau = 0.07
    loss, logits = info_nce(l_pos, l_neg, tau)
    direct = [-(row[0] - torch.logsumexp(row, 0)) for row in torch.cat([l_pos, l_neg], 1) / tau]
    torch.testing.assert_close(loss, torch.stack(direct).mean())
    assert logits.shape == (3, 5)
    row0 = [0.9, 0.2, -0.5, 0.1, 0.0]  # -log(e^{a/τ} / Σ e^{x/τ})
    assert float(direct[0]) == pytest.approx(-row0[0] / tau + math.log(sum(math.exp(x / tau) for x in row0)),
                                             abs=1e-6)


def test_contrastive_cross_entropy_scores_the_given_column_and_leaves_out_the_excluded_one():
    q, keys = _unit(2, 4, seed=0), _unit(5, 4, seed=1)
    positive, exclude = torch.tensor([3, 0]), torch.tensor([1, 4])
    loss, correct = contrastive_cross_entropy(q, keys, positive, TAU, exclude=exclude)
    want, best = [], []
    for i in range(2):
        cols = [j for j in range(5) if j != int(exclude[i])]
        row = torch.stack([q[i] @ keys[j] for j in cols]) / TAU
        want.append(-torch.log_softmax(row, 0)[cols.index(int(positive[i]))])
        best.append(cols[int(row.argmax())] == int(positive[i]))
    torch.testing.assert_close(loss, torch.stack(want).mean())
    assert correct.tolist() == best


def test_queue_info_nce_is_info_nce_against_the_keys():
    q, k, keys = _unit(4, C, seed=2), _unit(4, C, seed=3), _unit(K, C, seed=4)
    l_pos = (q * k).sum(1, keepdim=True)
    loss, correct = queue_info_nce(q, l_pos, keys, TAU)
    ref, logits = info_nce(l_pos, q @ keys.T, TAU)
    assert torch.equal(loss, ref) and torch.equal(correct, logits.argmax(1) == 0)


def test_v3_is_2_tau_times_the_cross_entropy_against_the_other_views_keys():
    q, k = _unit(4, C, seed=5), _unit(4, C, seed=6)
    loss, correct = v3_info_nce(q, k, TAU)
    ce = F.cross_entropy(q @ k.T / TAU, torch.arange(4))
    torch.testing.assert_close(loss, 2 * TAU * ce)
    assert torch.equal(correct, (q @ k.T).argmax(1) == torch.arange(4))


# ---------------------------------------------------------------------------------------------
# Each variant against its definition
#
# A case maps leaves (tensors requiring grad) to (loss, correct) twice: as the variant computes it and as
# the definition does.  Distributed variants run each of W ranks in this process, with a gather that
# returns the global tensor (whose rows this rank's tensor is), and average the ranks' losses as DDP
# averages their gradients; the definition is one process over the global batch.


def _queue_leaves() -> dict[str, torch.Tensor]:
    return {"q": _unit(B * W, C, seed=10), "k": _unit(B * W, C, seed=11)}


def _queue_case(variant: Callable) -> Callable:
    def run(leaves: dict, keys: torch.Tensor, definition: bool):
        q, k = leaves["q"], leaves["k"]
        return (queue_info_nce if definition else variant)(q, (q * k).sum(1, keepdim=True), keys, TAU)
    return run


def _nt_xent_case(leaves: dict, keys: torch.Tensor, definition: bool):
    z1, z2 = leaves["q"], leaves["k"]
    if definition:
        return nt_xent(z1, z2, TAU)
    losses, correct = [], []
    for rank in range(W):
        mine = slice(rank * B, (rank + 1) * B)
        a, b = z1[mine], z2[mine]
        loss, c = nt_xent(a, b, TAU, rank=rank, gather=lambda x, a=a: z1 if x is a else z2)
        losses.append(loss)
        correct.append(c.view(2, B))
    return torch.stack(losses).mean(), torch.cat(correct, 1).flatten()  # views 1 of all ranks, then views 2


def _v3_case(leaves: dict, keys: torch.Tensor, definition: bool):
    q, k = leaves["q"], leaves["k"].detach()  # the keys come from the momentum encoder: no gradient
    if definition:
        return v3_info_nce(q, k, TAU)
    parts = [v3_info_nce(q[r * B:(r + 1) * B], k[r * B:(r + 1) * B], TAU, rank=r, gather=lambda _: k)
             for r in range(W)]
    return torch.stack([p[0] for p in parts]).mean(), torch.cat([p[1] for p in parts])


CASES = {
    "fused queue": _queue_case(fused_queue_info_nce),
    "sharded queue, one rank": _queue_case(sharded_queue_info_nce),
    "nt_xent over ranks": _nt_xent_case,
    "v3 over ranks": _v3_case,
}
# the queue's losses also with the key buffer written after forward, before backward (what enqueue does)
PARAMS = [pytest.param(name, False, id=name) for name in CASES] + \
    [pytest.param(name, True, id=f"{name}, keys overwritten before backward") for name in CASES if "queue" in name]


@pytest.mark.parametrize("name, overwrite", PARAMS)
def test_variant_equals_its_definition_in_value_and_gradient(name, overwrite):
    case = CASES[name]
    leaves = _queue_leaves()
    ours = {n: t.clone().requires_grad_() for n, t in leaves.items()}
    theirs = {n: t.clone().requires_grad_() for n, t in leaves.items()}
    keys = _unit(K, C, seed=12)  # one buffer both read, as the queue's
    loss, correct = case(ours, keys, definition=False)
    ref, ref_correct = case(theirs, keys, definition=True)
    if overwrite:
        keys.copy_(_unit(K, C, seed=13))
    (2.5 * loss).backward()  # the incoming gradient scales what a fused forward pass prepared
    (2.5 * ref).backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(correct, ref_correct)
    for n in leaves:  # float rounding at 1/τ
        if theirs[n].grad is None:
            assert ours[n].grad is None, n
        else:
            torch.testing.assert_close(ours[n].grad, theirs[n].grad, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("loss", [queue_info_nce, fused_queue_info_nce, sharded_queue_info_nce])
def test_a_tie_with_the_best_negative_counts_as_correct(loss):
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    l_pos = torch.tensor([[1.0], [0.5]])  # query 0 ties its best negative; query 1 loses to it
    _, correct = loss(q, l_pos, keys, TAU)
    assert correct.tolist() == [True, False]


# ---------------------------------------------------------------------------------------------
# The queue's snapshot: contrast reads the keys before this step's enqueue


def test_contrast_reads_the_snapshot_and_backward_survives_the_enqueue_after_it():
    queue = KeyQueue(K, C, B)
    q = _unit(B, C, seed=14).requires_grad_()
    l_pos = torch.full((B, 1), 0.5)
    expected, = torch.autograd.grad(queue_info_nce(q, l_pos, queue.keys, TAU)[0], q)
    negatives = queue.snapshot()
    loss, _ = queue.contrast(q, l_pos, TAU, negatives)
    queue.enqueue(_unit(B, C, seed=15), step=0)
    loss.backward()
    torch.testing.assert_close(q.grad, expected, rtol=1e-4, atol=1e-5)


def test_contrast_refuses_keys_written_after_the_snapshot():
    queue = KeyQueue(K, C, B)
    negatives = queue.snapshot()
    queue.enqueue(_unit(B, C, seed=16), step=0)  # enqueue moved above contrast: this step's keys as negatives
    with pytest.raises(RuntimeError, match="contrast must run before enqueue"):
        queue.contrast(_unit(B, C, seed=17), torch.zeros(B, 1), TAU, negatives)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_sharded_queue_loss_on_one_process_is_the_definition_at_any_batch(n):
    """One process holds the whole queue: the world size comes from the gathered queries' rows over this
    rank's (1 here), whatever the batch and the embedding width."""
    q, k, keys = _unit(n, C, seed=20 + n), _unit(n, C, seed=30 + n), _unit(K, C, seed=40)
    l_pos = (q * k).sum(1, keepdim=True)
    loss, correct = sharded_queue_info_nce(q, l_pos, keys, TAU)
    ref, ref_correct = queue_info_nce(q, l_pos, keys, TAU)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(correct, ref_correct)
