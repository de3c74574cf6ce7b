// variants.mjs: tokenizer.json features Qwen3 does not use, checked against tokenizers.js on a tiny
// byte-level BPE vocabulary: ByteLevel(add_prefix_space, use_regex), Split Removed / invert /
// String patterns, (?i:...) / \w / \d rewriting, NFKC, normalized added tokens, lstrip/rstrip.
//   node variants.mjs gen DIR    writes DIR/<variant>/tokenizer.json, DIR/texts.jsonl, DIR/ref.json
//   node variants.mjs check DIR  compares DIR/c_<variant>.json (cvllm tokenize --output json)
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
const require = createRequire(path.resolve("tests/js/package.json"));
const [mode, dir] = process.argv.slice(2);
const mod = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;
const bs = []; for (let b = 0; b < 256; b++) bs.push(b);
const printable = (b) => (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
let n = 0; const map = {}; for (let b = 0; b < 256; b++) map[b] = printable(b) ? String.fromCharCode(b) : String.fromCharCode(256 + n++);
const vocab = {}; for (let b = 0; b < 256; b++) vocab[map[b]] = b;
Object.assign(vocab, { "he": 256, "ll": 257, "hell": 258, "hello": 259, "Ġw": 260, "Ġwor": 261, "abc": 262, "Ġh": 263 });
const merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġ h"];
const configs = {
  bl_prefix: { normalizer: null, pre_tokenizer: { type: "ByteLevel", add_prefix_space: true, use_regex: true } },
  removed: { normalizer: null, pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: "\\s+" }, behavior: "Removed", invert: false }, { type: "ByteLevel", add_prefix_space: false, use_regex: false }] } },
  invert: { normalizer: null, pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: "\\p{L}+" }, behavior: "Isolated", invert: true }, { type: "ByteLevel", add_prefix_space: false, use_regex: false }] } },
  string: { normalizer: null, pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { String: "l" }, behavior: "Isolated", invert: false }, { type: "ByteLevel", add_prefix_space: false, use_regex: false }] } },
  nfkc: { normalizer: { type: "NFKC" }, pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, use_regex: true } },
  ci: { normalizer: null, pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: "(?i:hel)|\\w+|\\d|\\s" }, behavior: "Isolated", invert: false }, { type: "ByteLevel", add_prefix_space: false, use_regex: false }] } },
};
const added = [
  { id: 300, content: "<s>", special: true },
  { id: 301, content: "[MASK]", lstrip: true, rstrip: true, special: false, normalized: false },
  { id: 302, content: "ｆｏｏ", special: false, normalized: true },
  { id: 303, content: "bar", special: false },
];
const texts = ["hello world", "  hello   wor ld  ", "ｈｅｌｌｏ ﬁ ²", "a  [MASK]  b", "x ｆｏｏ foo bar y", "HELLO Hello hElLo", "<s>hello<s>", "tab\there\nnew\r\nline", "  ", "héllo wörld 123 ½", "ll ll lll", " hello", "hello  "];
if (mode === "check") {
  const ref = JSON.parse(fs.readFileSync(`${dir}/ref.json`, "utf8"));
  let bad = 0;
  for (const name of Object.keys(configs)) {
    const got = JSON.parse(fs.readFileSync(`${dir}/c_${name}.json`, "utf8"));
    texts.forEach((s, i) => {
      if (JSON.stringify(got[i]) !== JSON.stringify(ref[name][i])) {
        bad++;
        console.error(`MISMATCH variant ${name} text ${JSON.stringify(s)}\n  ref:   ${JSON.stringify(ref[name][i])}\n  cvllm: ${JSON.stringify(got[i])}`);
      }
    });
  }
  console.log(`variants: ${Object.keys(configs).length} tokenizer.json variants x ${texts.length} texts, ${bad} mismatches`);
  process.exit(bad ? 1 : 0);
}
const out = {};
for (const [name, c] of Object.entries(configs)) {
  const tj = { version: "1.0", added_tokens: added, normalizer: c.normalizer, pre_tokenizer: c.pre_tokenizer, post_processor: null, decoder: { type: "ByteLevel" }, model: { type: "BPE", vocab, merges } };
  fs.mkdirSync(`${dir}/${name}`, { recursive: true });
  fs.writeFileSync(`${dir}/${name}/tokenizer.json`, JSON.stringify(tj));
  fs.writeFileSync(`${dir}/${name}/tokenizer_config.json`, "{}");
  const t = new Tokenizer(tj, {});
  out[name] = texts.map((s) => t.encode(s, { add_special_tokens: false }).ids);
}
fs.writeFileSync(`${dir}/texts.jsonl`, texts.map((s) => JSON.stringify(s)).join("\n") + "\n");
fs.writeFileSync(`${dir}/ref.json`, JSON.stringify(out));
console.log(Object.keys(configs).join(" "));
