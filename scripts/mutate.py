"""Mutation check of the core: does the test suite catch one-line bugs in grpo.py, logprobs.py, sampler.py, lora.py
and the update path of train.py? Not a test module (pytest collects test_*.py only); run it by hand:

    python scripts/mutate.py                      # every mutant, one at a time
    python scripts/mutate.py --only kl_k3_to_k1   # some of them (names, comma-separated)
    python scripts/mutate.py --list               # names and what each changes, nothing run
    python scripts/mutate.py --jobs 2 --timeout 900

For each mutant the repository (working tree, without .git, runs and virtualenvs) is copied to a temporary
folder, ONE snippet is replaced there, and the mutant's test files run in that copy with `pytest -x`. A failing
run = caught; a passing one = survived. A mutant is written as (name, original, replacement, tests): `original`
is an exact piece of code that must occur exactly once in minigrpo/**/*.py and the top-level scripts (it may carry
a line of context around the changed line, to be unique); it is found by search, not by file and line, so the
list survives files being moved or split. `tests` are globs or pytest node ids under tests/ (missing ones are
skipped; none found at all is an error). Survivors judged equivalent are listed in EQUIVALENT with the reason.
"""
import argparse
import concurrent.futures as cf
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "runs", "__pycache__", ".pytest_cache", "node_modules"}

# tests that measure wall time: on a loaded machine they fail by themselves, which would count as a catch
DESELECT = ["tests/tasks/test_soyuz_rollout.py::test_judging_overlaps_generation"]
# test sets, fastest-failing first (pytest -x stops at the first failure)
GOLDEN = ["tests/scripts/test_golden_lora.py", "tests/scripts/test_train.py::test_golden_tiny_run"]
GRPO = ["tests/core/test_grpo.py", "tests/core/test_losses.py", "tests/scripts/test_train_loss_flags.py",
        "tests/scripts/test_train_mask_truncated.py", *GOLDEN]
LOGPROBS = ["tests/core/test_logprobs.py", "tests/model/test_logprobs_qwen.py", *GRPO]
SAMPLER = ["tests/model/test_sampler.py", "tests/model/test_sampler_*.py", *GOLDEN]
LORA = ["tests/model/test_lora.py", "tests/model/test_lora_*.py", *GOLDEN]
TRAIN = [*GOLDEN, "tests/scripts/test_train_mask_truncated.py", "tests/tasks/test_soyuz_rollout.py"]
LOSSES = ["tests/core/test_losses.py", "tests/scripts/test_train_loss_flags.py",
          "tests/core/test_grpo.py::test_micro_batch_invariance"]
SOYUZ = ["tests/tasks/test_soyuz_rollout.py", "tests/tasks/test_revise.py", "tests/core/test_grpo.py"]
JUDGE = ["tests/judge/test_boundary.py", "tests/judge/test_suites.py", "tests/judge/test_attacks.py",
         "tests/judge/test_hostile_code.py"]

MUTANTS = [
    # ---- the GRPO update's bugs ------------------------------------------------------------------------------
    ("ref_logprobs_with_adapters_on",
     "        with adapters_disabled(model):\n            return log_probs(model, b, args, vocab_size)",
     "        with torch.no_grad():\n            return log_probs(model, b, args, vocab_size)", TRAIN),
    ("top_p_off_by_one", "drop = mass_from_here <= 1.0 - top_p", "drop = mass_from_here - q <= 1.0 - top_p",
     SAMPLER),
    ("top_k_ignored", "p = p.masked_fill(p < p[:, top_k - 1:top_k], 0.0)", "p = p", SAMPLER),
    ("top_p_not_renormalised", "q = p / p.sum(-1, keepdim=True)", "q = p", SAMPLER),
    ("kl_k3_to_k1", "return torch.exp(d) - d - 1.0", "return -d", GRPO),
    ("trainer_logprobs_without_temperature",
     "token_logprobs(model, b.ids, b.attn, temperature=args.temperature,",
     "token_logprobs(model, b.ids, b.attn, temperature=1.0,", TRAIN),
    ("recovery_coef_soyuz", "coef: float = 0.5, turn0_guard: bool = True, chunk: int = 1,",
     "coef: float = 0.25, turn0_guard: bool = True, chunk: int = 1,", SOYUZ),
    ("turn0_guard_ignored", "reward0 = score0 if guard else shaped", "reward0 = score0", SOYUZ),
    ("turn0_guard_always_off", "reward0 = score0 if guard else shaped", "reward0 = shaped", SOYUZ),
    ("recovery_coef_grpo_default", "def recovery_rewards(s_prev, s, coef=0.5):",
     "def recovery_rewards(s_prev, s, coef=0.25):", SOYUZ),
    ("raw_scores_dropped_in_grpo", "raw = s if raw_scores is None else _as_list(raw_scores)", "raw = s", GRPO),
    ("raw_scores_dropped_in_train", "scale=args.adv_scale, raw_scores=[s.score for s in all_seqs])",
     "scale=args.adv_scale)", TRAIN),
    ("normaliser_per_micro_batch", "agg=args.agg, normalizer=norm, ref_logp=ref,",
     "agg=args.agg, normalizer=None, ref_logp=ref,", TRAIN),
    ("prefill_cache_shared_between_samples", "return self._map(lambda x: x.repeat_interleave(n, dim=0))",
     "return self._map(lambda x: x.unsqueeze(1).expand(-1, n, *x.shape[1:]).flatten(0, 1))", SAMPLER),
    ("adapters_disabled_not_restoring", "            m.disabled = was", "            m.disabled = True", LORA),
    # ---- grpo.py, logprobs.py -----------------------------------------------------------------------------------
    ("kl_sign_of_log_ratio", "d = ref_logp - logp  # log(ref / pi)", "d = logp - ref_logp  # log(ref / pi)", GRPO),
    ("kl_k3_without_minus_one", "return torch.exp(d) - d - 1.0", "return torch.exp(d) - d", GRPO),
    ("kl_k1_sign", "    if kind == \"k1\":\n        return -d", "    if kind == \"k1\":\n        return d", GRPO),
    ("kl_k2_without_half", "return 0.5 * d * d", "return d * d", GRPO),
    ("clip_eps_swapped", "torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)",
     "torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_high, 1.0 + eps_low) * adv)", GRPO),
    ("clip_min_to_max", "surr = torch.minimum(ratio * adv,", "surr = torch.maximum(ratio * adv,", GRPO),
    ("ratio_inverted", "ratio = torch.exp(logp - old)  # (B, T-1); exactly 1 on-policy",
     "ratio = torch.exp(old - logp)  # (B, T-1); exactly 1 on-policy", GRPO),
    ("old_logp_ignored", "old = logp.detach() if old_logp is None else torch.where(mask, old_logp, 0.0)",
     "old = logp.detach()", GRPO),
    ("beta_ignored", "kl_loss = beta * _aggregate(kl_tok, mask, agg, normalizer)",
     "kl_loss = _aggregate(kl_tok, mask, agg, normalizer)", GRPO),
    ("kl_not_in_loss", "total = total + kl_loss", "total = total + kl_loss.detach()", GRPO),
    ("masked_mean_over_all", "return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)",
     "return torch.where(mask, x, 0.0).sum() / mask.numel()", GRPO),
    ("seq_agg_no_length_mean", "x = x.sum(-1) / mask.sum(-1).clamp(min=1)", "x = x.sum(-1)", GRPO),
    ("token_normaliser_counts_pads", "return float(sum(int(m.sum()) for m in masks))",
     "return float(sum(m.numel() for m in masks))", GRPO),
    ("seq_normaliser_counts_empty_rows", "return float(sum(int(m.any(dim=-1).sum()) for m in masks))",
     "return float(sum(m.size(0) for m in masks))", GRPO),
    ("const_normaliser_without_rows", "return float(max_tokens * sum(m.size(0) for m in masks))",
     "return float(max_tokens)", GRPO),
    ("adv_no_std", "adv[i] = (s[i] - mean) / (std + eps) if scale == \"group\" else s[i] - mean",
     "adv[i] = (s[i] - mean) if scale == \"group\" else s[i] - mean", GRPO),
    ("adv_no_bessel", "std = math.sqrt(sum((s[i] - mean) ** 2 for i in valid) / (len(valid) - 1))",
     "std = math.sqrt(sum((s[i] - mean) ** 2 for i in valid) / len(valid))", GRPO),
    ("zero_spread_test_off", "return len(valid) >= 2 and bool(rv) and max(rv) - min(rv) > 0.0",
     "return len(valid) >= 2 and bool(rv)", GRPO),
    ("failed_scores_in_baseline", "valid = [i for i in idx if s[i] is not None]",
     "valid = [i for i in idx if s[i] is not None or True]", GRPO),
    ("recovery_none_prev_shaped", "    if s_prev is None:\n        return float(s)",
     "    if s_prev is None:\n        return float(s) + coef", GRPO),
    ("fused_logits_without_temperature", "    if temperature != 1.0:\n        z = z.div_(temperature)",
     "    if temperature != 1.0:\n        z = z", LOGPROBS),
    ("fused_grad_without_temperature", "return g.div_(temperature) if temperature != 1.0 else g", "return g", LOGPROBS),
    ("chunk_logits_without_temperature", "logits = logits.div_(temperature)  # in place",
     "logits = logits  # in place", LOGPROBS),
    ("fused_vocab_mask_off", "        z[:, vocab_size:] = float(\"-inf\")", "        z[:, vocab_size:] = 0.0", LOGPROBS),
    ("logprobs_without_attention_mask",
     "h = model.hidden(input_ids, attention_mask=attention_mask)[:, first_col:-1]",
     "h = model.hidden(input_ids)[:, first_col:-1]", LOGPROBS),
    ("span_mask_off_by_one", "return (pos >= starts) & (pos < starts + lengths)",
     "return (pos > starts) & (pos <= starts + lengths)", GRPO),
    ("dpo_margin_sign", "margin = chosen - rejected", "margin = rejected - chosen", GRPO),
    ("dpo_beta_on_one_side", "rejected = beta * (policy_rejected - ref_rejected)",
     "rejected = (policy_rejected - ref_rejected)", GRPO),
    ("clip_stats_sides", "(ratio < 1.0 - eps_low) & (adv < 0), (ratio > 1.0 + eps_high) & (adv > 0)",
     "(ratio < 1.0 - eps_low) & (adv > 0), (ratio > 1.0 + eps_high) & (adv > 0)", GRPO),
    # ---- sampler.py -------------------------------------------------------------------------------------------
    ("top_k_off_by_one", "p < p[:, top_k - 1:top_k]", "p < p[:, top_k:top_k + 1]", SAMPLER),
    ("top_p_keeps_nothing_at_0", "        drop[:, 0] = False", "        pass", SAMPLER),
    ("sampling_without_temperature", "logp_all = torch.log_softmax(logits / temperature, dim=-1)  # (B, V) fp32",
     "logp_all = torch.log_softmax(logits, dim=-1)  # (B, V) fp32", SAMPLER),
    ("greedy_argmin", "token = logits.argmax(-1)", "token = logits.argmin(-1)", SAMPLER),
    ("inverse_cdf_unnormalised", "x = u[:, None] * cdf[:, -1:]", "x = u[:, None]", SAMPLER),
    ("inverse_cdf_left", "torch.searchsorted(cdf, x, right=True)", "torch.searchsorted(cdf, x, right=False)",
     SAMPLER),
    ("uniforms_half_range", "return _shr(splitmix64(keys + t), 11).double() / float(1 << 53)",
     "return _shr(splitmix64(keys + t), 12).double() / float(1 << 53)", SAMPLER),
    ("sample_keys_ignore_index", "return splitmix64(splitmix64(s)[:, None] + j).reshape(-1)",
     "return splitmix64(splitmix64(s)[:, None] + 0 * j).reshape(-1)", SAMPLER),
    ("one_seed_for_all_prompts", "else [derive_seed(seed, i) for i in range(len(prompts))]",
     "else [derive_seed(seed, 0) for i in range(len(prompts))]", SAMPLER),
    ("eos_dropped_from_completion", "end, reason = j + 1, \"eos\"", "end, reason = j, \"eos\"", SAMPLER),
    ("stop_string_token_dropped", "return j + 1, \"stop\"", "return j, \"stop\"", SAMPLER),
    ("vocab_padding_sampled", "vocab_logits = logits if vocab_size is None else logits[:, :vocab_size]",
     "vocab_logits = logits", SAMPLER),
    ("logprob_at_T1_when_sampling_at_T", "return token, logp_all.gather(-1, token[:, None]).squeeze(-1)",
     "return token, torch.log_softmax(logits, -1).gather(-1, token[:, None]).squeeze(-1)", SAMPLER),
    ("compaction_keeps_finished_rows", "keep = [i for i, r in enumerate(live) if r not in ended]",
     "keep = [i for i, r in enumerate(live)]", SAMPLER),
    ("stop_window_too_short", "self.window = max((len(s.encode()) for s in self.strings), default=0) + 1",
     "self.window = max((len(s.encode()) for s in self.strings), default=0) - 1", SAMPLER),
    ("text_keeps_eos", "text = tokenizer.decode(ids[:-1] if reason == \"eos\" else ids)",
     "text = tokenizer.decode(ids)", SAMPLER),
    ("left_pad_right", "ids[i, L - len(s):] = torch.tensor(s, dtype=torch.long)",
     "ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)", [*SAMPLER, *TRAIN]),
    ("left_pad_attends_pads", "        mask[i, L - len(s):] = 1", "        mask[i, :] = 1", [*SAMPLER, *TRAIN]),
    # ---- lora.py ----------------------------------------------------------------------------------------------
    ("adapters_never_disabled", "    for m in layers:\n        m.disabled = True",
     "    for m in layers:\n        m.disabled = False", LORA),
    ("lora_scale_inverted", "self.r, self.alpha, self.scale = r, alpha, alpha / r",
     "self.r, self.alpha, self.scale = r, alpha, r / alpha", LORA),
    ("lora_merged_counted_twice", "if self.disabled or self.merged:", "if self.disabled:", LORA),
    ("lora_B_init_nonzero", "nn.init.zeros_(self.lora_B.weight)", "nn.init.ones_(self.lora_B.weight)", LORA),
    ("lora_A_init_other_gain", "nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))",
     "nn.init.kaiming_uniform_(self.lora_A.weight, a=1.0)", LORA),
    ("lora_dropout_skipped", "delta = self.lora_B(self.lora_A(self.dropout(x.float()))) * self.scale",
     "delta = self.lora_B(self.lora_A(x.float())) * self.scale", LORA),
    ("lora_branch_in_model_dtype", "delta = self.lora_B(self.lora_A(self.dropout(x.float()))) * self.scale",
     "delta = self.lora_B(self.lora_A(self.dropout(x.float())).to(x.dtype).float()) * self.scale", LORA),
    ("delta_weight_unscaled", "return (self.lora_B.weight @ self.lora_A.weight) * self.scale",
     "return (self.lora_B.weight @ self.lora_A.weight)", LORA),
    ("merge_subtracts", "m.base_layer.weight.add_(m.delta_weight().to(m.base_layer.weight.dtype))",
     "m.base_layer.weight.sub_(m.delta_weight().to(m.base_layer.weight.dtype))", LORA),
    ("unmerge_keeps_flag", "            m.merged = False", "            m.merged = True", LORA),
    ("base_not_frozen", "    for p in model.parameters():\n        p.requires_grad_(False)",
     "    for p in model.parameters():\n        p.requires_grad_(True)", LORA),
    ("merged_export_without_delta", "w = p if layer.merged else p + layer.delta_weight().to(p.dtype)", "w = p", LORA),
    ("adapter_load_no_copy", "        param.copy_(loaded[key])", "        pass", LORA),
    ("peft_default_segment_kept", "key = key[len(PEFT_PREFIX):].replace(\".default.\", \".\")",
     "key = key[len(PEFT_PREFIX):]", LORA),
    ("adapter_multimodal_prefix_kept", "        key = \"model.\" + key[len(\"model.language_model.\"):]\n    return key",
     "        key = key\n    return key", LORA),
    ("adapter_alpha_saved_as_r", "\"r\": cfg[\"r\"], \"lora_alpha\": cfg[\"lora_alpha\"],",
     "\"r\": cfg[\"r\"], \"lora_alpha\": cfg[\"r\"],", LORA),
    # ---- train.py: the update path ----------------------------------------------------------------------------
    ("mask_truncated_not_passed",
     "batches = [collate(mb, tok.pad_id, device, args.mask_truncated) for mb in micro_batches(my_seqs, args.micro_batch)]",
     "batches = [collate(mb, tok.pad_id, device) for mb in micro_batches(my_seqs, args.micro_batch)]", TRAIN),
    ("collate_mask_off_by_one", "loss_mask = grpo.span_mask([T - c for c in lengths], trained, T)",
     "loss_mask = grpo.span_mask([T - 1 - c for c in lengths], trained, T)", TRAIN),
    ("collate_masks_everything_truncated", "0 if mask_truncated and s.finish_reason == \"length\" else c",
     "0 if mask_truncated and s.finish_reason != \"eos\" else c", TRAIN),
    ("collate_sampled_shifted", "sampled[i, T - 1 - c:] = torch.tensor(s.logprobs, dtype=torch.float32)",
     "sampled[i, T - 1 - c:] = torch.tensor(s.logprobs[1:] + [0.0], dtype=torch.float32)", TRAIN),
    ("logits_start_one_late", "first_col = T - 1 - max(lengths)", "first_col = T - max(lengths)", TRAIN),
    ("behaviour_logprobs_not_kept", "olds = [log_probs(model, b, args, V) if args.mu > 1 else None for b in batches]",
     "olds = [None for b in batches]", TRAIN),
    ("reference_skipped_when_beta_positive", "    if args.beta == 0:\n        return None",
     "    if args.beta >= 0:\n        return None", TRAIN),
    ("no_zero_grad_between_passes", "        model.train()\n        opt.zero_grad(set_to_none=True)",
     "        model.train()\n        pass", TRAIN),
    ("scheduler_not_stepped", "        opt.step()\n    sched.step()", "        opt.step()\n    pass", TRAIN),
    ("grad_clip_off", "clip = args.max_grad_norm if args.max_grad_norm > 0 else float(\"inf\")",
     "clip = float(\"inf\")", TRAIN),
    ("advantages_per_example_not_turn", "keys = [(s.example_id, s.turn) for s in all_seqs]",
     "keys = [(s.example_id, 0) for s in all_seqs]", TRAIN),
    ("advantage_scale_ignored", "group_ids=[ids[k] for k in keys],\n                                       scale=args.adv_scale,",
     "group_ids=[ids[k] for k in keys],\n                                       scale=\"none\",", TRAIN),
    ("kl_kind_ignored", "kl_kind=args.kl, max_tokens=args.max_new_tokens, loss=args.loss,",
     "kl_kind=\"k1\", max_tokens=args.max_new_tokens, loss=args.loss,", TRAIN),
    ("eps_high_from_eps_low", "eps_high=args.gspo_eps_high if gspo else args.eps_high,",
     "eps_high=args.gspo_eps_high if gspo else args.eps_low,", TRAIN),
    # ---- losses.py: the loss menu, the importance-sampling correction; the overlong penalty ------------------
    ("gspo_sequence_sum", "return torch.where(mask, logp - old, 0.0).sum(-1, keepdim=True) / n",
     "return torch.where(mask, logp - old, 0.0).sum(-1, keepdim=True)", LOSSES),
    ("gspo_token_no_stop_gradient", "s_seq = torch.exp(sequence_log_ratio(logp, old, mask)).detach()",
     "s_seq = torch.exp(sequence_log_ratio(logp, old, mask))", LOSSES),
    ("gspo_token_gradient_of_old", "ratio = s_seq * torch.exp(logp - logp.detach())",
     "ratio = s_seq * torch.exp(logp.detach() - logp.detach())", LOSSES),
    ("gspo_sequence_clip_optimistic", "s = torch.exp(sequence_log_ratio(logp, old, mask))  # (B, 1)",
     "s = torch.exp(sequence_log_ratio(logp, old, mask)).clamp(max=1.0)  # (B, 1)", LOSSES),
    ("cispo_no_stop_gradient", "ratio = torch.exp(logp - old).detach()", "ratio = torch.exp(logp - old)", LOSSES),
    ("cispo_clip_sides_swapped", "weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)",
     "weight = torch.clamp(ratio, 1.0 - eps_high, 1.0 + eps_low)", LOSSES),
    ("cispo_ppo_clip", "return -weight * adv * logp, ratio,",
     "return -torch.where(weight == ratio, weight, 0.0) * adv * logp, ratio,", LOSSES),
    ("is_weight_inverted", "d = torch.where(mask, old - sampler_logp, 0.0).detach()",
     "d = torch.where(mask, sampler_logp - old, 0.0).detach()", LOSSES),
    ("is_weight_reads_masked", "d = torch.where(mask, old - sampler_logp, 0.0).detach()",
     "d = (old - sampler_logp).detach()", LOSSES),
    ("is_sequence_mean", "d = d.sum(-1, keepdim=True)  # log of the sequence's ratio",
     "d = d.mean(-1, keepdim=True)  # log of the sequence's ratio", LOSSES),
    ("tis_cap_as_floor", "return torch.clamp(w, max=cap)", "return torch.clamp(w, min=cap)", LOSSES),
    ("mis_strict", "return torch.where(w <= cap, w, 0.0)", "return torch.where(w < cap, w, 0.0)", LOSSES),
    ("mis_unweighted", "return torch.where(w <= cap, w, 0.0)", "return torch.where(w <= cap, 1.0, 0.0)", LOSSES),
    ("is_weight_with_gradient", "        pg_tok = pg_tok * w\n",
     "        pg_tok = pg_tok * w * torch.exp(logp - logp.detach())\n", LOSSES),
    ("overlong_slope_over_max", "return max((free - length) / buffer, -1.0)",
     "return max((free - length) / max_new_tokens, -1.0)", LOSSES),
    ("overlong_starts_late", "    free = max_new_tokens - buffer  # the longest completion",
     "    free = max_new_tokens - buffer + 1  # the longest completion",
     LOSSES),
    ("overlong_on_the_score", "s.reward, s.info[\"overlong_penalty\"] = s.reward + penalty, penalty",
     "s.reward, s.score, s.info[\"overlong_penalty\"] = s.reward + penalty, s.reward + penalty, penalty", LOSSES),
    ("overlong_not_applied", "        overlong_shaping(all_seqs, args)", "        pass", LOSSES),
    ("loss_flag_ignored", "max_tokens=args.max_new_tokens, loss=args.loss,",
     "max_tokens=args.max_new_tokens, loss=\"grpo\",", LOSSES),
    ("gspo_eps_ignored", "eps_low=args.gspo_eps_low if gspo else args.eps_low,", "eps_low=args.eps_low,", LOSSES),
    ("is_flag_ignored", "sampler_logp=b.sampled, is_correction=args.is_correction,",
     "sampler_logp=b.sampled, is_correction=\"none\",", LOSSES),
    ("top_p_allowed", "    if args.top_p < 1.0 or args.top_k > 0:", "    if args.top_p < 0:", LOSSES),
    ("is_cap_below_one", "if not (math.isfinite(args.is_cap) and args.is_cap >= 1.0):",
     "if not math.isfinite(args.is_cap):", LOSSES),
    # ---- the judge's trust boundary: each rule broken on its own ----------------------------------------------
    ("driver_serves_attributes",
     "        if op == \"getattr\":     # the answer sees what an object without that attribute would give it",
     "        if op == \"getattr\":\n            return getattr(target, str(message[\"name\"]))", JUDGE),
    ("driver_codec_not_call_only", "super().__init__(\"d\", rfile, wfile, make_proxy, handle, call_only=True)",
     "super().__init__(\"d\", rfile, wfile, make_proxy, handle, call_only=False)", JUDGE),
    ("dunder_names_cross", "k.isidentifier() and not k.startswith(\"_\")", "k.isidentifier()", JUDGE),
    ("driver_runs_unconfined", "limits, keep_fds=[child.fileno()]) as sb:",
     "limits, keep_fds=[child.fileno()], _mode=\"plain\") as sb:", JUDGE),
    ("no_answer_budget", "ANSWER_BUDGET = 1.5 ", "ANSWER_BUDGET = 100.0 ", JUDGE),
    ("no_stall_detection", "STALL_S = 3.0 ", "STALL_S = 1e9 ", JUDGE),
    ("no_import_limit", "IMPORT_CPU_S = 3.0 ", "IMPORT_CPU_S = 100.0 ", JUDGE),
    ("unimported_answer_graded_on", "        if not imports:\n", "        if False:\n", JUDGE),
    ("only_if_ignored", "out[c[\"id\"]].passed is True and out.get(other, _UNCHECKED).passed is not True",
     "False", JUDGE),
    ("sqlite_authorizer_off", "    conn.set_authorizer(_authorize)\n", "", JUDGE),
    ("driver_reasons_not_vetted", "    if any(p.fullmatch(reason) for p in _REASONS):",
     "    if True:", JUDGE),
    ("broker_trusts_driver_limits", "seconds = max(0.05, min(seconds, float(cpu_s)))",
     "seconds = max(0.05, float(cpu_s))", JUDGE),
]

# Survivors judged equivalent (no behaviour change a test could see), with the reason.
EQUIVALENT = {
    "inverse_cdf_left": "searchsorted left vs right differ only when x = u * total equals a cdf value exactly; u "
                        "lies on a 2^-53 grid, so that happens with probability ~2^-53 per draw, and then both "
                        "picks are tokens with p > 0 (except u = 0 before a leading zero-probability id)",
}


def sources(root):
    """The files a snippet is searched in: the package and the top-level scripts."""
    files = glob.glob(os.path.join(root, "minigrpo", "**", "*.py"), recursive=True)
    return sorted(files + glob.glob(os.path.join(root, "*.py")))


def locate(root, original):
    hits = [(f, open(f, encoding="utf-8").read().count(original)) for f in sources(root)]
    hits = [(f, n) for f, n in hits if n]
    if sum(n for _, n in hits) != 1:
        where = ", ".join(f"{os.path.relpath(f, root)} x{n}" for f, n in hits) or "nowhere"
        raise LookupError(f"snippet found {sum(n for _, n in hits)} times ({where}): {original[:70]!r}")
    return hits[0][0]


def test_args(root, patterns):
    out = []
    for pat in patterns:
        path, _, node = pat.partition("::")
        found = sorted(glob.glob(os.path.join(root, path)))
        out += [os.path.relpath(f, root) + (f"::{node}" if node else "") for f in found]
    return list(dict.fromkeys(out))


def copy_tree(dst):
    def ignore(folder, names):
        return [n for n in names if n in SKIP_DIRS or n.startswith(".venv") or n.endswith(".pyc")]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def run_one(mutant, timeout):
    name, original, replacement, tests = mutant
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        root = os.path.join(tmp, "repo")
        copy_tree(root)
        try:
            path = locate(root, original)
        except LookupError as e:
            return name, "not found", str(e), 0.0
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(original, replacement))
        files = test_args(root, tests)
        if not files:
            return name, "no tests", f"none of {tests} exists", 0.0
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files]
        cmd += [f"--deselect={d}" for d in DESELECT]
        try:
            out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return name, "timeout", f"over {timeout}s ({os.path.relpath(path, root)})", time.time() - t0
        tail = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))][:1]
        if out.returncode == 0:
            status = "equivalent" if name in EQUIVALENT else "SURVIVED"
            detail = EQUIVALENT.get(name, f"{os.path.relpath(path, root)}: {' '.join(files)}")
        elif out.returncode in (1, 2):
            status, detail = "caught", (tail[0] if tail else out.stdout.strip().splitlines()[-1])[:110]
        else:
            status, detail = f"error rc={out.returncode}", (out.stdout + out.stderr)[-300:]
        return name, status, detail, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mutant")
    args = ap.parse_args()
    names = [m[0] for m in MUTANTS]
    assert len(names) == len(set(names)), "mutant names must be unique"
    chosen = MUTANTS
    if args.only:
        want = args.only.split(",")
        unknown = [w for w in want if w not in names]
        if unknown:
            raise SystemExit(f"mutate.py: unknown mutants {unknown}; --list shows them")
        chosen = [m for m in MUTANTS if m[0] in want]
    if args.list:
        for name, original, replacement, _ in chosen:
            where = locate(ROOT, original)
            print(f"{name:40s} {os.path.relpath(where, ROOT)}: {original.strip()[:60]!r} -> {replacement.strip()[:60]!r}")
        return
    results = []
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for name, status, detail, secs in pool.map(lambda m: run_one(m, args.timeout), chosen):
            print(f"{status:12s} {name:40s} {secs:6.0f}s  {detail}", flush=True)
            results.append((name, status))
    counts = {}
    for _, status in results:
        counts[status] = counts.get(status, 0) + 1
    print(f"\n{len(results)} mutants: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    survivors = [n for n, s in results if s not in ("caught", "equivalent")]
    if survivors:
        print("not caught: " + ", ".join(survivors))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
