import pytest
import torch
from torch import nn

from mocolab.method.shuffle import LocalShuffle
from mocolab.method.batchnorm import SplitBatchNorm2d, convert_split_bn


def test_split_bn_one_group_equals_plain_bn():
    x = torch.randn(16, 6, 5, 5)
    plain, split = nn.BatchNorm2d(6), SplitBatchNorm2d(6, groups=1)
    split.load_state_dict(plain.state_dict())
    torch.testing.assert_close(split(x), plain(x))
    torch.testing.assert_close(split.running_mean, plain.running_mean)
    torch.testing.assert_close(split.running_var, plain.running_var)


def test_split_bn_normalises_each_group_on_its_own():
    x = torch.randn(12, 3, 4, 4)
    x[6:] = x[6:] * 5 + 3  # two groups with very different statistics
    split = SplitBatchNorm2d(3, groups=2)
    out = split(x)
    plain = nn.BatchNorm2d(3)
    torch.testing.assert_close(out[:6], plain(x[:6]))
    torch.testing.assert_close(out[6:], nn.BatchNorm2d(3)(x[6:]))
    # running stats: the average of the two groups' updates
    a, b = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    a(x[:6]), b(x[6:])
    torch.testing.assert_close(split.running_mean, (a.running_mean + b.running_mean) / 2)
    torch.testing.assert_close(split.running_var, (a.running_var + b.running_var) / 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_split_bn_gradients_equal_separate_bn_layers_per_group(dtype, affine):
    """Forward, input gradient, weight gradient and running statistics are those of one plain BatchNorm2d
    per contiguous group (the weights shared): bit for bit in bfloat16 (torch's kernels on each slice)."""
    g = 4
    x = (torch.randn(32, 5, 3, 3) * 3 + 1).to(dtype)
    split = SplitBatchNorm2d(5, groups=g, affine=affine)
    if affine:
        with torch.no_grad():
            split.weight.uniform_(0.5, 2)
            split.bias.uniform_(-1, 1)
    ours = x.clone().requires_grad_()
    y = split(ours)
    grad = torch.randn(y.shape).to(dtype)
    y.backward(grad)
    theirs = x.clone().requires_grad_()
    plain = [nn.BatchNorm2d(5, affine=affine) for _ in range(g)]
    outs = []
    for j, bn in enumerate(plain):
        if affine:
            bn.weight, bn.bias = split.weight, split.bias  # shared: gradients add up across groups
        outs.append(bn(theirs[8 * j:8 * (j + 1)]))
    ref = torch.cat(outs)
    ours_w = (split.weight.grad.clone(), split.bias.grad.clone()) if affine else None
    if affine:
        split.weight.grad = split.bias.grad = None
    ref.backward(grad)
    if affine:
        tol = dict(rtol=1e-5, atol=1e-5)  # G partial sums added in another order
        torch.testing.assert_close(ours_w[0], split.weight.grad, **tol)
        torch.testing.assert_close(ours_w[1], split.bias.grad, **tol)
    assert y.dtype == ref.dtype and y.is_contiguous()
    # float32 statistics are float32 sums here, float64 in torch's kernel: equal to float32 rounding
    exact = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, ref, **exact)
    torch.testing.assert_close(ours.grad, theirs.grad, **exact)
    torch.testing.assert_close(split.running_mean, torch.stack([bn.running_mean for bn in plain]).mean(0), **exact)
    torch.testing.assert_close(split.running_var, torch.stack([bn.running_var for bn in plain]).mean(0), **exact)
    assert int(split.num_batches_tracked) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_bn_gpu_path_equals_the_cpu_kernels(dtype):
    """The transposing path GPUs take, run here on CPU, against the per-group kernels."""
    x = (torch.randn(16, 3, 4, 4) * 2 + 1).to(dtype)
    a, b = SplitBatchNorm2d(3, groups=4), SplitBatchNorm2d(3, groups=4)
    b.per_group_kernels = False
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa), b(xb)
    grad = torch.randn(ya.shape).to(dtype)
    ya.backward(grad)
    yb.backward(grad)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0, atol=0)
    torch.testing.assert_close(ya, yb, **tol)
    torch.testing.assert_close(xa.grad, xb.grad, **tol)
    torch.testing.assert_close(a.running_var, b.running_var, **tol)


def test_split_bn_eval_is_plain_bn():
    split = SplitBatchNorm2d(3, groups=4)
    split(torch.randn(8, 3, 2, 2))
    split.eval()
    plain = nn.BatchNorm2d(3).eval()
    plain.load_state_dict(split.state_dict())
    x = torch.randn(5, 3, 2, 2)  # any batch size in eval
    torch.testing.assert_close(split(x), plain(x))


def test_convert_split_bn_keeps_weights():
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    with torch.no_grad():
        net[1].weight.fill_(2.0)
    convert_split_bn(net, 2)
    assert isinstance(net[1], SplitBatchNorm2d) and isinstance(net[2][0], SplitBatchNorm2d)
    assert torch.all(net[1].weight == 2.0)


def test_shuffle_then_unshuffle_is_identity():
    sh = LocalShuffle(torch.Generator().manual_seed(1))
    x = torch.randn(32, 7)
    y, restore = sh.shuffle(x)
    assert not torch.equal(x, y)  # it really moved samples
    assert torch.equal(sh.unshuffle(y, restore), x)
    # a row-wise function commutes with the shuffle
    f = lambda t: t * 2 + 1  # noqa: E731
    assert torch.equal(sh.unshuffle(f(y), restore), f(x))


@pytest.mark.parametrize("mode, groups, shuffled", [("plain", 1, False), ("groups", 4, False), ("split", 4, True)])
def test_each_bn_mode_is_its_groups_and_its_shuffle(mode, groups, shuffled):
    """The batch-norm study's arms differ in one thing at a time: plain -> groups adds the groups,
    groups -> split adds the shuffle."""
    from mocolab.config import build_config
    from mocolab.training.trainer import Trainer
    from mocolab.method.shuffle import NoShuffle

    tr = Trainer(build_config("smoke", {"data.name": "synthetic", "data.subset": 256, "queue.size": 128,
                                        "optim.batch_size": 32, "moco.bn": mode}))
    bns = [m for m in tr.model.encoder_q.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and {getattr(m, "groups", 1) for m in bns} == {groups}
    assert isinstance(tr.model.shuffler, LocalShuffle if shuffled else NoShuffle)
