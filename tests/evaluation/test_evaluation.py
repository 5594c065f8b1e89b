import pytest
import torch

from mocolab.evaluation.scoring import Evaluation, extract_features
from mocolab.evaluation.knn import knn_accuracy, knn_predict
from mocolab.evaluation.probe import linear_probe


def _blobs(n_per: int, classes: int, dim: int, seed: int, spread: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 3
    labels = torch.arange(classes).repeat_interleave(n_per)
    feats = centres[labels] + spread * torch.randn(len(labels), dim, generator=g)
    return feats, labels


def test_knn_on_hand_made_points():
    bank = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    labels = torch.tensor([0, 0, 1, 1])
    test = torch.tensor([[1.0, 0.05], [0.05, 1.0]])
    assert knn_predict(bank, labels, test, classes=2, k=2).tolist() == [0, 1]
    # with k = all, the exp(s/t) weighting still favours the near class
    assert knn_predict(bank, labels, test, classes=2, k=4, t=0.1).tolist() == [0, 1]


def test_knn_tiny_temperature_is_stable():
    """exp(s/t) overflows float32 for t < 0.012: the votes must stay finite and the nearest neighbour win."""
    bank = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.6, 0.4]])
    labels = torch.tensor([0, 0, 1, 1, 1])
    test = torch.tensor([[1.0, 0.05], [0.05, 1.0], [0.62, 0.38]])
    for t in (1e-3, 1e-6, 1e-30):
        assert knn_predict(bank, labels, test, classes=2, k=5, t=t).tolist() == [0, 1, 1]
    # and at ordinary temperatures the shift changes nothing
    tr, ytr = _blobs(30, 4, 8, 0)
    te, _ = _blobs(10, 4, 8, 1)
    bank_n, te_n = torch.nn.functional.normalize(tr, dim=1), torch.nn.functional.normalize(te, dim=1)
    sim, idx = (te_n @ bank_n.T).topk(10, dim=1)
    direct = torch.zeros(len(te), 4).scatter_add_(1, ytr[idx], (sim / 0.1).exp()).argmax(1)
    assert torch.equal(knn_predict(tr, ytr, te, classes=4, k=10, t=0.1), direct)


def test_knn_separable_blobs_and_determinism():
    tr, ytr = _blobs(50, 5, 16, 0)
    te, yte = _blobs(20, 5, 16, 1)
    a = knn_accuracy(tr, ytr, te, yte, 5, k=20)
    assert a == knn_accuracy(tr, ytr, te, yte, 5, k=20) == 1.0


def test_linear_probe_learns_and_is_deterministic():
    tr, ytr = _blobs(60, 4, 10, 0, spread=1.5)
    te, yte = _blobs(30, 4, 10, 1, spread=1.5)
    r1 = linear_probe(tr, ytr, te, yte, 4, steps=100)
    r2 = linear_probe(tr, ytr, te, yte, 4, steps=100)
    assert r1 == r2
    assert r1.test_top1 > 0.9 and r1.train_top1 >= r1.test_top1 - 0.05
    # shuffled labels carry no signal: test accuracy near chance
    perm = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(0))
    r3 = linear_probe(tr, ytr[perm], te, yte, 4, steps=100)
    assert r3.test_top1 < 0.5


def test_extract_features_uses_eval_mode_and_restores_it():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten())
    net.train()
    x = torch.randint(0, 256, (10, 1, 6, 6), dtype=torch.uint8)
    f_all = extract_features(net, x, batch_size=10)
    f_split = extract_features(net, x, batch_size=3)  # eval-mode BN: batching does not matter
    torch.testing.assert_close(f_all, f_split)
    assert net.training and f_all.shape == (10, 3 * 4 * 4)


def _run_evaluation(validation: bool) -> Evaluation:
    """A random convnet's evaluation on synthetic images: 256 training (64 of them held out if asked), 64 test."""
    from mocolab.data.splits import hold_out
    from mocolab.config import EvalConfig
    from mocolab.data.sets import load_dataset
    from mocolab.models.backbones import build_encoder
    from mocolab.data.sources import MemorySource

    full = load_dataset("synthetic", "train", synthetic_size=256, seed=0)
    train, val = hold_out(full, 64) if validation else (full, None)
    source = MemorySource(train, load_dataset("synthetic", "test", synthetic_size=256, seed=0), val=val)
    torch.manual_seed(0)
    encoder = build_encoder("convnet", 1, width=8, head="linear", dim=16)
    cfg = EvalConfig(knn_k=20, knn_bank=None, knn_test=None, linear_train=None, linear_steps=5, low_label_steps=5)
    return Evaluation(encoder, source, cfg, device=torch.device("cpu"), validation=validation)


@pytest.mark.parametrize("validation", [False, True], ids=["test", "validation"])
def test_a_runs_monitor_and_final_scores_read_one_set_of_features(validation):
    """The monitor reads the validation split where one is held out; with the whole training set as the kNN
    bank it scores what the final evaluation scores on that split, and final_eval is the test's half of it."""
    ev = _run_evaluation(validation)
    scores = ev.final_scores()
    assert ev.monitor_split == ("val" if validation else "test")
    assert ev.knn() == (scores.val_knn if validation else scores.knn)
    assert (scores.val_linear is not None) == validation
    knn, probe = ev.final_eval()
    assert knn == scores.knn and probe == scores.probe
    feats, labels = ev.split_features("test", None)
    assert feats.shape == (64, ev.encoder.backbone.out_dim) and len(labels) == 64


@pytest.mark.parametrize(("knn_test", "linear_test", "embedded"), [(None, 16, 64), (16, None, 64), (24, 40, 40)])
def test_fewer_test_images_score_a_prefix_and_embed_no_more_than_the_longer_one(knn_test, linear_test, embedded):
    """``eval.knn_test``/``eval.linear_test`` score the first N test images: the same numbers as the kNN and
    the probe on those images, and the images past the longer prefix never go through the encoder."""
    from dataclasses import replace

    from mocolab.evaluation.knn import knn_accuracy
    from mocolab.evaluation.probe import linear_probe

    ev = _run_evaluation(False)
    ev.cfg = replace(ev.cfg, knn_test=knn_test, linear_test=linear_test)
    seen: list[int] = []
    scores = ev.final_scores(embed=lambda x: (seen.append(len(x)), ev.features(x))[1])
    assert sum(seen) == 256 + embedded  # the training images, then the test images embedded
    f_train, l_train = ev.split_features("train", None)
    f_test, l_test = ev.split_features("test", None)
    n_knn, n_lin = knn_test or 64, linear_test or 64
    assert scores.knn == knn_accuracy(f_train, l_train, f_test[:n_knn], l_test[:n_knn], ev.source.classes, 20, 0.1)
    probe = linear_probe(f_train, l_train, f_test[:n_lin], l_test[:n_lin], ev.source.classes, steps=5,
                         weight_decay=ev.cfg.linear_wd)
    assert scores.probe.test_top1 == probe.test_top1


def test_the_exported_backbone_is_a_float32_cpu_copy_with_the_same_features():
    ev = _run_evaluation(False)
    exported = ev.backbone_copy()
    assert exported is not ev.encoder.backbone
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in exported.parameters())
    images, _ = next(iter(ev.source.eval_split("test", 16)))
    assert torch.equal(extract_features(exported, images), ev.features(images))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_linear_probe_matches_scikit_learn_on_real_features(dtype):
    """The probe's objective (mean cross-entropy + wd/2·|W|², bias free, on features standardised by the
    training mean and std) is sklearn's multinomial LogisticRegression with C = 1/(wd·n): both solve one
    strictly convex problem, so on the same features they must give the same weights and predictions, in
    float64 (the reference) and in float32 (what trials fit in)."""
    from sklearn.linear_model import LogisticRegression

    from mocolab.data.sets import load_dataset
    from mocolab.models.backbones import build_encoder

    torch.manual_seed(0)
    train, test = load_dataset("fashion-mnist", "train"), load_dataset("fashion-mnist", "test")
    backbone = build_encoder("convnet", 1, width=8).backbone  # a random encoder: features that are not separable
    f_tr, y_tr = extract_features(backbone, train.images[:1500]), train.labels[:1500]
    f_te, y_te = extract_features(backbone, test.images[:1000]), test.labels[:1000]
    wd = 1e-2
    ours = linear_probe(f_tr, y_tr, f_te, y_te, 10, weight_decay=wd, steps=500, dtype=dtype)
    assert ours.weight.dtype == dtype

    x = f_tr.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    sk = LogisticRegression(C=1.0 / (wd * len(x)), tol=1e-10, max_iter=5000)
    sk.fit(((x - mean) / std).numpy(), y_tr.numpy())
    sk_test = float((sk.predict(((f_te.double() - mean) / std).numpy()) == y_te.numpy()).mean())
    sk_train = float((sk.predict(((x - mean) / std).numpy()) == y_tr.numpy()).mean())

    assert 0.3 < sk_test < 0.95  # a real problem: neither trivial nor hopeless
    assert abs(ours.test_top1 - sk_test) <= 2 / len(y_te), (ours.test_top1, sk_test)  # at most 2 of 1,000 differ
    assert abs(ours.train_top1 - sk_train) <= 2 / len(y_tr), (ours.train_top1, sk_train)
    # sklearn's logits are defined up to a constant per sample: compare weights centred over classes
    w_ours = ours.weight.T - ours.weight.T.mean(0)
    w_sk = torch.from_numpy(sk.coef_) - torch.from_numpy(sk.coef_).mean(0)
    close = 1e-3 if dtype == torch.float64 else 5e-3  # float32 L-BFGS stops a little short: 0.1 % of the weights
    assert torch.allclose(w_ours.double(), w_sk, rtol=0, atol=close * float(w_sk.abs().max())), \
        float((w_ours - w_sk).abs().max())
