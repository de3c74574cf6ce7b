#!/usr/bin/env python3
"""script_model.py MODEL_DIR OUT_DIR TEXT [--after ID]: writes a copy of a (random, e.g. `cvllm
mkmodel --preset tiny`) Qwen3 model whose greedy decoding, after token ID (default 198, "\\n",
the last token of Qwen3's generation prompt "<|im_start|>assistant\\n"), emits TEXT and then EOS.

How: every layer's o_proj and down_proj are zeroed, so the residual stream is the current token's
embedding; TEXT is cut into vocabulary tokens that are all different (a chain a -> b -> c ...),
each chain token gets a one-hot embedding in its own hidden dimension, and an untied lm_head row
for each successor points at its predecessor's dimension. The next token is then a function of
the current one only, and the chain spells TEXT. Pure Python (no numpy): reads and writes
safetensors directly. For the server's end-to-end tests of tool calls and reasoning output."""
import json, os, shutil, struct, sys

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return dict(zip(bs, map(chr, cs)))

def main():
    args = sys.argv[1:]
    after = 198
    if "--after" in args:
        i = args.index("--after"); after = int(args[i + 1]); del args[i:i + 2]
    src, out, text = args
    tok = json.load(open(os.path.join(src, "tokenizer.json")))
    cfg = json.load(open(os.path.join(src, "config.json")))
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], int) else cfg["eos_token_id"][0]
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    b2u = bytes_to_unicode()
    vocab = dict(tok["model"]["vocab"])           # byte-level strings -> id
    for a in tok.get("added_tokens", []):
        if not a.get("special"):
            vocab[a["content"]] = a["id"]          # e.g. <tool_call>, <think>
    # the target as a sequence of "pieces" (added tokens kept whole, other text byte-level)
    target = text
    inv = {}
    for s, i in vocab.items():
        inv.setdefault(s, i)
    def enc(s):  # text -> byte-level unicode string
        return "".join(b2u[b] for b in s.encode("utf-8"))
    added = [a["content"] for a in tok.get("added_tokens", []) if not a.get("special")]
    # positions where an added token starts: it must be used whole
    bl = enc(target)
    # map byte-level positions <-> text: work on text units; simple DFS over the text
    used = {after, eos}
    maxlen = max(len(s) for s in vocab)
    sys.setrecursionlimit(10000)
    import random
    res = []
    budget = [0]
    def dfs(pos, rng):
        if pos == len(target):
            return True
        budget[0] -= 1
        if len(res) >= H - 1 or budget[0] < 0:
            return False
        for a in added:
            if target.startswith(a, pos):
                i = vocab[a]
                if i in used: return False
                used.add(i); res.append(i)
                if dfs(pos + len(a), rng): return True
                used.discard(i); res.pop()
                return False
        opts = cands[pos][:]
        if rng: rng.shuffle(opts)   # restarts after the first (longest-first) try
        for L, i in opts:
            if i in used: continue
            used.add(i); res.append(i)
            if dfs(pos + L, rng): return True
            used.discard(i); res.pop()
        return False
    spans = []  # where added tokens are: a piece may not cut into one
    for a in added:
        k = target.find(a)
        while k >= 0:
            spans.append((k, k + len(a))); k = target.find(a, k + 1)
    cands = []  # per position: the (length, id) of every vocabulary token starting there
    for pos in range(len(target)):
        c = []
        for L in range(min(len(target) - pos, 32), 0, -1):
            piece = target[pos:pos + L]
            if any(pos < e and pos + L > st for st, e in spans): continue
            i = vocab.get(enc(piece))
            if i is not None: c.append((L, i))
        cands.append(c)
    found = False
    for attempt in range(200):
        used.clear(); used.update({after, eos}); res.clear(); budget[0] = 20000
        if dfs(0, random.Random(attempt) if attempt else None):
            found = True
            break
    if not found:
        sys.exit("script_model.py: cannot cut the text into %d distinct tokens" % (H - 1))
    chain = [after] + res + [eos]
    # read safetensors
    f = open(os.path.join(src, "model.safetensors"), "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {}
    for k, v in header.items():
        s, e = v["data_offsets"]
        tensors[k] = [v["dtype"], v["shape"], bytearray(data[s:e])]
    def bf16(x):
        return struct.pack("<f", x)[2:4]
    assert tensors["model.embed_tokens.weight"][0] == "BF16"
    for k, t in tensors.items():
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            t[2] = bytearray(len(t[2]))
    emb = bytearray(V * H * 2)
    head = bytearray(V * H * 2)
    for slot, t in enumerate(chain[:-1]):
        emb[(t * H + slot) * 2:(t * H + slot) * 2 + 2] = bf16(1.0)
        nxt = chain[slot + 1]
        head[(nxt * H + slot) * 2:(nxt * H + slot) * 2 + 2] = bf16(10.0)
    tensors["model.embed_tokens.weight"][2] = emb
    tensors["lm_head.weight"] = ["BF16", [V, H], head]
    tensors["model.norm.weight"][2] = bytearray(b"".join(bf16(1.0) for _ in range(H)))
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        if name != "model.safetensors":
            shutil.copy(os.path.join(src, name), os.path.join(out, name))
    cfg["tie_word_embeddings"] = False
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    hdr, off, blobs = {}, 0, []
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    if meta: hdr["__metadata__"] = meta
    hj = json.dumps(hdr).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as g:
        g.write(struct.pack("<Q", len(hj))); g.write(hj)
        for b in blobs: g.write(b)
    print(json.dumps({"ids": res, "tokens": len(res)}))

main()
