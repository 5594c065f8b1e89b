"""MaxPool2x2 is nn.MaxPool2d(2) bit for bit, values and gradients, ties included; the convnet's
pool-then-ReLU order is its former ReLU-then-pool exactly."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mocolab.models.backbones import ConvNet
from mocolab.models.pooling import MaxPool2x2, max_pool_2x2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 3, 28, 28), (4, 5, 7, 7), (3, 2, 6, 9), (2, 4, 2, 5)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_values_and_gradients_equal_max_pool2d_with_ties(dtype, shape, channels_last):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, shape, generator=g).to(dtype)  # three values: most windows hold ties
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, ref = max_pool_2x2(ours), F.max_pool2d(theirs, 2)
    grad = torch.randn(ref.shape, generator=g).to(dtype)
    y.backward(grad)
    ref.backward(grad)
    assert torch.equal(y, ref)
    assert torch.equal(ours.grad, theirs.grad)  # each window's gradient goes to its first maximum
    with torch.no_grad():
        assert torch.equal(max_pool_2x2(x), ref)


def test_random_values_and_a_nan_behave_as_max_pool2d():
    x = torch.randn(8, 16, 14, 14)
    x[0, 0, 3, 5] = float("nan")
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, ref = max_pool_2x2(ours), F.max_pool2d(theirs, 2)
    assert torch.equal(y.isnan(), ref.isnan()) and torch.equal(y.nan_to_num(), ref.nan_to_num())
    y.nan_to_num().sum().backward()
    ref.nan_to_num().sum().backward()
    finite = ~ref.isnan().repeat_interleave(2, 2).repeat_interleave(2, 3)
    assert torch.equal(ours.grad[finite], theirs.grad[finite])


def test_an_image_too_small_gets_torchs_error():
    with pytest.raises(RuntimeError, match="too small"):
        max_pool_2x2(torch.randn(2, 3, 1, 5))


def test_module_has_no_state_and_replaces_nn_maxpool():
    assert MaxPool2x2().state_dict() == {} and list(MaxPool2x2().parameters()) == []
    x = torch.randn(2, 3, 9, 9)
    assert torch.equal(MaxPool2x2()(x), nn.MaxPool2d(2)(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convnet_pool_then_relu_equals_relu_then_pool(dtype):
    torch.manual_seed(0)
    net = ConvNet(1, 8)
    before = copy.deepcopy(net)
    layers = list(before.features)
    for i in range(len(layers) - 1):  # the order before: conv, BN, ReLU, nn.MaxPool2d
        if isinstance(layers[i], MaxPool2x2):
            layers[i], layers[i + 1] = layers[i + 1], nn.MaxPool2d(2)
    before.features = nn.Sequential(*layers)
    assert [type(m).__name__ for m in before.features][:4] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    assert net.state_dict().keys() == before.state_dict().keys()  # checkpoints load either way
    x = torch.randn(16, 1, 28, 28)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        a, b = net(x), before(x)
    a.float().pow(2).sum().backward()
    b.float().pow(2).sum().backward()
    assert torch.equal(a, b)
    for p, q in zip(net.parameters(), before.parameters()):
        assert torch.equal(p.grad, q.grad)
