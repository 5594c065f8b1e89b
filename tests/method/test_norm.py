import pytest
import torch
from torch import nn

from mocolab.method.shuffle import LocalShuffle
from torch.utils._python_dispatch import TorchDispatchMode

from mocolab.method.batchnorm import SplitBatchNorm2d, _strided_batch_norm, convert_split_bn


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


class ActivationCopies(TorchDispatchMode):
    """Counts the operations that copy a tensor as large as the activations (``numel``): a split BN's cost."""

    COPIES = {torch.ops.aten.clone.default, torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default,
              torch.ops.aten._unsafe_view.default, torch.ops.aten.cat.default}

    # torch generates this out= variant: it computes into a temporary, then copies that into ``out``
    COPYING_OUT = {torch.ops.aten.native_batch_norm_backward.out}

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.copies, self.copied = numel, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        big = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
               if isinstance(t, torch.Tensor) and t.numel() >= self.numel]
        if big and (func in self.COPIES or "contiguous" in func.__name__):
            self.copies.append(func.__name__)
        if func in self.COPYING_OUT:
            self.copied += kwargs["out0"].numel()
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_bn_gpu_path_is_the_cpu_kernels_on_a_permuted_batch(dtype):
    """The GPU path (strided groups, one batch-norm over a view), run here on CPU, equals the per-group kernels
    on the batch permuted so that strided group j becomes contiguous slice j: outputs, input and weight
    gradients and running statistics, to float rounding."""
    n, c, g = 16, 3, 4
    x = (torch.randn(n, c, 4, 4) * 2 + 1).to(dtype)
    to_slices = torch.arange(n).view(n // g, g).T.reshape(-1)  # slice j holds samples j, j+G, ...
    back = torch.argsort(to_slices)
    a, b = SplitBatchNorm2d(c, groups=g), SplitBatchNorm2d(c, groups=g)
    b._kernel = lambda x: _strided_batch_norm
    xa, xb = x[to_slices].clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa), b(xb)
    grad = torch.randn(yb.shape).to(dtype)
    ya.backward(grad[to_slices])
    yb.backward(grad)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ya[back], yb, **tol)
    torch.testing.assert_close(xa.grad[back], xb.grad, **tol)
    torch.testing.assert_close(a.weight.grad, b.weight.grad, **tol)
    torch.testing.assert_close(a.bias.grad, b.bias.grad, **tol)
    torch.testing.assert_close(a.running_mean, b.running_mean, **tol)
    torch.testing.assert_close(a.running_var, b.running_var, **tol)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_split_bn_on_a_gpu_copies_no_activation_and_keeps_the_layout(layout):
    """On a GPU (``meta`` stands in: its tensors have a device and strides, and no data) split BN reads and
    writes the activations in place: no clone or copy of a batch-sized tensor in forward or backward, and the
    output keeps the layout the next convolution reads.  channels_last's per-slice backward is the exception:
    torch's out= variant of the batch-norm backward copies each slice's gradient once (one activation in all)."""
    bn = SplitBatchNorm2d(8, groups=4).to("meta")
    x = torch.empty(16, 8, 6, 6, device="meta").contiguous(memory_format=layout).requires_grad_()
    with ActivationCopies(x.numel()) as forward:
        y = bn(x)
    assert y.is_contiguous(memory_format=layout)
    with ActivationCopies(x.numel()) as backward:
        y.backward(torch.empty_like(y))
    assert forward.copies == [] and backward.copies == [], (forward.copies, backward.copies)
    assert forward.copied == 0
    assert backward.copied == (x.numel() if layout == torch.channels_last else 0)


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
