"""Reference models built from ``dnnkit.nn``, trained with ``loss.backward()`` on either backend
(docs/models.md):

- :func:`resnet18`: ResNet-18 in its CIFAR form (3x32x32 input: a 3x3 stem, no max-pool, four
  stages of two residual BasicBlocks, global average pooling, a linear classifier).
- :func:`vgg_cnn`: a VGG-style CNN (seven 3x3 conv + BatchNorm + ReLU, three max-pools, a
  linear classifier).
- :class:`LSTMLanguageModel`: a word-level language model (embedding, a 2-layer LSTM, a linear
  decoder).

Each takes ``width`` (or sizes) to shrink it for tests and ``dtype``/``seed``.
"""

from .language import LSTMLanguageModel  # noqa: F401
from .resnet import BasicBlock, ResNet, resnet18  # noqa: F401
from .vgg import vgg_cnn  # noqa: F401

__all__ = ["BasicBlock", "LSTMLanguageModel", "ResNet", "resnet18", "vgg_cnn"]
