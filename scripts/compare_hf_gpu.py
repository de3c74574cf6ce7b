#!/usr/bin/env python3
"""compare_hf_gpu.py: greedy ids of cvllm's CUDA backend against Hugging Face transformers on the
same GPU.

    python3 scripts/compare_hf_gpu.py --cvllm build-cuda/cvllm [--dtype stored|bf16] \
        MODEL_DIR[:REFERENCE.json] ...

--dtype stored (the default): each model in its stored dtype (bf16 for qwen3 / cvllm-tiny-py / the
qwen3-0.6b preset, f16 for the llama fixture, f32 for the qwen2 fixture).
--dtype bf16: both sides run the model in bf16. A model whose config.json does not say bfloat16 is
first copied to a temporary folder with every floating-point tensor of its safetensors rounded to
bf16 (round to nearest even, torch's .to(torch.bfloat16)) and config.json's dtype / torch_dtype
set to "bfloat16"; cvllm and transformers (dtype=torch.bfloat16) then load that same copy, so
they see the same weights. A model already stored in bf16 is used as it is.

For each model: the prompts of REFERENCE.json (its prompt_ids / prompts and max_new_tokens), or,
without one, 4 seeded random prompts of 5..300 ids and 32 new tokens. Both sides run greedy with
EOS ignored. Prints, per prompt, whether the ids are identical and, where they part, the step,
both sides' top-2 ids and top-2 logit gap there (transformers' from its own logits, also relative
to the logits' range; cvllm's from its --logprobs 2 output, whose difference is the logit gap) and
a verdict: "near tie" when the two sides' top-2 are the same two ids in the other order and
transformers' gap is under TIE (6e-2) of its logits' range (bf16 rounding in another order flips a
close call; transformers' bf16 logits can even tie exactly, and then its argmax takes the lower
id); anything else is flagged. Then one SUMMARY line per model and a last line with the totals.
Exit status 1 if cvllm failed on a model or a parting is not at a near tie."""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

# a parting is a near tie when both sides' top 2 are the same two ids, swapped, and transformers'
# gap there is under this share of its logits' range (test_cuda_engine's tie bound: 2 * 3e-2)
TIE = 6e-2
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_prompts(ref_path, vocab):
    if ref_path:
        r = json.load(open(ref_path))
        prompts = r.get("prompt_ids") or r["prompts"]
        max_new = len(r["greedy"][0])
        return prompts, max_new
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (5, 17, 120, 300)], 32


def config_dtype(cfg):
    return cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"


def bf16_copy(model_dir, dst):
    """Copies model_dir to dst with every floating-point safetensors tensor in bf16 and config.json
    saying bfloat16; other files are copied as they are (the shard index gets the new total_size)."""
    from safetensors.torch import load_file, save_file
    os.makedirs(dst)
    total = 0
    names = sorted(os.listdir(model_dir))
    for name in names:
        src = os.path.join(model_dir, name)
        if not os.path.isfile(src):
            continue
        if name.endswith(".safetensors"):
            t = load_file(src)
            out = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in t.items()}
            total += sum(v.numel() * v.element_size() for v in out.values())
            save_file(out, os.path.join(dst, name), metadata={"format": "pt"})
        elif name == "config.json":
            cfg = json.load(open(src))
            had = [k for k in ("dtype", "torch_dtype") if k in cfg]
            for k in had or ["dtype", "torch_dtype"]:
                cfg[k] = "bfloat16"
            json.dump(cfg, open(os.path.join(dst, name), "w"), indent=2)
        elif name != "model.safetensors.index.json":
            shutil.copy2(src, dst)
    if "model.safetensors.index.json" in names:
        idx = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
        idx.setdefault("metadata", {})["total_size"] = total
        json.dump(idx, open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=2)


def hf_greedy(model_dir, dt, prompts, max_new):
    """transformers' greedy ids and, per step, its raw logits' top-2 (ids, gap, gap / range)."""
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).cuda().eval()
    hf, tops = [], []
    for p in prompts:
        ids = torch.tensor([p], device="cuda")
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                             output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, attention_mask=torch.ones_like(ids))
        hf.append(out.sequences[0, len(p):].tolist())
        tp = []
        for s in out.logits:  # the raw logits (the processors' -inf would hide the range)
            x = s[0].float()
            v, i = torch.topk(x, 2)
            gap = (v[0] - v[1]).item()
            rng_ = (x.max() - x.min()).item()
            tp.append(((i[0].item(), i[1].item()), gap, gap / (rng_ or 1.0)))
        tops.append(tp)
    del m
    torch.cuda.empty_cache()
    return hf, tops


def cvllm_greedy(binary, model_dir, prompts, max_new):
    """cvllm's greedy ids and, per step, its top-2 (ids, log-prob gap = logit gap); None on error."""
    cmd = [binary, "complete", model_dir, "--device", "cuda", "--temperature", "0",
           "--ignore-eos", "--max-tokens", str(max_new), "--output", "json", "--quiet",
           "--max-model-len", str(max(len(p) for p in prompts) + max_new + 16),
           "--kv-cache-memory", "2G", "--logprobs", "2"]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return None, res.stderr[-2000:]
    ours, tops = [], []
    for o in json.loads(res.stdout):
        ours.append(o["token_ids"])
        tp = []
        for row in o.get("top_logprobs") or []:
            if len(row) >= 2:
                tp.append(((row[0][0], row[1][0]), row[0][1] - row[1][1]))
            else:
                tp.append(None)
        tops.append(tp)
    return (ours, tops), None


def main():
    # exact f32 products for f32 models (no TF32), as the committed references were made
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ap = argparse.ArgumentParser()
    ap.add_argument("--cvllm", required=True)
    ap.add_argument("--dtype", choices=("stored", "bf16"), default="stored",
                    help="stored: each model in its stored dtype; bf16: both sides in bf16 (a "
                         "bf16 copy of the weights in a temporary folder where needed)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary bf16 copies")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cvllm-bf16-") if a.dtype == "bf16" else None
    failed, flagged, summaries = 0, 0, []
    n_same = n_prompts = 0
    try:
        for mi, spec in enumerate(a.models):
            model_dir, _, ref = spec.partition(":")
            cfg = json.load(open(f"{model_dir}/config.json"))
            stored = config_dtype(cfg)
            run_dir, note = model_dir, ""
            if a.dtype == "bf16":
                dt = torch.bfloat16
                if stored != "bfloat16":
                    run_dir = os.path.join(tmp, f"{mi}-{os.path.basename(os.path.normpath(model_dir))}")
                    bf16_copy(model_dir, run_dir)
                    note = f", a bf16 copy of its {stored} weights in {run_dir}"
            else:
                dt = DTYPES.get(stored, torch.bfloat16)
            dname = str(dt).replace("torch.", "")
            prompts, max_new = load_prompts(ref, cfg["vocab_size"])
            hf, hf_tops = hf_greedy(run_dir, dt, prompts, max_new)
            got, err = cvllm_greedy(a.cvllm, run_dir, prompts, max_new)
            if got is None:
                print(f"{model_dir} ({dname}{note}): cvllm failed: {err}")
                summaries.append(f"SUMMARY {model_dir} ({dname}): cvllm FAILED")
                failed += 1
                continue
            ours, our_tops = got
            print(f"{model_dir} ({dname}{note}): {len(prompts)} prompts, {max_new} new tokens")
            same, parts = 0, []
            for i, (h, o) in enumerate(zip(hf, ours)):
                k = next((j for j in range(max_new) if j >= len(o) or o[j] != h[j]), -1)
                if k < 0:
                    same += 1
                    print(f"  prompt {i} ({len(prompts[i])} ids): identical")
                    continue
                (h1, h2), hgap, hrel = hf_tops[i][k]
                ct = our_tops[i][k] if k < len(our_tops[i]) else None
                if ct:
                    (c1, c2), cgap = ct
                    cv = f"cvllm top-2 {c1},{c2} gap {cgap:.3g}"
                    swap = {c1, c2} == {h1, h2}
                else:
                    cv, swap = "cvllm top-2 not reported", False
                tie = swap and hrel < TIE
                if tie:
                    verdict = "near tie (the same top 2, swapped)"
                elif swap:
                    verdict = f"the top 2 swapped but NOT a near tie (gap >= {TIE:g} of the range)"
                else:
                    verdict = "NOT a swap of the top 2"
                if hgap == 0:
                    verdict += "; transformers' logits tie exactly (its argmax takes the lower id)"
                flagged += not tie
                print(f"  prompt {i} ({len(prompts[i])} ids): parts at token {k} "
                      f"(cvllm {o[k] if k < len(o) else None}, transformers {h[k]}); "
                      f"transformers top-2 {h1},{h2} gap {hgap:.3g} ({hrel:.2e} of the range), "
                      f"{cv}: {verdict}")
                parts.append(f"p{i}@{k} gap {hrel:.1e}{'' if tie else ' NOT A TIE'}")
            n_same += same
            n_prompts += len(prompts)
            summaries.append(f"SUMMARY {model_dir} ({dname}): {same}/{len(prompts)} identical"
                             + (f"; parts: {', '.join(parts)}" if parts else ""))
    finally:
        if tmp and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    for s in summaries:
        print(s)
    print(f"SUMMARY all ({a.dtype}): {n_same}/{n_prompts} prompts identical on "
          f"{len(a.models) - failed} models, {failed} cvllm failures, "
          f"{flagged} partings not at a near tie")
    sys.exit(1 if failed or flagged else 0)


if __name__ == "__main__":
    main()
