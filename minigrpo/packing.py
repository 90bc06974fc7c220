"""Packed micro-batches: the sequences of a micro-batch concatenated into one row, with no padding.

A padded micro-batch runs every layer over B x (its longest sequence) tokens; packed, the layers run over the
sum of the sequences' lengths. What keeps the sequences ("documents") apart inside the one row:

  attention     a document mask: a token attends only to its own document's earlier tokens (block-diagonal causal)
  RoPE          positions restart at 0 at each document's first token, as a left-padded row's do
  Gated DeltaNet
                the projections run packed; the short conv and the delta rule, whose state must start from zero at
                each document, run on a per-document grid (D, Tg): document d's tokens at [0, len_d) of row d, the
                rest zero. A zero input at the end of a row changes nothing before it (both are causal), each row
                starts from a zero conv window and a zero state, and the chunk loop still runs Tg / 64 times however
                many documents there are. The grid is the only place the documents are laid side by side; its
                zeros cost elementwise and chunk work, no projection or MLP FLOP.

The padded path (model.hidden with an attention mask) is the naive twin: tests/model/test_packing.py checks that
the two give the same log-probs, loss and LoRA gradients to fp32 rounding.

Letters: N packed tokens (sum of the lengths), D documents, Tg the longest document, H hidden size.
"""
from dataclasses import dataclass

import torch


@dataclass
class Pack:
    """Where each packed token belongs; built once per micro-batch (`pack`), read by every layer."""
    lengths: list              # tokens of each document, in packing order
    doc: torch.Tensor          # (N,) long: each token's document
    positions: torch.Tensor    # (1, N) long: each token's position in its document (RoPE)
    grid: torch.Tensor         # (N,) long: each token's flat index in the (D, Tg) grid, d * Tg + position

    @property
    def grid_shape(self):
        return len(self.lengths), max(self.lengths)

    def attention_mask(self):
        """(1, 1, N, N) bool, True = may attend: causal inside a document, nothing across documents."""
        n = torch.arange(self.doc.shape[0], device=self.doc.device)
        same = self.doc[:, None] == self.doc[None, :]
        return (same & (n[None, :] <= n[:, None]))[None, None]

    def to_grid(self, x):
        """(1, N, ...) packed -> (D, Tg, ...): each document at the start of its own row, zeros after it."""
        D, Tg = self.grid_shape
        flat = x.new_zeros(D * Tg, *x.shape[2:]).index_copy(0, self.grid, x[0])
        return flat.view(D, Tg, *x.shape[2:])

    def from_grid(self, y):
        """(D, Tg, ...) -> (1, N, ...): the documents' tokens back in packing order."""
        return y.reshape(-1, *y.shape[2:]).index_select(0, self.grid)[None]


def pack(lengths, device=None) -> Pack:
    """The Pack of documents of these lengths (each >= 1), concatenated in the given order."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"pack: every document needs at least one token, got lengths {lengths}")
    lens = torch.tensor(lengths, dtype=torch.long)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lens)                    # (N,)
    starts = torch.cumsum(lens, 0) - lens                                             # (D,)
    pos = torch.arange(int(lens.sum())) - starts[doc]                                 # (N,)
    grid = doc * int(lens.max()) + pos
    return Pack(list(lengths), doc.to(device), pos[None].to(device), grid.to(device))


def completion_columns(lengths, completion_lengths, T):
    """Where the log-probs of each document's completion sit, packed and padded: (src, dst) long tensors, src
    the packed columns (column c scores packed token c + 1), dst the flat index into a left-padded (D, T - 1)
    log-prob table (train.py's collate layout, whose completions end at the last column)."""
    src, dst = [], []
    end = 0
    for d, (n, c) in enumerate(zip(lengths, completion_lengths)):
        end += n
        src.append(torch.arange(end - 1 - c, end - 1))                 # a completion's c scoring columns
        dst.append(torch.arange(T - 1 - c, T - 1) + d * (T - 1))
    return torch.cat(src), torch.cat(dst)
