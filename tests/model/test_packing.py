"""Packed micro-batches (minigrpo/packing.py) against the padded path, their naive twin: the same log-probs, loss
and LoRA gradients to fp32 rounding, in both families (Qwen3: attention only; Qwen3.5: Gated DeltaNet + attention),
on documents that cross the delta rule's 64-token chunks and documents of one or two tokens.

The bounds come from the spread measured on the project's CPU box at OMP_NUM_THREADS=1 and 2, seeds 0 and 1, LoRA A
drawn seeded and unseeded (docs/training.md, "Packed micro-batches"): the largest log-prob difference 1.9e-6, the largest gradient
difference 9.2e-6 of the largest gradient; each bound is about 10x that. A document that leaked into another
(no document mask, positions running on, a state carried across) moves log-probs by 1e-2 or more."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minigrpo import grpo
from minigrpo.lora import inject_lora, lora_layers
from minigrpo.packing import completion_columns, pack
from minigrpo.pretrained import load_pretrained
from minigrpo.tasks.base import Seq
from minigrpo.update import collate, log_probs

KINDS = ["tiny", "tiny-qwen3.5"]
LOGP_BOUND = 2e-5     # |packed - padded| on trained positions (measured <= 1.9e-6)
GRAD_BOUND = 1e-4     # max |packed - padded| over LoRA gradients, relative to the largest (measured <= 9.2e-6)
SHAPES = [(40, 150), (7, 3), (70, 60), (1, 1), (30, 90)]   # (prompt, completion): 190 tokens = 3 chunks, 2 tokens


def rollout(seed, vocab=200):
    g = torch.Generator().manual_seed(seed)
    out = []
    for P, C in SHAPES:
        ids = torch.randint(0, vocab, (P + C,), generator=g).tolist()
        sampled = (torch.randn(C, generator=g) * 0.1 - 2).tolist()
        out.append(Seq("x", 0, ids[:P], ids[P:], sampled, "eos", "", 1.0, 1.0,
                       advantage=float(torch.randn(1, generator=g))))
    return out


def policy(kind, seed):
    model = load_pretrained(kind)
    torch.manual_seed(seed)  # LoRA's A init draws from the global generator
    params = inject_lora(model, r=4, alpha=8)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # B = 0 at init: give the adapters a value so that their gradients are all non-zero
        for _, m in lora_layers(model):
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * 0.05)
    return model, params


def step(model, params, batches, norm):
    """train.py's micro-batch step in short: log-probs, GRPO loss with a KL term, backward; the gradients summed."""
    for p in params:
        p.grad = None
    out, total = [], 0.0
    for b in batches:
        logp, ent = log_probs(model, b, 1.0, 256, entropy=True)
        loss, _ = grpo.policy_loss(logp, b.adv, b.mask, grpo.LossSettings(beta=0.04), norm,
                                   grpo.Against(old=b.sampled, ref=logp.detach() - 0.01))
        loss.backward()
        out.append((logp.detach(), ent))
        total += float(loss.detach())
    return out, total, [p.grad.clone() for p in params]


def grad_gap(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) / max(float(y.abs().max()) for y in b)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_packed_equals_padded(kind, seed):
    model, params = policy(kind, seed)
    seqs = rollout(seed)
    norm = float(sum(len(s.completion_ids) for s in seqs))
    (pad,), loss_pad, g_pad = step(model, params, [collate(seqs, 0, "cpu")], norm)
    packed = collate(seqs, 0, "cpu", packed=True)
    (pk,), loss_pk, g_pk = step(model, params, [packed], norm)
    mask = packed.mask
    assert packed.packed.ids.shape[1] == sum(P + C for P, C in SHAPES)   # no padding in the packed row
    assert float((pad[0] - pk[0])[mask].abs().max()) < LOGP_BOUND
    assert float((pad[1] - pk[1])[mask].abs().max()) < LOGP_BOUND       # entropy, as logged
    assert abs(loss_pad - loss_pk) < LOGP_BOUND
    assert grad_gap(g_pk, g_pad) < GRAD_BOUND


@pytest.mark.parametrize("kind", KINDS)
def test_packed_document_equals_the_document_alone(kind):
    """Each document of a pack scores as if it were the only one: nothing crosses a document boundary (the
    attention mask, RoPE's positions, the conv window and the delta rule's state)."""
    model, params = policy(kind, 0)
    seqs = rollout(0)
    norm = float(sum(len(s.completion_ids) for s in seqs))
    alone, _, g_alone = step(model, params, [collate([s], 0, "cpu") for s in seqs], norm)
    packed = collate(seqs, 0, "cpu", packed=True)
    (pk,), _, g_pk = step(model, params, [packed], norm)
    for i, (lp, _) in enumerate(alone):
        n = lp.shape[1]
        keep = packed.mask[i, -n:]
        assert float((pk[0][i, -n:] - lp[0])[keep].abs().max()) < LOGP_BOUND, f"document {i}"
    assert grad_gap(g_pk, g_alone) < GRAD_BOUND


def test_pack_layout():
    p = pack([3, 1, 2])
    assert p.doc.tolist() == [0, 0, 0, 1, 2, 2]
    assert p.positions.tolist() == [[0, 1, 2, 0, 0, 1]]        # RoPE restarts at each document
    x = torch.arange(6.0)[None, :, None]
    grid = p.to_grid(x)
    assert grid[..., 0].tolist() == [[0, 1, 2], [3, 0, 0], [4, 5, 0]]   # each document at the start of its row
    assert torch.equal(p.from_grid(grid), x)
    src, dst = completion_columns([3, 1, 2], [2, 0, 1], T=4)   # padded width 4: log-prob table (3, 3)
    assert src.tolist() == [0, 1, 4] and dst.tolist() == [1, 2, 8]
    with pytest.raises(ValueError, match="at least one token"):
        pack([2, 0])


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def ops_of_update(model, params, seqs):
    """Ops of the packed step, the collate (host work, once per micro-batch) apart."""
    b = collate(seqs, 0, "cpu", packed=True)
    with CountOps() as c:
        step(model, params, [b], 1.0)
    return c.n


@pytest.mark.parametrize("kind", KINDS)
def test_packed_update_runs_the_same_ops_for_more_documents(kind):
    """The packed forward and backward dispatch as many ops for six documents as for two of the same longest
    length: no per-document work (the delta rule's chunk loop runs over the longest document's chunks, once)."""
    model, params = policy(kind, 0)
    two, six = rollout(0)[:1] * 2, rollout(0)[:1] * 6
    assert ops_of_update(model, params, two) == ops_of_update(model, params, six)


def test_train_pack_flag_packs_the_update(monkeypatch):
    """train.py --pack reaches the update: every micro-batch policy_update builds is packed, and its step equals
    the padded one's (same gradient norm to fp32 rounding)."""
    import argparse

    import train
    from minigrpo.run.dist import Dist
    built, norms = [], {}
    real_collate = train.collate
    monkeypatch.setattr(train, "collate", lambda *a, **k: built.append(real_collate(*a, **k)) or built[-1])
    tok = argparse.Namespace(pad_id=0, vocab_size=256)
    for pack_flag in (False, True):
        model, params = policy("tiny-qwen3.5", 0)
        opt = torch.optim.SGD(params, lr=0.0)
        up = train.Updater(model, None, params, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                           grpo.LossSettings(beta=0.04))
        args = argparse.Namespace(temperature=1.0, micro_batch=2, mask_truncated=False, pack=pack_flag, mu=1,
                                  max_grad_norm=1.0, routing_replay=True)
        built.clear()
        _, norms[pack_flag] = train.policy_update(up, rollout(0), args, Dist(), tok)
        assert len(built) == 3 and all((b.packed is not None) == pack_flag for b in built)
    assert norms[True] == pytest.approx(norms[False], rel=GRAD_BOUND)
