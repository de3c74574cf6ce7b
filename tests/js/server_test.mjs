// server_test.mjs: `cvllm serve` end to end with the official `openai` npm client (and raw fetch
// for what a client library would not send). Run by tests/test_server.sh:
//   node server_test.mjs basic    BASE_URL KEY MODEL MAX_MODEL_LEN   (random Qwen3 model)
//   node server_test.mjs tools    BASE_URL MODEL                     (scripted model, qwen3 reasoning)
//   node server_test.mjs queue    BASE_URL MODEL                     (a server with a tiny queue)
//   node server_test.mjs load     BASE_URL KEY MODEL SERVER_PID N ROUNDS
// Prints "ok   name" / "FAIL name: why" per check; exits 1 if any failed.
import OpenAI from "openai";
import fs from "node:fs";

let fails = 0;
function check(name, cond, why = "") {
  if (cond) console.log(`ok   ${name}`);
  else { console.log(`FAIL ${name}${why ? ": " + why : ""}`); fails++; }
}
async function expectStatus(name, status, fn) {
  try {
    await fn();
    check(name, false, `no error (wanted ${status})`);
  } catch (e) {
    const got = e.status ?? e.code;
    const shape = e.error && typeof e.error.message === "string";
    check(name, got === status && shape, `status ${got}, error ${JSON.stringify(e.error ?? e.message)}`);
  }
}
async function raw(base, path, { method = "POST", body, key, headers = {} } = {}) {
  const h = { "Content-Type": "application/json", ...headers };
  if (key) h.Authorization = `Bearer ${key}`;
  const r = await fetch(base + path, { method, headers: h, body });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, json, text };
}
async function metrics(base) {
  const t = await (await fetch(base + "/metrics")).text();
  const get = (name) => {
    const m = t.match(new RegExp(`^cvllm:${name}\\{[^}]*\\} ([0-9.e+-]+)$`, "m"));
    return m ? Number(m[1]) : NaN;
  };
  return { text: t, get };
}
async function waitIdle(base, ms = 5000) {
  const end = Date.now() + ms;
  for (;;) {
    const m = await metrics(base);
    if ((m.get("num_requests_running") === 0 && m.get("num_requests_waiting") === 0 &&
         m.get("kv_cache_usage_perc") === 0) || Date.now() > end) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
}
async function streamText(client, params) {
  const s = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = "", usage = null, finish = null, chunks = 0;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) { text += ch.text; if (ch.finish_reason) finish = ch.finish_reason; chunks++; }
  }
  return { text, usage, finish, chunks };
}

async function basic(base, key, model, maxLen) {
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0 });
  const models = await client.models.list();
  check("models lists the served name", models.data.length === 1 && models.data[0].id === model);
  check("health", (await fetch(base + "/health")).status === 200);

  // completions: shapes, usage, greedy stream == non-stream
  const p = { model, prompt: "The capital of France is", max_tokens: 24, temperature: 0 };
  const a = await client.completions.create(p);
  check("completion object", a.object === "text_completion" && a.id.startsWith("cmpl-") && a.model === model &&
        typeof a.created === "number");
  check("completion usage", a.usage.prompt_tokens > 0 && a.usage.completion_tokens === 24 &&
        a.usage.total_tokens === a.usage.prompt_tokens + 24, JSON.stringify(a.usage));
  check("finish_reason length", a.choices[0].finish_reason === "length");
  const s = await streamText(client, p);
  check("streamed text = non-streamed (completions, greedy)", s.text === a.choices[0].text,
        `${JSON.stringify(s.text)} vs ${JSON.stringify(a.choices[0].text)}`);
  check("stream usage chunk", s.usage && s.usage.completion_tokens === 24 && s.usage.prompt_tokens === a.usage.prompt_tokens);
  check("stream finish_reason", s.finish === "length");
  check("stream has several chunks", s.chunks > 3, `${s.chunks}`);

  // chat: greedy stream == non-stream, the template's prompt
  const cp = { model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello!" }],
               max_tokens: 20, temperature: 0 };
  const c = await client.chat.completions.create(cp);
  check("chat object", c.object === "chat.completion" && c.id.startsWith("chatcmpl-") &&
        c.choices[0].message.role === "assistant" && typeof c.choices[0].message.content === "string");
  check("chat usage", c.usage.completion_tokens === 20 && c.usage.prompt_tokens > 10, JSON.stringify(c.usage));
  let st = "", role = null, cfinish = null, chunkShape = true;
  for await (const ch of await client.chat.completions.create({ ...cp, stream: true })) {
    const d = ch.choices[0]?.delta;
    if (d?.role) role = d.role;
    if (d?.content) st += d.content;
    if (ch.choices[0]?.finish_reason) cfinish = ch.choices[0].finish_reason;
    chunkShape &&= ch.object === "chat.completion.chunk" && ch.id.startsWith("chatcmpl-");
  }
  check("chat chunk objects", chunkShape);
  check("streamed chat = non-streamed", st === c.choices[0].message.content && role === "assistant" && cfinish === "length",
        `${JSON.stringify(st)} vs ${JSON.stringify(c.choices[0].message.content)}`);
  const mc = await client.chat.completions.create({ ...cp, max_tokens: undefined, max_completion_tokens: 5 });
  check("max_completion_tokens", mc.usage.completion_tokens === 5);
  const kw = await client.chat.completions.create({ ...cp, chat_template_kwargs: { enable_thinking: false }, max_tokens: 2 });
  check("chat_template_kwargs enable_thinking=false adds the empty think block",
        kw.usage.prompt_tokens === c.usage.prompt_tokens + 4, `${kw.usage.prompt_tokens} vs ${c.usage.prompt_tokens}`);
  const parts = await client.chat.completions.create({ ...cp, messages: [{ role: "system", content: [{ type: "text", text: "Be brief." }] },
                                                                         { role: "user", content: [{ type: "text", text: "Hello!" }] }] });
  check("content parts = string content", parts.choices[0].message.content === c.choices[0].message.content);

  // n > 1 and seeds
  const sp = { model, prompt: "Once upon a time", max_tokens: 12, temperature: 1.0, n: 3, seed: 1234 };
  const n1 = await client.completions.create(sp), n2 = await client.completions.create(sp);
  check("n=3 gives choices 0..2", n1.choices.length === 3 && n1.choices.map((x) => x.index).join() === "0,1,2");
  check("seeded requests reproduce", JSON.stringify(n1.choices.map((x) => x.text)) === JSON.stringify(n2.choices.map((x) => x.text)));
  check("n choices differ", new Set(n1.choices.map((x) => x.text)).size > 1);
  check("n usage counts every choice", n1.usage.completion_tokens === 36);
  const n3 = await client.completions.create({ ...sp, seed: 99 });
  check("another seed, other text", JSON.stringify(n3.choices.map((x) => x.text)) !== JSON.stringify(n1.choices.map((x) => x.text)));
  let sn = ["", "", ""];
  for await (const ch of await client.completions.create({ ...sp, stream: true })) for (const x of ch.choices) sn[x.index] += x.text;
  check("n=3 streamed = non-streamed (seeded)", JSON.stringify(sn) === JSON.stringify(n1.choices.map((x) => x.text)));

  // batch of prompts, token-id prompts, echo
  const ids = await raw(base, "/tokenize", { body: JSON.stringify({ prompt: "The capital of France is" }) });
  check("tokenize", ids.status === 200 && ids.json.count === ids.json.tokens.length && ids.json.max_model_len === maxLen);
  const back = await raw(base, "/detokenize", { body: JSON.stringify({ tokens: ids.json.tokens }) });
  check("detokenize round trip", back.status === 200 && back.json.prompt === "The capital of France is");
  const byIds = await client.completions.create({ ...p, prompt: ids.json.tokens });
  check("token-id prompt = text prompt", byIds.choices[0].text === a.choices[0].text);
  const batch = await client.completions.create({ ...p, prompt: ["The capital of France is", "1, 2, 3,"] });
  check("batch of prompts", batch.choices.length === 2 && batch.choices[0].text === a.choices[0].text);
  const echo = await client.completions.create({ ...p, echo: true });
  check("echo", echo.choices[0].text === p.prompt + a.choices[0].text);

  // stop strings: cut the greedy text at a substring of it
  const full = a.choices[0].text;
  let stop = null;
  for (let i = 3; i + 2 <= full.length && !stop; i++) {
    const cand = full.slice(i, i + 2);
    if (full.indexOf(cand) === i && !/\uFFFD/.test(cand) && cand.length === [...cand].length) stop = cand;
  }
  if (stop) {
    const sa = await client.completions.create({ ...p, stop: [stop] });
    check("stop string cuts the text", sa.choices[0].text === full.slice(0, full.indexOf(stop)) && sa.choices[0].finish_reason === "stop",
          `${JSON.stringify(sa.choices[0].text)} stop ${JSON.stringify(stop)}`);
    check("stop_reason names the string", sa.choices[0].stop_reason === stop);
    const ss = await streamText(client, { ...p, stop: [stop] });
    check("stop string, streamed", ss.text === sa.choices[0].text && ss.finish === "stop");
    const inc = await client.completions.create({ ...p, stop: [stop], include_stop_str_in_output: true });
    check("include_stop_str_in_output", inc.choices[0].text === full.slice(0, full.indexOf(stop)) + stop);
  } else check("stop string test found a stop string", false, JSON.stringify(full));

  // logprobs
  const lp = await client.completions.create({ ...p, max_tokens: 6, logprobs: 2 });
  const L = lp.choices[0].logprobs;
  check("completions logprobs shape", L && L.tokens.length === 6 && L.token_logprobs.length === 6 && L.top_logprobs.length === 6 &&
        L.text_offset.length === 6 && L.token_logprobs.every((x) => x <= 0) && Object.keys(L.top_logprobs[0]).length >= 2,
        JSON.stringify(L));
  check("greedy token is the top log-prob", L.top_logprobs.every((t, i) => Math.max(...Object.values(t)) <= L.token_logprobs[i] + 1e-4));
  check("logprob tokens spell the text", L.tokens.join("") === lp.choices[0].text || /\uFFFD/.test(L.tokens.join("")));
  const clp = await client.chat.completions.create({ ...cp, max_tokens: 4, logprobs: true, top_logprobs: 3 });
  const C = clp.choices[0].logprobs;
  check("chat logprobs shape", C && C.content.length === 4 && C.content.every((t) => t.top_logprobs.length === 3 &&
        typeof t.token === "string" && Array.isArray(t.bytes) && t.logprob <= 0), JSON.stringify(C).slice(0, 300));
  let slp = 0;
  for await (const ch of await client.chat.completions.create({ ...cp, max_tokens: 4, logprobs: true, top_logprobs: 3, stream: true }))
    slp += ch.choices[0]?.logprobs?.content?.length ?? 0;
  check("chat logprobs streamed", slp === 4);
  const ign = await client.completions.create({ ...p, max_tokens: 40, ignore_eos: true, presence_penalty: 0.5,
                                                frequency_penalty: 0.5, repetition_penalty: 1.2, top_k: 5, top_p: 0.9, min_p: 0.05, temperature: 0.8, seed: 3 });
  check("sampling fields accepted", ign.usage.completion_tokens === 40);

  // errors
  await expectStatus("400 unknown model", 400, () => client.completions.create({ ...p, model: "nope" }));
  await expectStatus("400 wrong field type", 400, () => client.completions.create({ ...p, temperature: "hot" }));
  await expectStatus("400 prompt over max-model-len", 400, () => client.completions.create({ ...p, prompt: Array(maxLen + 5).fill(11) }));
  await expectStatus("400 impossible max_tokens", 400, () => client.completions.create({ ...p, max_tokens: maxLen }));
  await expectStatus("400 max_tokens 0", 400, () => client.completions.create({ ...p, max_tokens: 0 }));
  await expectStatus("400 id outside the vocabulary", 400, () => client.completions.create({ ...p, prompt: [1, 99999999] }));
  await expectStatus("400 stop token id outside the vocabulary", 400, () => client.completions.create({ ...p, stop_token_ids: [99999999] }));
  await expectStatus("400 missing messages", 400, () => client.chat.completions.create({ model }));
  await expectStatus("400 tool_choice required", 400, () => client.chat.completions.create({ ...cp, tool_choice: "required",
    tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }] }));
  const bad = new OpenAI({ baseURL: base + "/v1", apiKey: "wrong", maxRetries: 0 });
  await expectStatus("401 wrong key", 401, () => bad.completions.create(p));
  let r = await raw(base, "/v1/completions", { body: JSON.stringify(p) });
  check("401 missing key", r.status === 401 && r.json?.error?.code === "invalid_api_key");
  r = await raw(base, "/v1/completions", { key, body: '{"prompt": "x", ' });
  check("400 malformed JSON", r.status === 400 && typeof r.json?.error?.message === "string" && r.json.error.type === "invalid_request_error");
  r = await raw(base, "/v1/completions", { key, body: Buffer.from([0x7b, 0x22, 0x70, 0x72, 0x6f, 0x6d, 0x70, 0x74, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]) });
  check("400 invalid UTF-8", r.status === 400 && /UTF-8/.test(r.json?.error?.message ?? ""), r.text);
  r = await raw(base, "/v1/completions", { key, body: JSON.stringify({ ...p, prompt: "x".repeat(200000) }) });
  check("413 body over the limit", r.status === 413 && r.json?.error, `${r.status}`);
  r = await raw(base, "/v1/nothing", { key, method: "GET" });
  check("404 unknown path", r.status === 404 && r.json?.error);
  r = await raw(base, "/v1/completions", { key, method: "GET" });
  check("405 wrong method", r.status === 405);
  r = await raw(base, "/v1/completions", { key, body: JSON.stringify({ ...p, prompt: "\u00e9\ud83d\ude00", max_tokens: 3 }) });
  check("non-ASCII prompt", r.status === 200);

  // a client that goes away mid-stream: its request is aborted and its blocks freed
  const ac = new AbortController();
  const long = await client.completions.create({ model, prompt: "Count:", max_tokens: Math.min(3000, maxLen - 10),
                                                 ignore_eos: true, temperature: 0, stream: true }, { signal: ac.signal });
  let got = 0;
  try { for await (const ch of long) { if (++got === 5) ac.abort(); } } catch (e) {}
  await new Promise((res) => setTimeout(res, 100));
  const busy = await metrics(base);
  const idle = await waitIdle(base, 3000);
  check("abort mid-stream frees the request and its KV blocks",
        idle.get("num_requests_running") === 0 && idle.get("kv_cache_usage_perc") === 0,
        `running ${idle.get("num_requests_running")} kv ${idle.get("kv_cache_usage_perc")} (100 ms after: running ${busy.get("num_requests_running")})`);
  // the same for a non-streamed request: the server notices the closed socket while it waits
  const ac2 = new AbortController();
  const t0 = Date.now();
  const pend = client.completions.create({ model, prompt: "Count again:", max_tokens: Math.min(3000, maxLen - 10),
                                           ignore_eos: true, temperature: 0 }, { signal: ac2.signal }).catch(() => null);
  await new Promise((res) => setTimeout(res, 300));
  const during = await metrics(base);
  ac2.abort();
  await pend;
  const idle2 = await waitIdle(base, 3000);
  check("abort of a non-streamed request frees it", during.get("num_requests_running") === 1 &&
        idle2.get("num_requests_running") === 0 && idle2.get("kv_cache_usage_perc") === 0 && Date.now() - t0 < 2000,
        `running during ${during.get("num_requests_running")}, after ${idle2.get("num_requests_running")}, ${Date.now() - t0} ms`);
  const aborted = idle.text.match(/^cvllm:request_success_total\{[^}]*finished_reason="abort"\} (\d+)$/m);
  check("abort counted", aborted && Number(aborted[1]) >= 1, aborted ? aborted[0] : "no line");
  const m = idle.text;
  for (const name of ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
                      "prefix_cache_hits_total", "prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
                      "time_to_first_token_seconds_bucket", "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_count"])
    check(`metrics has cvllm:${name}`, m.includes(`cvllm:${name}{`));
  check("prefix cache hits counted", idle.get("prefix_cache_hits_total") > 0);
  check("generation tokens counted", idle.get("generation_tokens_total") > 100);
}

async function tools(base, model) {
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0 });
  const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
                   parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
  const req = { model, messages: [{ role: "user", content: "Weather in Paris?" }], tools, temperature: 0, max_tokens: 64 };
  const r = await client.chat.completions.create(req);
  const m = r.choices[0].message;
  check("tool call parsed", m.tool_calls?.length === 1 && m.tool_calls[0].type === "function" &&
        m.tool_calls[0].function.name === "get_weather" && m.tool_calls[0].id.startsWith("chatcmpl-tool-"), JSON.stringify(m));
  check("tool arguments", m.tool_calls?.[0] && JSON.stringify(JSON.parse(m.tool_calls[0].function.arguments)) === '{"city":"Paris"}',
        m.tool_calls?.[0]?.function?.arguments);
  check("finish_reason tool_calls", r.choices[0].finish_reason === "tool_calls");
  check("reasoning_content", m.reasoning_content === "The user wants the weather.", JSON.stringify(m.reasoning_content));
  check("content before the call", m.content === "\n\nLet me check!", JSON.stringify(m.content));
  let reasoning = "", content = "", calls = [], finish = null;
  for await (const ch of await client.chat.completions.create({ ...req, stream: true })) {
    const d = ch.choices[0]?.delta ?? {};
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) content += d.content;
    for (const t of d.tool_calls ?? []) {
      if (!calls[t.index]) calls[t.index] = { id: t.id, name: "", arguments: "" };
      if (t.function?.name) calls[t.index].name += t.function.name;
      if (t.function?.arguments) calls[t.index].arguments += t.function.arguments;
    }
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
  }
  check("streamed tool call", calls.length === 1 && calls[0].name === "get_weather" &&
        calls[0].arguments === m.tool_calls?.[0]?.function?.arguments && finish === "tool_calls", JSON.stringify(calls));
  check("streamed reasoning and content", reasoning === m.reasoning_content && content === m.content,
        `${JSON.stringify(reasoning)} ${JSON.stringify(content)}`);
  const none = await client.chat.completions.create({ ...req, tool_choice: "none" });
  check("tool_choice none: the text stays content", none.choices[0].message.content.includes("<tool_call>") &&
        none.choices[0].finish_reason === "stop" && none.choices[0].message.tool_calls.length === 0);
  const plain = await client.chat.completions.create({ ...req, tools: undefined });
  check("no tools: no parsing", plain.choices[0].message.content.includes('<tool_call>{"name":"get_weather"'));
  // the tool result goes back through the template
  const follow = await client.chat.completions.create({ ...req, messages: [...req.messages, m,
    { role: "tool", tool_call_id: m.tool_calls?.[0]?.id, content: "18 C, sunny" }] });
  check("tool result message renders", follow.choices.length === 1);
}

async function queue(base, model) {
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0 });
  const ps = [];
  for (let i = 0; i < 3; i++)
    ps.push(client.completions.create({ model, prompt: "Go", max_tokens: 400, ignore_eos: true, temperature: 0 })
              .then(() => 200, (e) => e.status));
  await new Promise((r) => setTimeout(r, 300));
  let status = 0;
  try { await client.completions.create({ model, prompt: "Go", max_tokens: 2 }); status = 200; } catch (e) { status = e.status; }
  check("503 when the queue is full", status === 503, `${status}`);
  const done = await Promise.all(ps);
  check("queued requests still complete", done.every((s) => s === 200), JSON.stringify(done));
}

function rssKb(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : 0;
}

async function load(base, key, model, pid, n, rounds) {
  const client = new OpenAI({ baseURL: base + "/v1", apiKey: key, maxRetries: 0, timeout: 600000 });
  const prompts = Array.from({ length: n }, (_, i) => `Request ${i}: the number ${i * 7919 % 1000} is`);
  const params = (i) => ({ model, prompt: prompts[i], max_tokens: 16 + (i % 8), temperature: 0 });
  const t0 = Date.now();
  const ref = await Promise.all(prompts.map((_, i) => client.completions.create(params(i))));
  console.log(`# ${n} concurrent non-streamed requests: ${(Date.now() - t0) / 1000} s`);
  const rss = [];
  for (let round = 0; round < rounds; round++) {
    const t1 = Date.now();
    const outs = await Promise.all(prompts.map((_, i) => streamText(client, params(i)).catch((e) => ({ error: String(e) }))));
    const bad = outs.map((o, i) => (o.text === ref[i].choices[0].text && o.usage?.completion_tokens === 16 + (i % 8) ? null : i)).filter((x) => x !== null);
    check(`round ${round}: ${n} concurrent streams complete with the non-streamed text`, bad.length === 0,
          `${bad.length} differ, e.g. #${bad[0]}: ${JSON.stringify(outs[bad[0]])} vs ${JSON.stringify(ref[bad[0]]?.choices[0].text)}`);
    const idle = await waitIdle(base, 5000);
    check(`round ${round}: idle afterwards (no running request, zero KV usage)`,
          idle.get("num_requests_running") === 0 && idle.get("num_requests_waiting") === 0 && idle.get("kv_cache_usage_perc") === 0);
    rss.push(rssKb(pid));
    console.log(`# round ${round}: ${(Date.now() - t1) / 1000} s, server RSS ${rss[round]} kB`);
  }
  if (process.env.CVLLM_SKIP_RSS_CHECK) {
    console.log(`skipped memory growth check (sanitizer build: ASan's quarantine and TSan's shadow memory grow; LeakSanitizer checks leaks at exit). RSS ${rss.join(" -> ")} kB`);
  } else if (rounds >= 3) {
    const growth = rss[rounds - 1] - rss[1];
    check("memory does not grow over rounds", growth < 16384, `RSS ${rss.join(" -> ")} kB`);
  }
}

const [mode, ...args] = process.argv.slice(2);
try {
  if (mode === "basic") await basic(args[0], args[1], args[2], Number(args[3]));
  else if (mode === "tools") await tools(args[0], args[1]);
  else if (mode === "queue") await queue(args[0], args[1]);
  else if (mode === "load") await load(args[0], args[1], args[2], Number(args[3]), Number(args[4]), Number(args[5]));
  else throw new Error("mode?");
} catch (e) {
  console.log(`FAIL ${mode}: uncaught ${e.stack ?? e}`);
  fails++;
}
process.exit(fails ? 1 : 0);
