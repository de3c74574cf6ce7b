#!/usr/bin/env python3
"""Golden fixtures for cvllm: tiny random-weight Hugging Face models + reference outputs.

For each architecture (qwen3, qwen2, llama) this script
  1. builds a small model with a deliberately non-trivial config (GQA/MQA, biases,
     head_dim != hidden/heads, tied/untied embeddings, llama3 rope scaling, ...),
  2. initialises every weight itself (seeded; RMSNorm weights 1 + 0.3*randn, biases
     0.1*randn, matrices ~N(0, 0.15^2)) so logits are well spread,
  3. saves it with transformers' save_pretrained in its storage dtype
     (qwen3: bfloat16, qwen2: float32 sharded, llama: float16),
  4. loads the saved folder back in float32 on the CPU (eager attention) and writes
     reference.json: last-position logits of 5 prompts and a 32-token greedy
     continuation computed with a plain argmax loop (full forward every step, no EOS stop).

Everything is computed on the CPU in float32 (no TF32), deterministic.

Usage (needs torch + transformers; see scripts/README.md for the device command):
    python3 scripts/gen_golden.py --out tests/fixtures/golden
"""
import argparse
import json
import math
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

PROMPT_LENGTHS = [3, 17, 40, 100, 130]
MAX_NEW_TOKENS = 32
# The brief asks for a min greedy margin >= 1e-3; we ask a bit more so that engines that
# accumulate in a different order (or in f32 with other kernels) still agree on argmax.
MARGIN_WANTED = 1e-2
MARGIN_FLOOR = 1e-3
MAX_TRIES = 200

TF_MAJOR = int(transformers.__version__.split(".")[0])


def make_config(cls, rope_theta, rope_scaling=None, **kw):
    """Builds a config for transformers 5.x (rope_parameters) or 4.x (rope_theta/rope_scaling)."""
    if TF_MAJOR >= 5:
        rp = {"rope_type": "default", "rope_theta": float(rope_theta)}
        if rope_scaling is not None:
            rp.update(rope_scaling)
        return cls(rope_parameters=rp, **kw)
    return cls(rope_theta=float(rope_theta), rope_scaling=rope_scaling, **kw)


MODELS = [
    {
        "name": "qwen3",
        "cls": Qwen3ForCausalLM,
        "dtype": torch.bfloat16,
        "shard": None,
        "seed": 1001,
        "config": lambda: make_config(
            Qwen3Config, 10000.0,
            vocab_size=512, hidden_size=96, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
            attention_bias=False, use_sliding_window=False, hidden_act="silu",
            bos_token_id=None, eos_token_id=511, pad_token_id=None),
    },
    {
        "name": "qwen2",
        "cls": Qwen2ForCausalLM,
        "dtype": torch.float32,
        "shard": "100KB",
        "seed": 2002,
        "config": lambda: make_config(
            Qwen2Config, 1000000.0,
            vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
            use_sliding_window=False, hidden_act="silu",
            bos_token_id=None, eos_token_id=383, pad_token_id=None),
    },
    {
        "name": "llama",
        "cls": LlamaForCausalLM,
        "dtype": torch.float16,
        "shard": None,
        "seed": 3003,
        "config": lambda: make_config(
            LlamaConfig, 10000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            vocab_size=500, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
            attention_bias=False, mlp_bias=False, hidden_act="silu",
            bos_token_id=1, eos_token_id=2, pad_token_id=None),
    },
]

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.startswith("lm_head"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def load_f32(cls, path):
    try:
        m = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        m = cls.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


@torch.no_grad()
def last_logits(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0, -1].float()


@torch.no_grad()
def greedy(model, prompt, n):
    """Plain argmax loop: full forward over prompt+generated each step; never stops at EOS."""
    ids = list(prompt)
    gen, margins, first_logits = [], [], None
    for step in range(n):
        lg = last_logits(model, ids)
        if step == 0:
            first_logits = lg.clone()
        top = torch.topk(lg, 2)
        margins.append(float(top.values[0] - top.values[1]))
        nxt = int(torch.argmax(lg))
        gen.append(nxt)
        ids.append(nxt)
    return first_logits, gen, margins


def expected_llama3_inv_freq(theta, dim, factor, low, high, orig):
    inv = [1.0 / (theta ** (i / dim)) for i in range(0, dim, 2)]
    low_wl, high_wl = orig / low, orig / high
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / factor)
        else:
            s = (orig / wl - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float32)


def dir_size(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def build_one(spec, out_root):
    name = spec["name"]
    path = os.path.join(out_root, name)
    os.makedirs(path, exist_ok=True)
    for f in os.listdir(path):  # a clean folder: no stale shards from an earlier run
        os.remove(os.path.join(path, f))

    torch.manual_seed(spec["seed"])
    cfg = spec["config"]()
    model = spec["cls"](cfg)
    init_weights(model, spec["seed"])
    model = model.to(spec["dtype"])
    model.eval()
    kw = {}
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(path, **kw)
    files = sorted(os.listdir(path))
    if spec["shard"]:
        assert "model.safetensors.index.json" in files, files
        assert sum(f.endswith(".safetensors") for f in files) >= 2, files

    ref_model = load_f32(spec["cls"], path)
    # The reference must be the exact f32 math on the stored (rounded) weights.
    saved = {k: v.float() for k, v in model.state_dict().items()}
    for k, v in ref_model.state_dict().items():
        if k in saved:
            assert torch.equal(saved[k], v), f"{name}: {k} differs after reload"
    print(f"[{name}] reference attention implementation: {getattr(ref_model.config, '_attn_implementation', '?')}")

    if name == "llama":
        rp = getattr(ref_model.config, "rope_parameters", None) or getattr(ref_model.config, "rope_scaling", None)
        print(f"[{name}] rope config after reload: {rp}")
        want = expected_llama3_inv_freq(10000.0, cfg.hidden_size // cfg.num_attention_heads, 8.0, 1.0, 4.0, 64)
        got = ref_model.model.rotary_emb.inv_freq.float()
        assert torch.allclose(got, want, rtol=1e-5, atol=0), (got, want)
        print(f"[{name}] llama3 inv_freq verified: {[float(x) for x in got]}")

    vocab = cfg.vocab_size
    prompts, logits, greedies, margins, seeds = [], [], [], [], []
    for i, L in enumerate(PROMPT_LENGTHS):
        best = None
        for t in range(MAX_TRIES):
            seed = spec["seed"] * 100 + i * 1000 + t
            g = torch.Generator().manual_seed(seed)
            prompt = torch.randint(0, vocab, (L,), generator=g).tolist()
            lg, gen, mg = greedy(ref_model, prompt, MAX_NEW_TOKENS)
            cand = (min(mg), seed, prompt, lg, gen)
            if best is None or cand[0] > best[0]:
                best = cand
            if min(mg) >= MARGIN_WANTED:
                break
        mm, seed, prompt, lg, gen = best
        assert mm >= MARGIN_FLOOR, f"{name}: prompt {i} min margin {mm} < {MARGIN_FLOOR}"
        prompts.append(prompt)
        logits.append([float(x) for x in lg])
        greedies.append(gen)
        margins.append(mm)
        seeds.append(seed)
        print(f"[{name}] prompt {i}: len {L:3d} seed {seed} tries {t + 1:3d} min_margin {mm:.4f} "
              f"logit std {float(lg.std()):.3f} greedy[:8] {gen[:8]}")

    ref = {
        "model": name,
        "dtype": DTYPE_NAMES[spec["dtype"]],
        "architecture": spec["cls"].__name__,
        "prompts": prompts,
        "logits": logits,
        "greedy": greedies,
        "greedy_min_margin": margins,
        "max_new_tokens": MAX_NEW_TOKENS,
        "prompt_seeds": seeds,
        "note": "float32 on CPU, eager attention, from the saved weights upcast to float32; "
                "logits[i] = last-position logits of prompts[i]; greedy = plain argmax loop "
                "(full forward each step, no EOS stop)",
        "generated_by": "scripts/gen_golden.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    nparams = sum(p.numel() for p in ref_model.parameters())
    print(f"[{name}] {spec['cls'].__name__} {DTYPE_NAMES[spec['dtype']]} params {nparams} "
          f"folder {dir_size(path)} bytes files {sorted(os.listdir(path))}")
    with open(os.path.join(path, "config.json")) as f:
        print(f"[{name}] config.json:\n{f.read()}")
    return ref


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/golden")
    ap.add_argument("--only", default=None, help="comma-separated subset of qwen3,qwen2,llama")
    args = ap.parse_args()

    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__}")
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    for spec in MODELS:
        if only and spec["name"] not in only:
            continue
        build_one(spec, args.out)
    print("done")


if __name__ == "__main__":
    main()
