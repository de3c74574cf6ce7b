#!/usr/bin/env bash
# test_cli.sh: the cvllm command end to end on the shipped model and on broken model folders:
# output formats, prompt files, per-request errors, stop strings, exit codes, bench json keys.
set -u
B=${CVLLM_BIN:-build/cvllm}
M=models/cvllm-tiny-py
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
json() { python3 -c "import json,sys; d=json.load(open('$1')); sys.exit(0 if ($2) else 1)"; }

check "--version names the backends" '$B --version | grep -qE "backends: (cuda,)?cpu"'
check "unknown command exits 2" '$B frobnicate >/dev/null 2>&1; [ $? = 2 ]'
check "complete without prompt exits 2" '$B complete $M >/dev/null 2>&1; [ $? = 2 ]'
check "bad --temperature exits 2" '$B complete $M --prompt x --temperature abc >/dev/null 2>&1; [ $? = 2 ]'
check "bad --kv-cache-memory exits 2" '$B complete $M --prompt x --kv-cache-memory 12Q >/dev/null 2>&1; [ $? = 2 ]'
check "bad --kv-cache-dtype exits 2" '$B complete $M --prompt x --kv-cache-dtype fp4 >/dev/null 2>&1; [ $? = 2 ]'
check "bf16 KV cache: twice the blocks in the same budget" '$B complete $M --prompt-ids 1,2 --max-tokens 2 --kv-cache-memory 64M --kv-cache-dtype bfloat16 2>&1 >/dev/null | grep -q "bf16: 49152 bytes per block, 1365 blocks"'

# greedy text and ids agree between text and id prompts, json has every field
$B complete $M --prompt 'import os' --max-tokens 12 --temperature 0 --output json --quiet > $T/a.json
check "json output fields" "json $T/a.json 'len(d)==1 and set(d[0])=={\"prompt_token_ids\",\"token_ids\",\"text\",\"finish_reason\",\"num_cached_tokens\"} and len(d[0][\"token_ids\"])==12 and d[0][\"finish_reason\"]==\"length\"'"
ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$T/a.json'))[0]['prompt_token_ids'])))")
$B complete $M --prompt-ids $ids --max-tokens 12 --temperature 0 --output json --quiet > $T/b.json
check "id prompt = text prompt" "python3 -c \"import json; a=json.load(open('$T/a.json'))[0]; b=json.load(open('$T/b.json'))[0]; assert a['token_ids']==b['token_ids'] and a['text']==b['text']\""

# prompt file: order kept, per-request sampling fields, refused requests reported alone
cat > $T/p.jsonl <<'JSONL'
{"prompt": "import os\n", "max_tokens": 8, "temperature": 0}
{"prompt_token_ids": [1, 2, 3], "max_tokens": 4, "temperature": 0.5, "seed": 3}
{"prompt_token_ids": [1, 99999]}
{"prompt": "def f(x):", "stop": ["\n"], "max_tokens": 40, "temperature": 0}
not json
{"prompt": "x", "max_tokens": 5000}
{"prompt": "x", "top_p": 0}
JSONL
$B complete $M --prompt-file $T/p.jsonl --output json --quiet > $T/p.json 2>$T/p.err
rc=$?
check "prompt file with refused lines exits 1" '[ $rc = 1 ]'
check "prompt file: 7 results in order" "json $T/p.json 'len(d)==7 and \"error\" not in d[0] and \"error\" not in d[1] and len(d[0][\"token_ids\"])==8 and len(d[1][\"token_ids\"])==4'"
check "out-of-vocabulary id refused" "json $T/p.json '\"vocabulary\" in d[2][\"error\"]'"
check "stop string cut from text" "json $T/p.json 'd[3][\"finish_reason\"]==\"stop\" and \"\\n\" not in d[3][\"text\"]'"
check "malformed line refused" "json $T/p.json '\"line 5\" in d[4][\"error\"]'"
check "max_tokens beyond max_model_len refused" "json $T/p.json '\"max_model_len\" in d[5][\"error\"]'"
check "top_p 0 refused" "json $T/p.json '\"top_p\" in d[6][\"error\"]'"
$B complete $M --prompt-file $T/p.jsonl --output json --quiet > $T/p2.json 2>/dev/null
check "seeded requests reproducible" "python3 -c \"import json; a=json.load(open('$T/p.json')); b=json.load(open('$T/p2.json')); assert a[1]==b[1]\""

# --stop on the command line, and streaming text output ends with the completion
$B complete $M --prompt 'def f(x):' --stop $'\n' --max-tokens 40 --temperature 0 --quiet > $T/s.txt
check "--stop in text mode" '[ $(wc -l < $T/s.txt) = 1 ] && grep -q "^def f(x):" $T/s.txt'

# prefix caching: the same long prompt twice in one file; the second reuses cached blocks
python3 -c "
import json
p = list(range(10, 80))
print(json.dumps({'prompt_token_ids': p, 'max_tokens': 4, 'temperature': 0}))
print(json.dumps({'prompt_token_ids': p + [5, 6], 'max_tokens': 4, 'temperature': 0}))" > $T/pc.jsonl
$B complete $M --prompt-file $T/pc.jsonl --output json --quiet --max-num-seqs 1 > $T/pc.json
check "prefix cache hit reported" "json $T/pc.json 'd[0][\"num_cached_tokens\"]==0 and d[1][\"num_cached_tokens\"]==64'"
$B complete $M --prompt-file $T/pc.jsonl --output json --quiet --max-num-seqs 1 --no-enable-prefix-caching > $T/pc2.json
check "no prefix caching: nothing cached, same tokens" "python3 -c \"import json; a=json.load(open('$T/pc.json')); b=json.load(open('$T/pc2.json')); assert [x['token_ids'] for x in a]==[x['token_ids'] for x in b] and b[1]['num_cached_tokens']==0\""

# broken model folders: a clear error, exit 1, never a crash
cp -r $M $T/m
check "KV budget below one block" '$B complete $T/m --prompt-ids 1,2 --kv-cache-memory 1000 --quiet 2>&1 | grep -q "kv-cache-memory"'
python3 - "$T/m/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["hidden_size"] = 320; json.dump(c, open(sys.argv[1], "w"))
PY
$B complete $T/m --prompt-ids 1,2 --quiet > /dev/null 2>$T/e1; rc=$?
check "wrong shape names the tensor" '[ $rc = 1 ] && grep -q "model.embed_tokens.weight" $T/e1 && grep -q "320" $T/e1'
cp $M/config.json $T/m/config.json
head -c 100000 $M/model.safetensors > $T/m/model.safetensors
$B complete $T/m --prompt-ids 1,2 --quiet > /dev/null 2>$T/e2; rc=$?
check "truncated safetensors" '[ $rc = 1 ] && grep -qi "safetensors" $T/e2'
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' > $T/m/model.safetensors
$B complete $T/m --prompt-ids 1,2 --quiet > /dev/null 2>$T/e3; rc=$?
check "broken safetensors header" '[ $rc = 1 ] && [ -s $T/e3 ]'
echo '{"architectures": ["GPT2LMHeadModel"]}' > $T/m/config.json
$B complete $T/m --prompt-ids 1,2 --quiet > /dev/null 2>$T/e4; rc=$?
check "unsupported architecture" '[ $rc = 1 ] && grep -q "GPT2LMHeadModel" $T/e4'
echo '{' > $T/m/config.json
$B complete $T/m --prompt-ids 1,2 --quiet > /dev/null 2>$T/e5; rc=$?
check "malformed config.json" '[ $rc = 1 ] && grep -q "config.json" $T/e5'
check "missing folder" '$B complete $T/none --prompt-ids 1 --quiet >/dev/null 2>&1; [ $? = 1 ]'
if $B --version | grep -q "backends: cuda"; then # a CUDA build: no GPU here is a clear error
  check "--device cuda without a GPU" '$B complete $M --prompt-ids 1 --device cuda --quiet >/dev/null 2>$T/e6; [ $? = 0 ] || grep -q "no CUDA GPU present" $T/e6'
else
  check "--device cuda without CUDA" '$B complete $M --prompt-ids 1 --device cuda --quiet 2>&1 | grep -q "without the CUDA backend"'
fi

# chat through a pipe: one reply per line
printf 'hello\nhow are you\n' | $B chat $M --max-tokens 8 --temperature 0 > $T/chat.txt 2>&1
check "chat over a pipe" '[ $? = 0 ] && [ -s $T/chat.txt ]'

# the engine API's text path: a stop string completed by the last allowed token is "stop" (the
# text cut), as vLLM; a stop string that is not valid UTF-8 is a usage error
$B complete $M --prompt 'def fibonacci(n):' --max-tokens 4 --temperature 0 --output json --quiet > $T/len.json
$B complete $M --prompt 'def fibonacci(n):' --max-tokens 4 --stop ly --temperature 0 --output json --quiet > $T/stopl.json
check "stop string in the last token: finish stop" "json $T/len.json 'd[0][\"finish_reason\"]==\"length\" and d[0][\"text\"].endswith(\"ly\")' && json $T/stopl.json 'd[0][\"finish_reason\"]==\"stop\" and d[0][\"text\"]==json.load(open(\"$T/len.json\"))[0][\"text\"][:-2]'"
check "--include-stop-str-in-output keeps it" "$B complete $M --prompt 'def fibonacci(n):' --max-tokens 4 --stop ly --include-stop-str-in-output --temperature 0 --output json --quiet | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[0][\"text\"].endswith(\"ly\") and d[0][\"finish_reason\"]==\"stop\"'"
check "--stop with invalid UTF-8 exits 2" "$B complete $M --prompt x --stop \$'\\xe6' >/dev/null 2>&1; [ \$? = 2 ]"
check "--logprobs: one log-prob and top-3 per token" "$B complete $M --prompt-ids 5,6,7 --max-tokens 3 --logprobs 3 --temperature 0 --output json --quiet | python3 -c 'import json,sys; d=json.load(sys.stdin)[0]; assert len(d[\"logprobs\"])==3 and all(len(r)==3 for r in d[\"top_logprobs\"]) and all(x<=0 for x in d[\"logprobs\"]) and d[\"top_logprobs\"][0][0][0]==d[\"token_ids\"][0]'"
# chat: the default max-tokens is what the context leaves (it answers), invalid UTF-8 and NUL
# lines are refused with exit 1, an empty line ends the chat, a line of spaces is ignored
printf 'hi\n' | $B chat $M --temperature 0 > $T/c1.txt 2>$T/c1.err
check "chat default max-tokens answers" '[ $? = 0 ] && [ -s $T/c1.txt ] && [ ! -s $T/c1.err ]'
printf 'hi\xff\n' | $B chat $M --max-tokens 4 > /dev/null 2>$T/c2.err
check "chat: invalid UTF-8 refused, exit 1" '[ $? = 1 ] && grep -q "UTF-8" $T/c2.err'
printf 'a\000b\n' | $B chat $M --max-tokens 4 > /dev/null 2>$T/c3.err
check "chat: NUL byte refused, exit 1" '[ $? = 1 ] && grep -q "NUL" $T/c3.err'
printf '\nhi\n' | $B chat $M --max-tokens 4 --temperature 0 > $T/c4.txt 2>&1
check "chat: an empty line quits" '[ $? = 0 ] && [ ! -s $T/c4.txt ]'
printf '   \n' | $B chat $M --max-tokens 4 --temperature 0 > $T/c5.txt 2>&1
check "chat: a line of spaces is not sent" '[ $? = 0 ] && [ ! -s $T/c5.txt ]'

# bench throughput: small run, json keys (the workload's ids need a vocabulary above 10000). The
# bench zeroes its whole KV cache before timing: small budgets keep that quick here.
check "bench refuses a small vocabulary" '$B bench throughput $M --num-seqs 2 --kv-cache-memory 32M --quiet 2>&1 | grep -q "vocabulary of 4096"'
$B mkmodel --preset tiny --seed 0 $T/tiny > /dev/null
M=$T/tiny
$B bench throughput $M --num-seqs 4 --max-input-len 120 --max-output-len 110 --kv-cache-memory 64M --output json --quiet > $T/bench.json
check "bench throughput json" "json $T/bench.json 'set(d)=={\"num_seqs\",\"prompt_tokens\",\"output_tokens\",\"elapsed_s\",\"output_tok_per_s\",\"total_tok_per_s\",\"peak_kv_blocks_used\",\"num_kv_blocks\",\"device\"} and d[\"num_seqs\"]==4 and d[\"device\"]==\"cpu\" and d[\"peak_kv_blocks_used\"]>0'"
$B bench throughput $M --num-seqs 3 --input-len 50 --output-len 20 --kv-cache-memory 64M --output json --quiet > $T/bench2.json
check "bench fixed lengths" "json $T/bench2.json 'd[\"prompt_tokens\"]==150 and d[\"output_tokens\"]==60'"
check "bench ops sampler" '$B bench ops sampler | grep -q "greedy"'
check "bench ops: unknown part exits 2" '$B bench ops frobnicate >/dev/null 2>&1; [ $? = 2 ]'

if [ $fails = 0 ]; then echo "all CLI checks passed"; exit 0; fi
echo "$fails CLI checks failed"; exit 1
