import torch

from mocolab.evaluation import extract_features, knn_accuracy, knn_predict, linear_probe


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
