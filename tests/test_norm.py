import torch
from torch import nn

from mocolab.norm import LocalShuffle, SplitBatchNorm2d, convert_split_bn


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
