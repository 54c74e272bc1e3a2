"""ResNet-18 in its CIFAR form (He et al. 2016, section 4.2's adaptation to 32x32 images, as
commonly trained on CIFAR-10): a 3x3 stride-1 stem convolution and no max-pool, then four
stages of two BasicBlocks with widths w, 2w, 4w, 8w (w = 64: 11.2 M parameters), the last
three starting with stride 2 (32x32 -> 4x4), global average pooling and a linear classifier.

    BasicBlock:  y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))

(each relu(bn(...)), and relu(bn2(...) + shortcut(x)), one fused op call: nn/norm.py) with
shortcut(x) = x, or a 1x1 strided convolution and BatchNorm (``downsample``) where the width
or the resolution changes. The names follow torchvision's ResNet (conv1, bn1, relu, layer1.0.
conv1, ..., layer2.0.downsample.0, fc), so state dicts and module trees line up with
PyTorch's; the fused calls (``nn.norm_relu``) fall back to the modules' own where a hook, a
backend pin or a BatchNorm subclass (SyncBatchNorm) asks for them.
"""

from __future__ import annotations

import numpy as np

from collections.abc import Sequence

from .. import nn
from ..hints import ArrayLike, DType
from ..nn import checks
from ..tensors import Tensor


class BasicBlock(nn.Module):
    """Two 3x3 conv + BatchNorm, the residual added before the last ReLU."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1, *,
                 dtype: DType = "float32", seed: int | None = None) -> None:
        super().__init__()
        seeds = np.random.default_rng(seed).integers(0, 2**31, 3)
        kw = dict(dtype=dtype)
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False,
                               seed=int(seeds[0]), **kw)
        self.bn1 = nn.BatchNorm2d(channels, **kw)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False, seed=int(seeds[1]), **kw)
        self.bn2 = nn.BatchNorm2d(channels, **kw)
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False, seed=int(seeds[2]), **kw),
                nn.BatchNorm2d(channels, **kw))
        else:
            self.downsample = None

    def forward(self, x: ArrayLike) -> Tensor:
        # relu(bn1(conv1(x))) and relu(bn2(conv2(out)) + shortcut): one op call each where
        # the modules allow it (nn.norm_relu: no hooks, same backend, BatchNorm's own forward)
        out = nn.norm_relu(self.bn1, self.relu, self.conv1(x))
        shortcut = x if self.downsample is None else self.downsample(x)
        return nn.norm_relu(self.bn2, self.relu, self.conv2(out), shortcut)


class ResNet(nn.Module):
    """The CIFAR ResNet over ``blocks`` BasicBlocks per stage (module docstring)."""

    def __init__(self, blocks: Sequence[int] = (2, 2, 2, 2), num_classes: int = 10, *,
                 width: int = 64, in_channels: int = 3, dtype: DType = "float32",
                 seed: int | None = 0) -> None:
        super().__init__()
        cls = "ResNet"
        num_classes = checks.integer(cls, "num_classes", num_classes, 1)
        width = checks.integer(cls, "width", width, 1)
        rng = np.random.default_rng(checks.seed(cls, seed))

        def next_seed():
            return int(rng.integers(0, 2**31))
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False, dtype=dtype,
                               seed=next_seed())
        self.bn1 = nn.BatchNorm2d(width, dtype=dtype)
        self.relu = nn.ReLU()
        cin = width
        for i, n in enumerate(blocks):
            cout = width * 2 ** i
            stage = nn.Sequential(*[
                BasicBlock(cin if b == 0 else cout, cout, (1 if i == 0 else 2) if b == 0 else 1,
                           dtype=dtype, seed=next_seed()) for b in range(n)])
            setattr(self, f"layer{i + 1}", stage)
            cin = cout
        self.avgpool = nn.GlobalAvgPool2d()
        self.fc = nn.Linear(cin, num_classes, dtype=dtype, seed=next_seed())
        self.stages = len(blocks)

    def forward(self, x: ArrayLike) -> Tensor:
        x = nn.norm_relu(self.bn1, self.relu, self.conv1(x))
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(self.avgpool(x))


def resnet18(num_classes: int = 10, *, width: int = 64, in_channels: int = 3,
             dtype: DType = "float32", seed: int | None = 0) -> ResNet:
    """ResNet-18, CIFAR form: input (N, in_channels, H, W) (32x32 for CIFAR; any size that
    survives three halvings), output logits (N, num_classes). ``width``: the first stage's
    channels (64 in the paper; smaller for tests)."""
    return ResNet((2, 2, 2, 2), num_classes, width=width, in_channels=in_channels, dtype=dtype,
                  seed=seed)
