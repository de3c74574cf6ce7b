#!/usr/bin/env python3
"""compare_hf_gpu.py: greedy ids of cvllm's CUDA backend against Hugging Face transformers on the
same GPU, each model in its stored dtype (bf16 for qwen3 / cvllm-tiny-py / the qwen3-0.6b preset,
f16 for the llama fixture, f32 for the qwen2 fixture).

    python3 scripts/compare_hf_gpu.py --cvllm build-cuda/cvllm MODEL_DIR[:REFERENCE.json] ...

For each model: the prompts of REFERENCE.json (its prompt_ids / prompts and max_new_tokens), or,
without one, 4 seeded random prompts of 5..300 ids and 32 new tokens. Both sides run greedy with
EOS ignored. Prints, per prompt, whether the ids are identical and, where they part, the step
and transformers' own top-2 logit margin there (a near tie explains a parting: bf16 rounding in
another order flips it)."""
import argparse
import json
import random
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM


def load_prompts(ref_path, vocab):
    if ref_path:
        r = json.load(open(ref_path))
        prompts = r.get("prompt_ids") or r["prompts"]
        max_new = len(r["greedy"][0])
        return prompts, max_new
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (5, 17, 120, 300)], 32


def main():
    # exact f32 products for f32 models (no TF32), as the committed references were made
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ap = argparse.ArgumentParser()
    ap.add_argument("--cvllm", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    total_bad = 0
    for spec in a.models:
        model_dir, _, ref = spec.partition(":")
        cfg = json.load(open(f"{model_dir}/config.json"))
        dt = {"float32": torch.float32, "float16": torch.float16}.get(
            cfg.get("dtype") or cfg.get("torch_dtype"), torch.bfloat16)
        prompts, max_new = load_prompts(ref, cfg["vocab_size"])
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).cuda().eval()
        hf, margins = [], []
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            with torch.no_grad():
                out = m.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=0, attention_mask=torch.ones_like(ids))
            hf.append(out.sequences[0, len(p):].tolist())
            mg = []
            for s in out.logits:  # the raw logits (the processors' -inf would hide the range)
                x = s[0].float()
                top = torch.topk(x, 2).values
                rng_ = (x.max() - x.min()).item()
                mg.append(((top[0] - top[1]).item()) / (rng_ or 1.0))
            margins.append(mg)
        del m
        torch.cuda.empty_cache()
        cmd = [a.cvllm, "complete", model_dir, "--device", "cuda", "--temperature", "0",
               "--ignore-eos", "--max-tokens", str(max_new), "--output", "json", "--quiet",
               "--max-model-len", str(max(len(p) for p in prompts) + max_new + 16),
               "--kv-cache-memory", "2G"]
        for p in prompts:
            cmd += ["--prompt-ids", ",".join(map(str, p))]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"{model_dir}: cvllm failed: {res.stderr[-2000:]}")
            total_bad += 1
            continue
        ours = [o["token_ids"] for o in json.loads(res.stdout)]
        print(f"{model_dir} ({str(dt).replace('torch.', '')}): {len(prompts)} prompts, {max_new} new tokens")
        for i, (h, o) in enumerate(zip(hf, ours)):
            k = next((j for j in range(max_new) if j >= len(o) or o[j] != h[j]), -1)
            if k < 0:
                print(f"  prompt {i} ({len(prompts[i])} ids): identical")
            else:
                print(f"  prompt {i} ({len(prompts[i])} ids): parts at token {k} (cvllm {o[k] if k < len(o) else None}, "
                      f"transformers {h[k]}); transformers' top-2 margin there {margins[i][k]:.2e} of the range")
    sys.exit(1 if total_bad else 0)


if __name__ == "__main__":
    main()
