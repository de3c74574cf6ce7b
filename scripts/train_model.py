#!/usr/bin/env python3
"""Trains cvllm-tiny-py: a ~6M-parameter Qwen3-architecture model on the Python standard library.

Steps (all in one run, on a machine with one CUDA GPU; see scripts/README.md):
  1. Corpus: every *.py file of this Python's standard library (sysconfig stdlib path;
     site-packages/dist-packages excluded), PSF License. Files are shuffled with a fixed
     seed and joined with <|endoftext|>; the last 1% of the token stream is held out.
  2. Tokenizer: byte-level BPE trained with `tokenizers`, in the same format as Qwen's
     tokenizer.json (Split(Qwen regex, Isolated) + ByteLevel(use_regex=False), ByteLevel
     post-processor and decoder, no normalizer), vocabulary 4093 BPE tokens + 3 special
     tokens (<|endoftext|>, <|im_start|>, <|im_end|>) at the end, as Qwen does.
     Saved with transformers' save_pretrained (PreTrainedTokenizerFast, eos <|endoftext|>).
  3. Model: Qwen3ForCausalLM (tied embeddings), bf16 autocast, AdamW, cosine schedule over
     a wall-clock budget (the run stops on time, not on a step count); val loss is checked
     periodically and the best-val weights are kept.
  4. Saves model (bf16 safetensors) + tokenizer into --model-dir, loss.png, samples.txt,
     training_log.json and README.md (model card), and the reference fixture --ref-out:
     greedy continuations and logits computed by transformers in float32 on the CPU from
     the saved bf16 weights (eager attention, plain argmax loop).
"""
import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time

import numpy as np
import torch
import torch.nn.functional as F
import tokenizers
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

TF_MAJOR = int(transformers.__version__.split(".")[0])

QWEN_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
QWEN_PRETOK = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_PAT}, "behavior": "Isolated", "invert": False},
        dict(BYTELEVEL),
    ],
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")

SAMPLE_PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n", "for i in range("]
LONG_PROMPT = (
    '"""Utilities for reading and writing simple configuration files."""\n\n'
    "import os\nimport re\nimport sys\n\n__all__ = [\"read_config\", \"write_config\"]\n\n\n"
    "def read_config(path, encoding=\"utf-8\"):\n"
    '    """Read the file at *path* and return a dict of its sections."""\n'
    "    sections = {}\n    current = None\n    with open(path, encoding=encoding) as f:\n"
    "        for line in f:\n            line = line.strip()\n"
    "            if not line or line.startswith(\"#\"):\n                continue\n")
REF_CANDIDATES = SAMPLE_PROMPTS + [
    LONG_PROMPT,
    "<|endoftext|>def main():\n    ",
    "    def __init__(self, ",
    "try:\n    import ",
    "if __name__ == '__main__':\n",
]
REF_COUNT = 5
REF_NEW_TOKENS = 48
SAMPLE_NEW_TOKENS = 100


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- corpus
def collect_corpus(max_files=None):
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        for fn in sorted(files):
            if fn.endswith(".py"):
                paths.append(os.path.join(root, fn))
    texts, names, skipped, nbytes = [], [], [], 0
    h = hashlib.sha256()
    for p in paths:
        try:
            with open(p, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(os.path.relpath(p, stdlib))
            continue
        rel = os.path.relpath(p, stdlib)
        h.update(rel.encode() + b"\0" + raw + b"\0")
        texts.append(text)
        names.append(rel)
        nbytes += len(raw)
    order = list(range(len(texts)))
    random.Random(1234).shuffle(order)
    texts = [texts[i] for i in order]
    names = [names[i] for i in order]
    if max_files:
        texts, names = texts[:max_files], names[:max_files]
        nbytes = sum(len(t.encode("utf-8")) for t in texts)
    lic = None
    for cand in ("LICENSE.txt", "LICENSE"):
        lp = os.path.join(stdlib, cand)
        if os.path.exists(lp):
            with open(lp, encoding="utf-8", errors="replace") as f:
                lic = {"path": lp, "first_line": f.readline().strip()}
            break
    stats = {
        "stdlib_path": stdlib,
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "files": len(texts),
        "files_skipped_not_utf8": len(skipped),
        "bytes": nbytes,
        "sha256_of_files": h.hexdigest(),
        "includes_test_dirs": any(n.startswith("test" + os.sep) for n in names),
        "license_file": lic,
    }
    return texts, stats


# ----------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS), min_frequency=2, show_progress=False,
        special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Rewrite the pipeline to exactly Qwen's layout (same JSON as Qwen's tokenizer.json).
    d = json.loads(tok.to_str())
    d["normalizer"] = None
    d["pre_tokenizer"] = QWEN_PRETOK
    d["post_processor"] = dict(BYTELEVEL)
    d["decoder"] = dict(BYTELEVEL)
    m = d["model"]
    m.update({"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False})
    tok = Tokenizer.from_str(json.dumps(d))
    nbpe = tok.get_vocab_size(with_added_tokens=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for s in SPECIALS])
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == nbpe + i, (s, tok.token_to_id(s), nbpe)
    return tok


def save_hf_tokenizer(tok, model_dir, max_len):
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                 bos_token=None, unk_token=None, model_max_length=max_len,
                                 clean_up_tokenization_spaces=False)
    hf.chat_template = CHATML
    hf.save_pretrained(model_dir)
    # Check what was written against what we meant.
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        saved = json.load(f)
    for key, want in (("normalizer", None), ("pre_tokenizer", QWEN_PRETOK), ("post_processor", BYTELEVEL),
                      ("decoder", BYTELEVEL)):
        if saved.get(key) != want:
            log(f"WARNING tokenizer.json {key} differs from Qwen layout: {json.dumps(saved.get(key))}")
    ours = json.loads(tok.to_str())
    assert saved["model"]["vocab"] == ours["model"]["vocab"], "vocab changed by save_pretrained"
    assert saved["model"]["merges"] == ours["model"]["merges"], "merges changed by save_pretrained"
    # transformers 5 names its own class (TokenizersBackend), which transformers 4 cannot load; the classic
    # name PreTrainedTokenizerFast loads in both. Keep it only if transformers still loads it identically.
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        orig = f.read()
    tcfg = json.loads(orig)
    if tcfg.get("tokenizer_class") != "PreTrainedTokenizerFast":
        tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        with open(cfg_path, "w") as f:
            json.dump(tcfg, f, indent=2, ensure_ascii=False)
            f.write("\n")
        try:
            t2 = AutoTokenizer.from_pretrained(model_dir)
            probe = "def f(x):\n    return x  # ünïcode 'quote' \r\n\t<|im_start|>user\nhi<|im_end|>"
            ok = list(t2(probe)["input_ids"]) == tok.encode(probe, add_special_tokens=False).ids
            ok = ok and t2.eos_token == "<|endoftext|>" and t2.decode(t2(probe)["input_ids"]) == probe
            log(f"tokenizer_class PreTrainedTokenizerFast reloads as {type(t2).__name__}: {'ok' if ok else 'MISMATCH'}")
        except Exception as e:  # noqa: BLE001
            ok = False
            log(f"tokenizer_class PreTrainedTokenizerFast failed to load: {e!r}")
        if not ok:
            with open(cfg_path, "w") as f:
                f.write(orig)
    return hf


# ----------------------------------------------------------------------------- model
def make_config(args, vocab, eot):
    kw = dict(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.inter,
              num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
              head_dim=args.head_dim, max_position_embeddings=args.max_pos, rms_norm_eps=1e-6,
              tie_word_embeddings=True, attention_bias=False, use_sliding_window=False, hidden_act="silu",
              initializer_range=0.02, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    if TF_MAJOR >= 5:
        return Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": float(args.rope_theta)}, **kw)
    return Qwen3Config(rope_theta=float(args.rope_theta), **kw)


def load_f32_cpu(path):
    try:
        m = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        m = Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    return m.eval()


@torch.no_grad()
def greedy(model, prompt_ids, n):
    """Plain argmax loop on the CPU: full forward over prompt+generated each step, no EOS stop."""
    ids = list(prompt_ids)
    gen, margins, first = [], [], None
    for step in range(n):
        lg = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0, -1].float()
        if step == 0:
            first = lg.clone()
        top = torch.topk(lg, 2)
        margins.append(float(top.values[0] - top.values[1]))
        nxt = int(torch.argmax(lg))
        gen.append(nxt)
        ids.append(nxt)
    return first, gen, margins


def dir_size(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if os.path.isfile(os.path.join(path, f)))


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="models/cvllm-tiny-py")
    ap.add_argument("--ref-out", default="tests/fixtures/trained/reference.json")
    ap.add_argument("--time-budget", type=float, default=450.0, help="seconds of training loop (wall clock)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--max-pos", type=int, default=1024)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every-s", type=float, default=30.0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="training-only dropout on the embedding, attention and MLP outputs (forward hooks) "
                         "and on attention probabilities; the saved model is a plain Qwen3 (no dropout)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--skip-refs", action="store_true", help="sweeps: no references/samples/README")
    ap.add_argument("--max-files", type=int, default=None, help="smoke tests: use only this many files")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    command = "python3 scripts/train_model.py " + " ".join(sys.argv[1:])

    t_start = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device("cuda")
    gpu_name = torch.cuda.get_device_name(0)
    log(f"python {platform.python_version()} torch {torch.__version__} transformers {transformers.__version__} "
        f"tokenizers {tokenizers.__version__} gpu {gpu_name}")
    log(f"command: {command}")
    os.makedirs(args.model_dir, exist_ok=True)
    for f in os.listdir(args.model_dir):
        p = os.path.join(args.model_dir, f)
        if os.path.isfile(p):
            os.remove(p)
    os.makedirs(os.path.dirname(os.path.abspath(args.ref_out)), exist_ok=True)

    # 1. corpus
    t0 = time.time()
    texts, cstats = collect_corpus(args.max_files)
    log(f"corpus: {json.dumps(cstats)} ({time.time() - t0:.1f}s)")

    # 2. tokenizer
    t0 = time.time()
    tok = train_tokenizer(texts, args.vocab)
    V = tok.get_vocab_size(with_added_tokens=True)
    eot = tok.token_to_id("<|endoftext|>")
    t_tok = time.time() - t0
    log(f"tokenizer: vocab {V} (eot {eot}) trained in {t_tok:.1f}s")
    hf_tok = save_hf_tokenizer(tok, args.model_dir, args.max_pos)

    t0 = time.time()
    encs = tok.encode_batch(texts, add_special_tokens=False)
    stream = []
    for e in encs:
        stream.extend(e.ids)
        stream.append(eot)
    data = np.asarray(stream, dtype=np.int64)
    del encs, stream
    n_val = max(int(0.01 * len(data)), args.seq_len + 2)
    train_np, val_np = data[:-n_val], data[-n_val:]
    log(f"tokens: {len(data)} ({cstats['bytes'] / len(data):.2f} bytes/token), train {len(train_np)} "
        f"val {len(val_np)} ({time.time() - t0:.1f}s)")
    train_t = torch.from_numpy(train_np).to(dev)
    val_t = torch.from_numpy(val_np).to(dev)

    # 3. model
    config = make_config(args, V, eot)
    config.attention_dropout = args.dropout
    model = Qwen3ForCausalLM(config).to(dev)
    add_dropout_hooks(model, args.dropout)
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model: {nparams} parameters ({nparams * 2 / 1e6:.2f} MB in bf16); "
        f"attn {getattr(model.config, '_attn_implementation', '?')}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if args.compile else model
    B, T = args.batch_size, args.seq_len
    offs = torch.arange(T + 1, device=dev)
    n_windows = (len(val_t) - 1) // T
    val_idx = torch.arange(n_windows, device=dev) * T

    def get_batch():
        ix = torch.randint(0, len(train_t) - T - 1, (B,), device=dev)
        w = train_t[ix[:, None] + offs]
        return w[:, :-1], w[:, 1:]

    @torch.no_grad()
    def evaluate():
        model.eval()
        tot, cnt = 0.0, 0
        for i in range(0, n_windows, 64):
            w = val_t[val_idx[i:i + 64, None] + offs]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lg = model(input_ids=w[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), w[:, 1:].reshape(-1), reduction="sum")
            tot += float(loss)
            cnt += w[:, 1:].numel()
        model.train()
        return tot / cnt

    def lr_at(step, frac):
        if step < args.warmup_steps:
            return args.lr * (step + 1) / args.warmup_steps
        mn = args.lr * args.min_lr_frac
        return mn + 0.5 * (args.lr - mn) * (1 + math.cos(math.pi * min(frac, 1.0)))

    hist, vhist = [], []
    best = (float("inf"), -1, None)
    step, tokens_seen = 0, 0
    acc, acc_n = torch.zeros((), device=dev), 0
    t_prep = time.time() - t_start
    log(f"setup took {t_prep:.1f}s; training for {args.time_budget:.0f}s, batch {B}x{T}")
    torch.cuda.synchronize()
    t_train = time.time()  # restarted after the first step: compilation is not part of the budget
    t_last, tok_last, next_eval = t_train, 0, args.eval_every_s
    first_step_s = None
    while True:
        elapsed = time.time() - t_train
        if elapsed >= args.time_budget:
            break
        lr = lr_at(step, elapsed / args.time_budget)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = get_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += B * T
        acc += loss.detach()
        acc_n += 1
        if step == 1:
            torch.cuda.synchronize()
            first_step_s = time.time() - t_train
            log(f"first step (incl. compile) {first_step_s:.1f}s")
            t_train = t_last = time.time()
        if step % args.log_every == 0:
            tl = float(acc) / acc_n
            now = time.time()
            tps = (tokens_seen - tok_last) / (now - t_last)
            t_last, tok_last = now, tokens_seen
            acc.zero_()
            acc_n = 0
            hist.append({"step": step, "tokens": tokens_seen, "elapsed": now - t_train, "train_loss": tl,
                         "lr": lr, "tokens_per_s": tps})
            if step % (args.log_every * 10) == 0:
                log(f"step {step:6d} t {now - t_train:6.1f}s loss {tl:.4f} lr {lr:.2e} tok/s {tps:,.0f}")
        if time.time() - t_train >= next_eval:
            next_eval += args.eval_every_s
            vl = evaluate()
            vhist.append({"step": step, "tokens": tokens_seen, "elapsed": time.time() - t_train, "val_loss": vl})
            log(f"step {step:6d} val_loss {vl:.4f}")
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
    torch.cuda.synchronize()
    train_s = time.time() - t_train
    final_val = evaluate()
    # diagnostic: the same (eval-mode, uncompiled) path on training windows; should be close to the train loss
    with torch.no_grad():
        model.eval()
        x, y = get_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lg = model(input_ids=x, use_cache=False).logits
        train_eval_loss = float(F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1)))
        model.train()
    log(f"train windows through the eval path: loss {train_eval_loss:.4f}")
    vhist.append({"step": step, "tokens": tokens_seen, "elapsed": train_s, "val_loss": final_val})
    final_train = hist[-1]["train_loss"] if hist else float("nan")
    used_step, used_val = step, final_val
    if best[2] is not None and best[0] < final_val:
        model.load_state_dict(best[2])
        used_step, used_val = best[1], best[0]
    log(f"trained {step} steps, {tokens_seen:,} tokens in {train_s:.1f}s "
        f"({tokens_seen / train_s:,.0f} tok/s); final train {final_train:.4f} val {final_val:.4f}; "
        f"saved weights from step {used_step} (val {used_val:.4f})")

    info = {
        "command": command,
        "gpu": gpu_name,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "corpus": cstats,
        "tokens_total": int(len(data)), "tokens_train": int(len(train_np)), "tokens_val": int(len(val_np)),
        "tokenizer_train_s": t_tok,
        "parameters": nparams,
        "args": vars(args),
        "steps": step, "tokens_seen": tokens_seen, "train_seconds": train_s,
        "tokens_per_s": tokens_seen / train_s, "first_step_s": first_step_s,
        "epochs": tokens_seen / len(train_np),
        "final_train_loss": final_train, "final_val_loss": final_val, "train_windows_eval_loss": train_eval_loss,
        "saved_step": used_step, "saved_val_loss": used_val,
        "total_seconds": None,
        "history": hist, "val_history": vhist,
    }

    def write_log():
        with open(os.path.join(args.model_dir, "training_log.json"), "w") as f:
            json.dump(info, f, indent=1)
            f.write("\n")

    if args.skip_refs:
        log(f"SWEEP dropout {args.dropout} wd {args.weight_decay} lr {args.lr} B {B} budget {args.time_budget}: "
            f"steps {step} epochs {info['epochs']:.1f} best val {best[0]:.4f} at step {best[1]} "
            f"final val {final_val:.4f} final train {final_train:.4f}")
        log("val history: " + " ".join(f"{v['step']}:{v['val_loss']:.3f}" for v in vhist))
        return

    # 4. save (bf16); the saved config has no dropout
    model.config.attention_dropout = 0.0
    model = model.to("cpu").to(torch.bfloat16)
    model.save_pretrained(args.model_dir)
    bf16_state = {k: v.float() for k, v in model.state_dict().items()}
    del model, fwd, opt, train_t, val_t
    torch.cuda.empty_cache()
    write_log()

    try:
        plot_loss(os.path.join(args.model_dir, "loss.png"), hist, vhist, used_val, nparams, cstats)
    except Exception:
        import traceback
        traceback.print_exc()

    # 5. reference + samples: transformers f32 on the CPU from the saved bf16 weights
    samples = []
    try:
        samples = make_references(args, tok, texts, bf16_state)
    except Exception:
        import traceback
        traceback.print_exc()
        log("ERROR: references/samples failed")

    info["total_seconds"] = time.time() - t_start
    write_log()
    write_readme(args.model_dir, info, samples, config)
    log(f"model dir {args.model_dir}: {dir_size(args.model_dir)} bytes: {sorted(os.listdir(args.model_dir))}")
    for fn in ("config.json", "generation_config.json", "tokenizer_config.json"):
        fp = os.path.join(args.model_dir, fn)
        if os.path.exists(fp):
            with open(fp) as f:
                log(f"{fn}:\n" + f.read())
    for p, c in samples:
        log(f"--- sample {p!r}:\n{p}{c}")
    log(f"total {info['total_seconds']:.1f}s")


def add_dropout_hooks(model, p):
    """Residual-branch dropout for training only (identity in eval mode); the architecture is unchanged."""
    if p <= 0:
        return

    def hook(mod, inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)

    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def plot_loss(path, hist, vhist, used_val, nparams, cstats):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([h["tokens"] / 1e6 for h in hist], [h["train_loss"] for h in hist], lw=1,
            label="train (dropout on; mean over each 50 steps)")
    ax.plot([h["tokens"] / 1e6 for h in vhist], [h["val_loss"] for h in vhist], "o-", ms=3,
            label="validation (1% held out)")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy loss (nats/token)")
    if hist:
        lo = max(0.0, min([h["train_loss"] for h in hist] + [used_val]) - 0.2)
        hi = min(8.5, max([h["train_loss"] for h in hist[:3]] + [4.0]))
        ax.set_ylim(lo, hi)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"cvllm-tiny-py: Qwen3, {nparams / 1e6:.1f}M params, Python {cstats['python_version']} stdlib")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def make_references(args, tok, texts, bf16_state):
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    ref_model = load_f32_cpu(args.model_dir)
    for k, v in ref_model.state_dict().items():
        if k in bf16_state and not torch.equal(bf16_state[k], v):
            log(f"WARNING: {k} differs after reload")
    log(f"reference model attn: {getattr(ref_model.config, '_attn_implementation', '?')}")
    hf_loaded = AutoTokenizer.from_pretrained(args.model_dir)
    log(f"reloaded tokenizer class {type(hf_loaded).__name__}")

    def encode(text):
        a = list(hf_loaded(text)["input_ids"])
        b = tok.encode(text, add_special_tokens=False).ids
        if a != b:
            log(f"WARNING: HF tokenizer and tokenizers differ on {text[:40]!r}: {a[:20]} vs {b[:20]}")
        return a

    # round-trip check on some corpus text
    for t in texts[-20:]:
        s = t[:2000]
        if hf_loaded.decode(encode(s)) != s:
            log(f"WARNING: decode(encode(x)) != x for {s[:40]!r}")

    samples = []
    for p in SAMPLE_PROMPTS:
        ids = encode(p)
        _, gen, _ = greedy(ref_model, ids, SAMPLE_NEW_TOKENS)
        samples.append((p, hf_loaded.decode(gen)))
    with open(os.path.join(args.model_dir, "samples.txt"), "w") as f:
        f.write(f"# Greedy continuations ({SAMPLE_NEW_TOKENS} new tokens), transformers float32 on the CPU\n"
                f"# from the saved bf16 weights. Generated by scripts/train_model.py.\n")
        for p, c in samples:
            f.write(f"\n===== prompt: {p!r}\n{p}{c}\n")

    cands = []
    for p in REF_CANDIDATES:
        ids = encode(p)
        first, gen, mg = greedy(ref_model, ids, REF_NEW_TOKENS)
        cands.append({"prompt": p, "ids": ids, "logits": [float(x) for x in first], "greedy": gen,
                      "margins": mg, "min_margin": min(mg)})
        log(f"ref candidate {p[:30]!r}: {len(ids)} tokens, min margin {min(mg):.4f}")
    chosen = [c for c in cands if c["min_margin"] >= 2e-3][:REF_COUNT]
    if len(chosen) < REF_COUNT:
        rest = sorted([c for c in cands if c not in chosen], key=lambda c: -c["min_margin"])
        chosen += rest[:REF_COUNT - len(chosen)]
    chosen.sort(key=lambda c: REF_CANDIDATES.index(c["prompt"]))
    ref = {
        "model": "cvllm-tiny-py",
        "dtype": "bfloat16",
        "prompts": [c["prompt"] for c in chosen],
        "prompt_ids": [c["ids"] for c in chosen],
        "greedy": [c["greedy"] for c in chosen],
        "greedy_text": [hf_loaded.decode(c["greedy"]) for c in chosen],
        "greedy_min_margin": [c["min_margin"] for c in chosen],
        "greedy_margins": [c["margins"] for c in chosen],
        "logits": [c["logits"] for c in chosen],
        "max_new_tokens": REF_NEW_TOKENS,
        "note": "transformers float32 on the CPU, eager attention, from the saved bf16 weights upcast to "
                "float32; logits[i] = last-position logits of prompt_ids[i]; greedy = plain argmax loop "
                "(full forward each step, no EOS stop); prompt_ids by the Hugging Face tokenizer",
        "generated_by": "scripts/train_model.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(args.ref_out, "w") as f:
        json.dump(ref, f)
        f.write("\n")
    return samples


def write_readme(model_dir, info, samples, config):
    c = info["corpus"]
    a = info["args"]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [cvllm, qwen3, demo, tiny]",
        "---",
        "",
        "# cvllm-tiny-py",
        "",
        "A tiny Qwen3-architecture causal language model trained on the Python standard library's own source",
        "code. It exists to **demonstrate and test the cvllm inference engine** on a real, trained Hugging Face",
        "model folder that fits in the repository; it is not meant to be useful. Its completions look like",
        "Python but are frequently wrong, repetitive or nonsensical.",
        "",
        "## Files",
        "",
        "- `config.json`, `generation_config.json`, `model.safetensors` (bf16): written by transformers'",
        "  `save_pretrained`.",
        "- `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` (a minimal ChatML template): written by",
        "  `PreTrainedTokenizerFast.save_pretrained` (transformers 5 writes `tokenizer_class: TokenizersBackend`;",
        "  the script rewrites it to `PreTrainedTokenizerFast`, which transformers 4 and 5 both load, after checking",
        "  that transformers 5 still loads it identically).",
        "- `loss.png`: the loss curve; `samples.txt`: greedy sample outputs; `training_log.json`: the full",
        "  training log (settings, corpus statistics, loss history).",
        "",
        "## Data and license",
        "",
        f"All `*.py` files of the standard library of Python {c['python_version']} ({c['python_implementation']})",
        f"on the training machine (`{c['stdlib_path']}`, `site-packages`/`dist-packages` excluded, the `test`",
        f"package {'included' if c['includes_test_dirs'] else 'not present/not included'}): {c['files']} files,",
        f"{c['bytes']:,} bytes ({c['files_skipped_not_utf8']} files skipped as not UTF-8); sha256 over",
        f"(path, content) pairs `{c['sha256_of_files'][:16]}…`. The files were shuffled with a fixed seed and",
        "joined with `<|endoftext|>`; the last 1% of the token stream is the validation set.",
        "",
        "The Python standard library source is distributed under the **PSF License Agreement** (Python",
        "Software Foundation License Version 2; a few modules carry additional permissive notices, listed in",
        "Python's `LICENSE` file / the \"History and License\" section of the Python documentation). The",
        "corpus itself is not included in this repository.",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE trained with `tokenizers` {info['versions']['tokenizers']} on the same corpus:",
        f"{config.vocab_size - 3} BPE tokens (256 byte symbols + merges, min frequency 2) plus 3 special tokens at",
        f"the end: `<|endoftext|>` ({config.vocab_size - 3}, also eos/pad), `<|im_start|>`, `<|im_end|>`.",
        "`tokenizer.json` has Qwen's layout: no normalizer; pre-tokenizer",
        "`Sequence[Split(Qwen regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]`;",
        "ByteLevel post-processor and decoder. Average "
        f"{c['bytes'] / info['tokens_total']:.2f} bytes per token on the corpus.",
        "",
        "## Model",
        "",
        f"`Qwen3ForCausalLM`, {info['parameters']:,} parameters (tied input/output embeddings), stored in bf16:",
        "",
        "| setting | value |",
        "| --- | --- |",
        f"| vocab_size | {config.vocab_size} |",
        f"| hidden_size | {config.hidden_size} |",
        f"| intermediate_size | {config.intermediate_size} |",
        f"| num_hidden_layers | {config.num_hidden_layers} |",
        f"| num_attention_heads / num_key_value_heads | {config.num_attention_heads} / {config.num_key_value_heads} |",
        f"| head_dim | {config.head_dim} |",
        f"| max_position_embeddings | {config.max_position_embeddings} |",
        f"| rope theta | {a['rope_theta']:g} |",
        "| rms_norm_eps | 1e-6 |",
        "| tie_word_embeddings | true |",
        "",
        "## Training",
        "",
        f"On one {info['gpu']}, PyTorch {info['versions']['torch']}, transformers {info['versions']['transformers']},",
        f"Python {info['versions']['python']}. bf16 autocast, AdamW (betas 0.9/0.95, weight decay",
        f"{a['weight_decay']} on matrices), peak learning rate {a['lr']:g}, {a['warmup_steps']} warm-up steps then",
        f"a cosine decay to {a['min_lr_frac']:g}× over a fixed wall-clock budget of {a['time_budget']:.0f} s, gradient",
        f"clipping 1.0, batch {a['batch_size']} × {a['seq_len']} tokens of random windows of the training",
        f"stream{', torch.compile' if a['compile'] else ''}. Dropout {a['dropout']:g} during training only (on the",
        "embedding, attention and MLP outputs via forward hooks, and on attention probabilities); the saved",
        "model is a plain Qwen3 with no dropout.",
        "",
        f"- steps: {info['steps']:,}; tokens seen: {info['tokens_seen']:,} (≈{info['epochs']:.1f} passes over",
        f"  the {info['tokens_train']:,} training tokens)",
        f"- training loop: {info['train_seconds']:.0f} s ({info['tokens_per_s']:,.0f} tokens/s); whole run",
        f"  (corpus, tokenizer, training, saving, references): {info['total_seconds']:.0f} s",
        f"- final train loss {info['final_train_loss']:.3f}, final validation loss {info['final_val_loss']:.3f}",
        f"  (nats/token); the saved weights are from step {info['saved_step']:,} (validation loss",
        f"  {info['saved_val_loss']:.3f})",
        "",
        "![loss curve](loss.png)",
        "",
        "Command (run from the repository root on the GPU machine; the exact wrapper is in",
        "`scripts/README.md`):",
        "",
        "```",
        info["command"],
        "```",
        "",
        "## Sample outputs",
        "",
        "Greedy decoding, 100 new tokens, transformers float32 on the CPU from the saved bf16 weights",
        "(also in `samples.txt`):",
        "",
    ]
    for p, cont in samples:
        lines += [f"Prompt `{p!r}`:", "", "~~~", p + cont, "~~~", ""]
    lines += [
        "## Reference outputs",
        "",
        "`tests/fixtures/trained/reference.json` holds prompts, their token ids, last-position logits and",
        "48-token greedy continuations computed by transformers in float32 on the CPU from these weights;",
        "cvllm's tests compare against it.",
        "",
    ]
    with open(os.path.join(model_dir, "README.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
