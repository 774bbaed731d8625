#!/usr/bin/env python3
"""Independent PyTorch reference for cascade-learner's GRPO loss and AdamW.

Writes tests/fixtures/grpo/ (small, committed): a tiny stand-in causal LM's weights, a batch of
rollout groups in the Rust `RolloutGroup` JSON layout, and for several GRPO settings the loss
and the gradient of every weight, computed with the formula of TRL's GRPOTrainer
(`_compute_loss`: coef_1 = exp(logp - old_logp), coef_2 = clamp(coef_1, 1 - eps_low,
1 + eps_high), per_token_loss = -min(coef_1 * A, coef_2 * A), times the truncated importance
weight when enabled, plus beta * k3 KL; loss_type "dapo"/"bnpo" = token-level, "grpo" =
sequence-level), and torch.optim.AdamW + clip_grad_norm_ trajectories. The Rust tests in
learner/tests/ compare against these files; Python is not needed at test time.

Usage: python scripts/grpo_reference.py [--out tests/fixtures/grpo]
       python scripts/grpo_reference.py --self-check   (used by scripts/setup-torch-ref.sh)
Environment: scripts/setup-torch-ref.sh prints the python to use.

Besides the stand-in model, a tiny transformers Qwen3ForCausalLM (config + weights in
qwen3/) checks the same objective through cascade_shared::model::CausalLm.

The stand-in LM (defined identically in learner/tests/common/mod.rs), per sequence x_0..x_{t-1}:
  e_i = E[x_i]; c_i = mean_{j<=i} e_j; h_i = tanh(e_i + c_i M^T); logits_i = h_i U^T
with E = embed.weight (V, D), M = mix.weight (D, D), U = lm_head.weight (V, D).
Each sequence is run unpadded here (the Rust side pads), so padding bugs cannot cancel out.
"""
import argparse
import json
import os
import sys


def install_shim():
    """transformers 4.51.3 on Debian's torch 1.13: stub the few torch attributes it touches at
    import (scripts/hf_shim.py, shared with the other fixture generators)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hf_shim  # noqa: F401


def self_check():
    install_shim()
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    print("ok")



V, D = 32, 16
SEED = 1234


def stand_in_logprobs(W, ids):
    """log p(ids[i+1] | ids[..=i]) for one unpadded sequence, shape (t-1,)."""
    import torch
    x = W["embed.weight"][ids]                                   # (t, D)
    counts = torch.arange(1, len(ids) + 1, dtype=torch.float32)[:, None]
    prefix = torch.cumsum(x, dim=0) / counts                     # (t, D)
    h = torch.tanh(x + prefix @ W["mix.weight"].T)
    logits = h @ W["lm_head.weight"].T                           # (t, V)
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, ids[1:, None]).squeeze(1)


def make_weights(gen, scale):
    import torch
    return {
        "embed.weight": torch.randn(V, D, generator=gen) * scale,
        "mix.weight": torch.randn(D, D, generator=gen) * (scale / D ** 0.5),
        "lm_head.weight": torch.randn(V, D, generator=gen) * scale,
    }


def make_groups(gen, W, logprobs_fn=None):
    """Three groups of four samples with varied lengths, rewards and finish reasons."""
    import torch
    specs = [
        # (prompt length, [(response length, reward, finish)])
        (3, [(5, 1.0, "stop"), (2, 0.0, "stop"), (7, 0.0, "length"), (4, 1.0, "stop")]),
        (5, [(1, 0.5, "stop"), (3, 0.0, "stop"), (6, 1.0, "stop"), (2, 0.25, "stop")]),
        (4, [(6, 0.0, "length"), (4, 1.0, "stop"), (3, 1.0, "stop"), (5, 0.0, "stop")]),
    ]
    groups = []
    for g, (plen, samples) in enumerate(specs):
        prompt = torch.randint(0, V, (plen,), generator=gen)
        out = []
        for rlen, reward, finish in samples:
            resp = torch.randint(0, V, (rlen,), generator=gen)
            with torch.no_grad():
                lp = (logprobs_fn or stand_in_logprobs)(W, torch.cat([prompt, resp]))[plen - 1:]
            # The behaviour policy differs from the current one so that ratios leave the clip range.
            behaviour = (lp + 0.4 * torch.randn(rlen, generator=gen)).float()
            out.append({
                "response_ids": resp.tolist(),
                "behaviour_logprobs": [float(v) for v in behaviour],
                "policy_versions": [{"start_token": 0, "version": 3}],
                "finish_reason": finish,
                "reward": reward,
                "reward_breakdown": [["math", reward]],
                "timing": {"generate_ms": 0.0, "reward_ms": 0.0},
            })
        groups.append({
            "stage": "math", "stage_index": 1, "prompt_id": 100 + g, "mode": "think",
            "actor_id": 0, "prompt_ids": prompt.tolist(), "samples": out,
        })
    return groups


def trl_grpo_loss(W, W_ref, groups, cfg, logprobs_fn=None):
    """The GRPO objective in TRL's layout: completions padded to (B, C) with a completion mask."""
    import torch
    logprobs_fn = logprobs_fn or stand_in_logprobs
    lps, olds, refs, masks, advs = [], [], [], [], []
    for grp in groups:
        rewards = torch.tensor([s["reward"] for s in grp["samples"]], dtype=torch.float32)
        mean = rewards.mean()
        centred = rewards - mean
        if cfg["scale_by_std"]:
            adv = centred / (rewards.std() + cfg["advantage_eps"])
        else:
            adv = centred
        prompt = torch.tensor(grp["prompt_ids"])
        plen = len(prompt)
        for s, a in zip(grp["samples"], adv):
            ids = torch.cat([prompt, torch.tensor(s["response_ids"])])
            lps.append(logprobs_fn(W, ids)[plen - 1:])
            with torch.no_grad():
                refs.append(logprobs_fn(W_ref, ids)[plen - 1:])
            olds.append(torch.tensor(s["behaviour_logprobs"], dtype=torch.float32))
            truncated = s["finish_reason"] == "length" and cfg["mask_truncated"]
            keep = 0.0 if (truncated or s["finish_reason"] == "abort") else 1.0
            masks.append(torch.full((len(ids) - plen,), keep))
            advs.append(a)
    C = max(len(x) for x in lps)
    pad = lambda xs: torch.stack([torch.nn.functional.pad(x, (0, C - len(x))) for x in xs])
    per_token_logps, old_per_token_logps, ref_per_token_logps = pad(lps), pad(olds), pad(refs)
    completion_mask = pad(masks)
    advantages = torch.stack(advs)

    if cfg["tis_cap"] is None:
        old = old_per_token_logps
    else:
        old = per_token_logps.detach()  # TRL with num_iterations == 1
    coef_1 = torch.exp(per_token_logps - old)
    coef_2 = torch.clamp(coef_1, 1 - cfg["clip_eps_low"], 1 + cfg["clip_eps_high"])
    per_token_loss1 = coef_1 * advantages.unsqueeze(1)
    per_token_loss2 = coef_2 * advantages.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    if cfg["tis_cap"] is not None:
        importance_sampling_ratio = torch.exp(old - old_per_token_logps)
        importance_sampling_ratio = torch.clamp(importance_sampling_ratio, max=cfg["tis_cap"])
        per_token_loss = per_token_loss * importance_sampling_ratio
    if cfg["kl_coef"] != 0.0:
        per_token_kl = (torch.exp(ref_per_token_logps - per_token_logps)
                        - (ref_per_token_logps - per_token_logps) - 1)
        per_token_loss = per_token_loss + cfg["kl_coef"] * per_token_kl
    if cfg["aggregation"] == "token":
        return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
    return ((per_token_loss * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)).mean()


GRPO_CASES = {
    "token_std_kl_overlong": {
        "scale_by_std": True, "advantage_eps": 1e-4, "clip_eps_low": 0.2, "clip_eps_high": 0.28,
        "tis_cap": None, "kl_coef": 0.05, "aggregation": "token", "mask_truncated": True,
    },
    "sequence_nostd_tis": {
        "scale_by_std": False, "advantage_eps": 1e-4, "clip_eps_low": 0.2, "clip_eps_high": 0.28,
        "tis_cap": 1.5, "kl_coef": 0.0, "aggregation": "sequence", "mask_truncated": False,
    },
    "token_narrow_clip": {
        "scale_by_std": True, "advantage_eps": 1e-4, "clip_eps_low": 0.05, "clip_eps_high": 0.1,
        "tis_cap": None, "kl_coef": 0.0, "aggregation": "token", "mask_truncated": False,
    },
}

ADAMW = {"lrs": [1e-2, 2e-2, 1.5e-2, 5e-3], "betas": [0.9, 0.95], "eps": 1e-8,
         "weight_decay": 0.1, "max_grad_norm": 1.0, "grad_scales": [3.0, 0.01, 1.0, 0.5],
         # Parameters left without a gradient at a step (0-based): torch skips them entirely.
         "no_grad": {"2": ["mix.weight"]}}


def adamw_fixture(gen, W):
    """torch.optim.AdamW (+ clip_grad_norm_) on fixed gradients; returns tensors to save."""
    import torch
    names = sorted(W)
    params = {n: torch.nn.Parameter(W[n].clone()) for n in names}
    opt = torch.optim.AdamW([params[n] for n in names], lr=ADAMW["lrs"][0],
                            betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    out = {f"init.{n}": W[n].clone() for n in names}
    for k, (lr, scale) in enumerate(zip(ADAMW["lrs"], ADAMW["grad_scales"])):
        skip = set(ADAMW["no_grad"].get(str(k), []))
        for n in names:
            g = torch.randn(W[n].shape, generator=gen) * scale
            out[f"grad.{k}.{n}"] = g
            params[n].grad = None if n in skip else g.clone()
        torch.nn.utils.clip_grad_norm_([params[n] for n in names if n not in skip],
                                       ADAMW["max_grad_norm"])
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        for n in names:
            out[f"after.{k}.{n}"] = params[n].detach().clone()
    return out


QWEN3 = dict(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
QWEN3_CASES = ["token_std_kl_overlong", "sequence_nostd_tis"]


def qwen3_fixture(gen, out_dir):
    """A tiny transformers Qwen3ForCausalLM: weights, config.json, groups and GRPO gradients."""
    install_shim()
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(**QWEN3)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    model.eval()  # no dropout
    names = [n for n, _ in model.named_parameters()]
    W = {}
    for n, p in model.named_parameters():
        if "norm" in n:
            W[n] = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            W[n] = 0.2 * torch.randn(p.shape, generator=gen)
    W_ref = {n: w + 0.02 * torch.randn(w.shape, generator=gen) for n, w in W.items()}

    def load(weights):
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n in names:
                params[n].copy_(weights[n])

    def qwen3_logprobs(weights, ids):
        """Log-probs under the weights currently loaded in `model` (see `load`)."""
        logits = model(input_ids=ids[None]).logits[0]
        logp = torch.log_softmax(logits[:-1], dim=-1)
        return logp.gather(1, ids[1:, None]).squeeze(1)

    d = os.path.join(out_dir, "qwen3")
    os.makedirs(d, exist_ok=True)
    load(W)
    groups = make_groups(gen, W, qwen3_logprobs)
    cfg_dict = json.loads(cfg.to_json_string())  # what save_pretrained writes
    cfg_dict["architectures"] = ["Qwen3ForCausalLM"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=1, sort_keys=True, default=str)
    save_file({n: w.contiguous() for n, w in W.items()}, os.path.join(d, "policy.safetensors"))
    save_file({n: w.contiguous() for n, w in W_ref.items()}, os.path.join(d, "reference.safetensors"))
    with open(os.path.join(d, "groups.json"), "w") as f:
        json.dump(groups, f, indent=1)
    for name in QWEN3_CASES:
        case = GRPO_CASES[name]
        # The reference log-probs are computed first (W_ref loaded), then the policy's with grad:
        # trl_grpo_loss interleaves them per sample, so precompute the reference ones.
        ref_cache = {}

        def lp_fn(weights, ids):
            key = tuple(ids.tolist())
            if weights is W_ref:
                return ref_cache[key]
            return qwen3_logprobs(weights, ids)

        load(W_ref)
        for grp in groups:
            prompt = grp["prompt_ids"]
            for smp in grp["samples"]:
                ids = torch.tensor(prompt + smp["response_ids"])
                with torch.no_grad():
                    ref_cache[tuple(ids.tolist())] = qwen3_logprobs(W_ref, ids).clone()
        # Load the policy weights once; every policy forward then uses them unchanged.
        load(W)
        model.zero_grad()
        loss = trl_grpo_loss(W, W_ref, groups, case, lp_fn)
        loss.backward()
        params = dict(model.named_parameters())
        expected = {"loss": loss.detach().reshape(1)}
        expected.update({f"grad.{n}": params[n].grad.clone() for n in names})
        save_file(expected, os.path.join(d, f"expected_{name}.safetensors"))
        print(f"qwen3 {name}: loss {loss.item():.6f}")


def generate(out_dir):
    import torch
    from safetensors.torch import save_file
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    W = make_weights(gen, 0.5)
    W_ref = {n: w + 0.05 * torch.randn(w.shape, generator=gen) for n, w in W.items()}
    groups = make_groups(gen, W)
    os.makedirs(out_dir, exist_ok=True)
    save_file({n: w.contiguous() for n, w in W.items()}, os.path.join(out_dir, "policy.safetensors"))
    save_file({n: w.contiguous() for n, w in W_ref.items()}, os.path.join(out_dir, "reference.safetensors"))
    with open(os.path.join(out_dir, "groups.json"), "w") as f:
        json.dump(groups, f, indent=1)
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump(GRPO_CASES, f, indent=1, sort_keys=True)
    for name, cfg in GRPO_CASES.items():
        params = {n: w.clone().requires_grad_(True) for n, w in W.items()}
        loss = trl_grpo_loss(params, W_ref, groups, cfg)
        loss.backward()
        expected = {"loss": loss.detach().reshape(1)}
        expected.update({f"grad.{n}": p.grad for n, p in params.items()})
        save_file(expected, os.path.join(out_dir, f"expected_{name}.safetensors"))
        print(f"{name}: loss {loss.item():.6f}")
    save_file(adamw_fixture(gen, W), os.path.join(out_dir, "adamw.safetensors"))
    with open(os.path.join(out_dir, "adamw.json"), "w") as f:
        json.dump(ADAMW, f, indent=1, sort_keys=True)
    qwen3_fixture(gen, out_dir)
    print(f"torch {torch.__version__}; fixtures written to {out_dir}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "grpo"))
    ap.add_argument("--self-check", action="store_true", help="check that transformers imports on this torch")
    args = ap.parse_args()
    if args.self_check:
        self_check()
        return
    generate(os.path.normpath(args.out))


if __name__ == "__main__":
    main()
