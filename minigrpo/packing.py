"""The two layouts of a batch of token sequences: left-padded rows (`left_pad`), and packed: the sequences of a
micro-batch concatenated into one row with no padding, so every projection, norm, MLP and the lm_head run over the
sum of the lengths, not B x the longest. Inside the one row, RoPE's positions restart at each document's first
token, and what mixes tokens (attention, Gated DeltaNet's conv and delta rule) runs on a per-document grid (D, Tg):
each document at the start of its own row, zeros after it, which change nothing before them (all three are causal).
The padded path (model.hidden with an attention mask) is the naive twin: tests/model/test_packing.py checks that
the two give the same log-probs, loss and LoRA gradients to fp32 rounding. Why, and what the grid's zeros still
cost: docs/training.md, "Packed micro-batches".

Letters: N packed tokens (sum of the lengths), D documents, Tg the longest document, H hidden size.
"""
from dataclasses import dataclass

import torch

from minigrpo.attention import attend


def left_pad(seqs, pad_id, device=None):
    """Token-id lists -> ids (B, L) padded on the left with pad_id and attention mask (B, L), 1 = real token. Left
    padding puts every row's last token in the last column: where generation continues and completions end."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, L - len(s):] = 1
    return ids.to(device), mask.to(device)


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

    def attend(self, q, k, v):
        """attention.attend of packed q (1, nh, N, hd) and k, v (1, nkv, N, hd), each document on its own row of
        the grid, plain causal (no mask: after a document its row holds zeros, which no earlier token reads): a
        token attends only to its own document's earlier tokens. Returns (1, nh, N, hd)."""
        grid = lambda t: self.to_grid(t.transpose(1, 2)).transpose(1, 2)            # (D, heads, Tg, hd)
        y = attend(grid(q), grid(k), grid(v), None)                                   # (D, nh, Tg, hd)
        return self.from_grid(y.transpose(1, 2)).transpose(1, 2)

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
