"""The two stacks bench/train_step.py times, each one GRPO step on the same model and batch: ours (minigrpo's model,
LoRA, fused log-probs and loss, as train.py) and transformers + peft with TRL's log-probs and loss; what each computes:
bench/train_step.py's docstring. build_ours / build_hf -> (model, LoRA params, step_fn); step_fn(timer) -> (loss,
params)."""
import zlib

import torch

import shapes  # bench/shapes.py
from minigrpo.pretrained import load_pretrained

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GDN_TARGETS = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]  # Qwen3.5's Gated DeltaNet


def targets(args):
    return TARGETS + (GDN_TARGETS if shapes.is_hybrid(args.shape) else [])


# ----------------------------------------------------------------------------------------------------------------
# the shared model and batch


def save_random_model(folder, args):
    """The --shape (default Qwen3-0.6B) with seeded random weights, saved as a transformers checkpoint both stacks
    load."""
    shapes.build_hf(args.shape, torch.float32, layers=args.layers).save_pretrained(folder)


def make_batch(args):
    """ids (B, T), attention mask (B, T), completion mask (B, C), advantages (B,): prompts of varied length
    left-padded to P, completions of varied length right-padded to C."""
    g = torch.Generator().manual_seed(1)
    B, P, C = args.batch, args.prompt, args.seq - args.prompt
    ids = torch.randint(0, args.vocab_size, (B, P + C), generator=g)
    prompt_len = [P - (i * P // (4 * B)) for i in range(B)]  # P, then up to a quarter shorter
    comp_len = [C - (i * C // (2 * B)) for i in range(B)]    # C, then up to half shorter
    attn = torch.zeros(B, P + C, dtype=torch.long)
    comp_mask = torch.zeros(B, C, dtype=torch.bool)
    for i in range(B):
        attn[i, P - prompt_len[i]:P + comp_len[i]] = 1
        comp_mask[i, :comp_len[i]] = True
    ids = torch.where(attn.bool(), ids, shapes.TOKENS[args.shape][1])  # pads hold <|endoftext|>, as a collate would
    adv = torch.randn(B, generator=g)
    dev = args.device
    return ids.to(dev), attn.to(dev), comp_mask.to(dev), adv.to(dev)


def init_lora_(pairs):
    """Same LoRA start in both stacks: A uniform(±1/√in) seeded by the module path (PEFT's range), B = 0."""
    with torch.no_grad():
        for path, A, Bw in pairs:
            g = torch.Generator().manual_seed(zlib.crc32(path.encode()))
            bound = A.shape[1] ** -0.5
            A.copy_((torch.rand(A.shape, generator=g) * 2 - 1) * bound)
            Bw.zero_()


# ----------------------------------------------------------------------------------------------------------------
# the two stacks: each returns (model, lora params, step_fn); step_fn(timer) -> (loss, grad_norm)


def build_ours(folder, args, dtype):
    from minigrpo import grpo
    from minigrpo.logprobs import token_logprobs
    from minigrpo.lora import adapters_disabled, inject_lora, lora_layers
    model = load_pretrained(folder, dtype=dtype, device=args.device)
    params = inject_lora(model, r=args.lora_r, alpha=2 * args.lora_r, targets=targets(args))
    init_lora_([(p, m.lora_A.weight, m.lora_B.weight) for p, m in lora_layers(model)])
    if args.grad_checkpoint:
        from minigrpo.model import enable_activation_checkpointing
        enable_activation_checkpointing(model)  # train.py --grad-checkpoint
    if args.compile_gdn:
        from minigrpo.deltanet import compile_chunk_loop
        compile_chunk_loop(model)  # train.py --compile-gdn: the Gated DeltaNet chunk loop under inductor
    ids, attn, comp_mask, adv = make_batch(args)
    P, T = args.prompt, args.seq
    loss_mask = torch.zeros(ids.shape[0], T - 1, dtype=torch.bool, device=ids.device)
    loss_mask[:, P - 1:] = comp_mask  # column t scores ids[:, t+1]: the completion starts at column P-1
    sampling = dict(temperature=args.temperature, vocab_size=args.vocab_size)
    if args.pack:
        from minigrpo.logprobs import packed_token_logprobs
        packed, pk, src, dst = pack_batch(ids, attn, loss_mask)

    def logprobs():
        if args.pack:  # train.py --pack: the rows packed into one, log-probs back in the padded layout
            return packed_token_logprobs(model, packed, pk, src, dst, loss_mask.shape, **sampling)
        return token_logprobs(model, ids, attn, **sampling,
                              first_col=P - 1)  # as train.py: logits only from the first completion column

    def step(timer):
        model.eval()
        with torch.no_grad(), adapters_disabled(model):
            ref = logprobs()
        timer("reference")
        model.train()
        logp = logprobs()
        loss, _ = grpo.policy_loss(logp, adv, loss_mask, grpo.LossSettings(beta=args.beta), against=grpo.Against(ref=ref))
        timer("policy fwd")
        loss.backward()
        timer("backward")
        return loss, params

    return model, params, step


def pack_batch(ids, attn, loss_mask):
    """The batch's rows packed into one without their padding (train.py --pack): ids (1, N), the Pack, and the
    packed columns of the loss mask's positions with their flat index in the (B, T-1) table."""
    from minigrpo.packing import pack
    real = attn.bool()
    lengths = real.sum(-1).tolist()
    first = real.float().argmax(-1)                        # each row's first real column
    starts = torch.cumsum(real.sum(-1), 0) - real.sum(-1)  # each row's first packed index
    rows, cols = loss_mask.nonzero(as_tuple=True)          # column t scores token t + 1, both real
    src = starts[rows] + cols - first[rows]
    dst = rows * loss_mask.shape[1] + cols
    return ids[real][None], pack(lengths, ids.device), src, dst


def selective_log_softmax(logits, index):
    """TRL's (trl/trainer/utils.py): fp32 gathers and subtracts a per-row logsumexp; bf16 log_softmaxes per row."""
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])  # a loop to lower the peak
        return selected - lse
    rows = [torch.log_softmax(r, dim=-1).gather(-1, i.unsqueeze(-1)).squeeze(-1) for r, i in zip(logits, index)]
    return torch.stack(rows)


def build_hf(folder, args, dtype):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(args.device)
    if args.grad_checkpoint:  # TRL's gradient_checkpointing=True (applies in train mode: the policy pass)
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(base, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                            target_modules=targets(args), task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    pre = "base_model.model."
    init_lora_([(name[len(pre):], m.lora_A["default"].weight, m.lora_B["default"].weight)
                for name, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A])
    ids, attn, comp_mask, adv = make_batch(args)
    C = args.seq - args.prompt
    completion = ids[:, -C:]

    def logprobs():
        # TRL's _get_per_token_logps: logits of the last C + 1 positions, drop the last, / temperature
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=C + 1).logits[:, :-1]  # (B, C, V)
        logits = logits / args.temperature
        logits[..., args.vocab_size:] = float("-inf")  # as ours: padding rows are never sampled
        return selective_log_softmax(logits, completion)  # (B, C)

    def step(timer):
        model.eval()
        with torch.no_grad(), model.disable_adapter():
            ref = logprobs()
        timer("reference")
        model.train()
        logp = logprobs()
        # TRL's GRPO loss (loss_type "bnpo"/"dapo" on one process: token mean over the completion mask)
        ratio = torch.exp(logp - logp.detach())
        a = adv[:, None].to(logp.dtype)
        pg = -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.2) * a)
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        per_token = pg + args.beta * kl
        loss = (per_token * comp_mask).sum() / comp_mask.sum().clamp(min=1.0)
        timer("policy fwd")
        loss.backward()
        timer("backward")
        return loss, params

    return model, params, step
