"""A word-level LSTM language model (Zaremba et al. 2014; PyTorch's word_language_model
example): embedding, dropout, a multi-layer LSTM, dropout, a linear decoder to the vocabulary.

    logits, (hy, cy) = model(ids, hidden)      ids (T, N) token ids, time-major
                                               logits (T, N, vocab)

Train it with truncated backpropagation through time: pass the returned state, detached, to
the next batch's call.
"""

from __future__ import annotations

import numpy as np

from .. import nn
from ..hints import ArrayLike, DType
from ..nn import checks
from ..tensors import Tensor


class LSTMLanguageModel(nn.Module):
    """``LSTMLanguageModel(vocab, embed, hidden, layers=2, dropout=0.5)``: names ``encoder``
    (Embedding), ``rnn`` (LSTM), ``decoder`` (Linear), as PyTorch's example. ``dropout``
    applies to the embeddings and to the LSTM's output (0 turns it off)."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int = 2,
                 dropout: float = 0.5, *, dtype: DType = "float32", seed: int | None = 0) -> None:
        super().__init__()
        cls = "LSTMLanguageModel"
        self.vocab = checks.integer(cls, "vocab", vocab, 1)
        seeds = np.random.default_rng(checks.seed(cls, seed)).integers(0, 2**31, 5)
        self.encoder = nn.Embedding(vocab, embed, dtype=dtype, seed=int(seeds[0]))
        self.drop = nn.Dropout(dropout, seed=int(seeds[1]))
        self.rnn = nn.LSTM(embed, hidden, layers, dtype=dtype, seed=int(seeds[2]))
        self.drop_out = nn.Dropout(dropout, seed=int(seeds[3]))
        self.decoder = nn.Linear(hidden, vocab, dtype=dtype, seed=int(seeds[4]))

    def forward(self, ids: ArrayLike,
                hidden: tuple[ArrayLike | None, ArrayLike | None] | None = None
                ) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
        hx, cx = (None, None) if hidden is None else hidden
        x = self.drop(self.encoder(ids))
        y = self.drop_out(self.rnn(x, hx, cx))
        return self.decoder(y), (self.rnn.hy, self.rnn.cy)
