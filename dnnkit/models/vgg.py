"""A VGG-style CNN (Simonyan and Zisserman 2015, with BatchNorm): seven 3x3 convolutions, each
followed by BatchNorm and ReLU, in three blocks closed by a 2x2 max-pool, then a linear
classifier. For a 3x32x32 input and width w:

    [w, w, pool, 2w, 2w, pool, 4w, 4w, 4w, pool]  -> (4w, 4, 4) -> flatten -> linear

The convolutions have no bias: the BatchNorm after each subtracts the batch mean, so a bias
there would get a gradient of exactly zero. Names: ``features.<i>`` as torchvision's VGG,
``classifier``.
"""

from __future__ import annotations

import numpy as np

from .. import nn
from ..hints import DType
from ..nn import checks

PLAN = (1, 1, "M", 2, 2, "M", 4, 4, 4, "M")      # conv widths in units of w; M: max-pool


def vgg_cnn(num_classes: int = 10, *, width: int = 64, in_channels: int = 3,
            image_size: int = 32, dtype: DType = "float32", seed: int | None = 0) -> nn.Sequential:
    """The VGG-style CNN of the module docstring; input (N, in_channels, image_size,
    image_size) with image_size divisible by 8; output logits (N, num_classes)."""
    cls = "vgg_cnn"
    num_classes = checks.integer(cls, "num_classes", num_classes, 1)
    width = checks.integer(cls, "width", width, 1)
    image_size = checks.integer(cls, "image_size", image_size, 8)
    if image_size % 8:
        raise ValueError(f"{cls}: image_size must be divisible by 8 (three 2x2 pools); got "
                         f"{image_size}")
    rng = np.random.default_rng(checks.seed(cls, seed))
    layers, cin = [], checks.integer(cls, "in_channels", in_channels, 1)
    for item in PLAN:
        if item == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        cout = item * width
        layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False, dtype=dtype,
                             seed=int(rng.integers(0, 2**31))),
                   nn.BatchNorm2d(cout, dtype=dtype), nn.ReLU()]
        cin = cout
    side = image_size // 8
    model = nn.Sequential()
    model.features = nn.Sequential(*layers)
    model.flatten = nn.Flatten()
    model.classifier = nn.Linear(cin * side * side, num_classes, dtype=dtype,
                                 seed=int(rng.integers(0, 2**31)))
    return model
