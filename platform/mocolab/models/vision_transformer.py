"""A Vision Transformer small enough to read: the backbone of MoCo v3's ViT experiments.

Patch projection (a strided convolution), a class token, fixed 2-D sin-cos
position embeddings (MoCo v3 uses them: nothing about position is learned),
pre-norm blocks of multi-head attention and an MLP, a final LayerNorm; the
features are the class token's output.  Our own module rather than
torchvision's so that the patch size follows the data (4 on 28×28, 16 on
224), the first layer is one named module (``patch_embed``) to freeze or
watch, and ``torch.export`` sees only plain tensor ops.

``freeze_patch_embed`` is MoCo v3's stability fix: the random patch
projection never receives a gradient and never changes.  ``PatchGradNorm``
measures the gradient the first layer gets (or would get, when frozen) so
the instability the fix removes can be seen in either case.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mocolab.config.choices import VIT_SIZES  # noqa: F401  (name -> width, depth, heads: config/choices.py)


def default_patch_size(image_size: int) -> int:
    """Patches sized for the data: 4 on 28×28 and 32×32 (7×7 / 8×8 tokens), 8 up to 96 px, 16 above."""
    if image_size <= 32:
        return 4
    return 8 if image_size <= 96 else 16


def sincos_position_embedding(grid: int, dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """(1 + grid²)×dim: a zero row for the class token, then sin/cos of each patch's (row, column).

    A quarter of the channels per (axis, sin|cos), as in MoCo v3's ``build_2d_sincos_position_embedding``.
    """
    if dim % 4:
        raise ValueError(f"vit: the embedding width {dim} must be a multiple of 4 for 2-D sin-cos positions")
    ys, xs = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                            indexing="ij")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    out_x = xs.flatten()[:, None] * omega[None]
    out_y = ys.flatten()[:, None] * omega[None]
    pe = torch.cat([out_x.sin(), out_x.cos(), out_y.sin(), out_y.cos()], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), pe]).float()


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"vit: width {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # b×heads×n×(d/heads)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN x), then x + MLP(LN x)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image_size: int, in_channels: int, patch_size: int, dim: int, depth: int, heads: int,
                 freeze_patch_embed: bool = False) -> None:
        super().__init__()
        if patch_size < 1 or image_size % patch_size:
            raise ValueError(f"vit.patch_size: {patch_size} must divide the image size {image_size} "
                             f"(e.g. 4 or 7 on 28×28, 4 or 8 on 32×32, 16 on 224×224)")
        grid = image_size // patch_size
        self.patch_size, self.grid, self.out_dim = patch_size, grid, dim
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.register_buffer("pos_embed", sincos_position_embedding(grid, dim)[None], persistent=False)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self._init_weights(in_channels)
        if freeze_patch_embed:
            for p in self.patch_embed.parameters():
                p.requires_grad_(False)

    def _init_weights(self, in_channels: int) -> None:
        """MoCo v3's initialisation: Xavier-uniform linears (q, k, v each as its own matrix), a Xavier
        patch projection, a near-zero class token."""
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                if name.endswith("qkv"):  # the bound of one dim×dim matrix, not of the fused 3·dim×dim one
                    val = math.sqrt(6.0 / float(m.weight.shape[0] // 3 + m.weight.shape[1]))
                    nn.init.uniform_(m.weight, -val, val)
                else:
                    nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        fan = in_channels * self.patch_size ** 2
        val = math.sqrt(6.0 / float(fan + self.out_dim))
        nn.init.uniform_(self.patch_embed.weight, -val, val)
        nn.init.zeros_(self.patch_embed.bias)
        nn.init.normal_(self.cls_token, std=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # B×(grid²)×dim
        cls = self.cls_token.expand(tokens.shape[0], -1, -1).to(tokens.dtype)
        x = torch.cat([cls, tokens], dim=1) + self.pos_embed.to(tokens.dtype)
        return self.norm(self.blocks(x))[:, 0]


def build_vit(name: str, image_size: int, in_channels: int, *, patch_size: int = 0, depth: int = 0,
              freeze_patch_embed: bool = False) -> VisionTransformer:
    """``vit_tiny`` / ``vit_small`` sized for the data: patch_size 0 = ``default_patch_size``, depth 0 = 12."""
    if name not in VIT_SIZES:
        raise ValueError(f"model.backbone: unknown ViT {name!r}; choose one of {list(VIT_SIZES)}")
    dim, full_depth, heads = VIT_SIZES[name]
    return VisionTransformer(image_size, in_channels, patch_size or default_patch_size(image_size), dim,
                             depth or full_depth, heads, freeze_patch_embed)


class PatchGradNorm:
    """‖∂loss/∂W‖ of a patch projection, frozen or not, summed over every forward before one backward.

    A stride-p, kernel-p convolution is a matrix product of each p×p patch with
    W, so its weight gradient is Σ grad_out ⊗ patch: computed here from the
    input (forward hook) and the output's gradient (tensor hook), without the
    weight ever needing ``requires_grad``. For a trained projection it equals
    the norm of ``weight.grad`` on this rank before DDP averages it (tested).
    """

    def __init__(self, conv: nn.Conv2d) -> None:
        self.conv = conv
        self.grad: torch.Tensor | None = None
        self.enabled = True
        self._handle = None
        self.attach()

    def attach(self) -> None:
        if self._handle is None:
            self._handle = self.conv.register_forward_hook(self._on_forward)

    def _on_forward(self, module: nn.Conv2d, inputs: tuple[torch.Tensor, ...],
                    out: torch.Tensor) -> torch.Tensor | None:
        if not (self.enabled and torch.is_grad_enabled()):
            return None  # the key encoder, evaluation, export: nothing to measure
        if not out.requires_grad:  # frozen projection on images: a leaf, so autograd reaches the tokens
            out = out.detach().requires_grad_(True)
        x = inputs[0].detach()
        p = module.kernel_size[0]

        def on_grad(g: torch.Tensor) -> None:
            patches = F.unfold(x.float(), p, stride=p)  # B×(C·p·p)×T
            gw = torch.einsum("bdt,bkt->dk", g.float().flatten(2), patches)
            self.grad = gw if self.grad is None else self.grad + gw

        out.register_hook(on_grad)
        return out

    def pop(self) -> float | None:
        """The norm accumulated since the last call (None if no backward ran), and reset."""
        g, self.grad = self.grad, None
        return None if g is None else float(g.norm())

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
