// check.mjs: compares cvllm's tokenizer output with @huggingface/tokenizers (tokenizers.js),
// loaded at test time from tests/js/node_modules. Used by tests/test_tokenizer_ref.sh.
//
//   node check.mjs ids MODEL_DIR CORPUS C_IDS_JSON OUT_IDS_JSONL
//       C_IDS_JSON: `cvllm tokenize --input-jsonl CORPUS --output json`; checks exact equality
//       with tokenizer.encode(s, {add_special_tokens: false}).ids and writes the reference ids,
//       one JSON array per line, for the decode step.
//   node check.mjs decode MODEL_DIR CORPUS IDS_JSONL C_DEC_JSONL C_DEC_SKIP_JSONL
//       C_DEC*: `cvllm detokenize --input-jsonl IDS_JSONL [--skip-special-tokens]`; checks
//       decode(encode(x)) == x.normalize("NFC") and equality with tokenizers.js's decode.
// Exit status 1 on any mismatch, after printing the first few with the string.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(path.resolve("tests/js/package.json"));
const mod = await import(require.resolve("@huggingface/tokenizers"));
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;

const [mode, dir, corpusPath, ...rest] = process.argv.slice(2);
const tok = new Tokenizer(
  JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
);
const corpus = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
const show = (s) => JSON.stringify(s.length > 200 ? s.slice(0, 200) + "…" : s);
const readJsonl = (p) => fs.readFileSync(p, "utf8").split("\n").filter((l) => l.length).map((l) => JSON.parse(l));
let bad = 0;
const fail = (msg) => { if (++bad <= 10) console.error(msg); };

if (mode === "ids") {
  const [cIdsPath, outPath] = rest;
  const cIds = JSON.parse(fs.readFileSync(cIdsPath, "utf8"));
  // cvllm skips empty lines of the input only if the line itself is empty; "" is a 2-byte line.
  if (cIds.length !== corpus.length) fail(`count: cvllm gave ${cIds.length} id lists for ${corpus.length} strings`);
  const lines = [];
  corpus.forEach((s, i) => {
    const ref = s.length ? tok.encode(s, { add_special_tokens: false }).ids : [];
    lines.push(JSON.stringify(ref));
    const got = cIds[i] ?? [];
    if (JSON.stringify(ref) !== JSON.stringify(got)) {
      let k = 0;
      while (k < ref.length && ref[k] === got[k]) k++;
      fail(`MISMATCH #${i} ${show(s)}\n  first difference at position ${k}\n  ref:    ${JSON.stringify(ref.slice(k, k + 12))}\n  cvllm:  ${JSON.stringify(got.slice(k, k + 12))}`);
    }
  });
  // extra lines: random id sequences (byte tokens that form invalid UTF-8, special tokens, any id),
  // for which only decoding is compared (tokenizers.js vs cvllm)
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const vocabSize = tok.get_vocab().size;
  for (let k = 0; k < 500; k++) {
    const ids = [];
    for (let i = 1 + rnd(30); i > 0; i--) ids.push(rnd(4) === 0 ? rnd(vocabSize) : rnd(3) === 0 ? 151643 + rnd(26) : rnd(256));
    lines.push(JSON.stringify(ids));
  }
  fs.writeFileSync(outPath, lines.join("\n") + "\n");
  console.log(`ids: ${corpus.length - bad}/${corpus.length} strings identical to tokenizers.js`);
} else if (mode === "decode") {
  const [idsPath, decPath, decSkipPath] = rest;
  const ids = readJsonl(idsPath), dec = readJsonl(decPath), decSkip = readJsonl(decSkipPath);
  corpus.forEach((s, i) => {
    const nfc = s.normalize("NFC");
    if (dec[i] !== nfc) fail(`ROUNDTRIP #${i} ${show(s)}\n  decode(encode(x)) = ${show(dec[i] ?? "<missing>")}\n  NFC(x)            = ${show(nfc)}`);
    if (ids[i].length) {
      const ref = tok.decode(ids[i]);
      if (dec[i] !== ref) fail(`DECODE #${i} ${show(s)}\n  cvllm: ${show(dec[i])}\n  ref:   ${show(ref)}`);
      const refSkip = tok.decode(ids[i], { skip_special_tokens: true });
      if (decSkip[i] !== refSkip) fail(`DECODE skip_special #${i} ${show(s)}\n  cvllm: ${show(decSkip[i])}\n  ref:   ${show(refSkip)}`);
    }
  });
  for (let i = corpus.length; i < ids.length; i++) {
    const ref = tok.decode(ids[i]), refSkip = tok.decode(ids[i], { skip_special_tokens: true });
    if (dec[i] !== ref) fail(`DECODE random ids ${JSON.stringify(ids[i])}\n  cvllm: ${show(dec[i] ?? "<missing>")}\n  ref:   ${show(ref)}`);
    if (decSkip[i] !== refSkip) fail(`DECODE skip_special random ids ${JSON.stringify(ids[i])}\n  cvllm: ${show(decSkip[i] ?? "<missing>")}\n  ref:   ${show(refSkip)}`);
  }
  console.log(`decode: ${corpus.length} strings and ${ids.length - corpus.length} random id lists checked, ${bad} problems`);
} else {
  console.error("usage: node check.mjs ids|decode ...");
  process.exit(2);
}
process.exit(bad ? 1 : 0);
