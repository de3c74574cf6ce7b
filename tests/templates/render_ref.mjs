// render_ref.mjs: the reference renderer for tests/test_chat_template_ref.sh. Same arguments and
// same variables as `cvllm template`, rendered with @huggingface/jinja (tests/js, pinned 0.5.11):
//   node render_ref.mjs MODEL_DIR --messages M.json [--tools T.json] [--add-generation-prompt]
//                       [--chat-template-kwargs JSON]
// Prints the prompt exactly; on a template error prints the error to stderr and exits 1.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "js", "package.json"));
const { Template } = await import(require.resolve("@huggingface/jinja"));

const args = process.argv.slice(2);
let modelDir = null, messagesPath = null, toolsPath = null, kwargs = {}, agp = false;
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--messages") messagesPath = args[++i];
  else if (a === "--tools") toolsPath = args[++i];
  else if (a === "--chat-template-kwargs") kwargs = JSON.parse(args[++i]);
  else if (a === "--add-generation-prompt") agp = true;
  else modelDir = a;
}
const cfg = JSON.parse(readFileSync(join(modelDir, "tokenizer_config.json"), "utf8"));
let src = cfg.chat_template;
if (Array.isArray(src)) src = src.find((t) => t.name === "default").template;
const token = (t) => (t && typeof t === "object" ? t.content : t);
const vars = { messages: JSON.parse(readFileSync(messagesPath, "utf8")) };
if (toolsPath) vars.tools = JSON.parse(readFileSync(toolsPath, "utf8"));
vars.add_generation_prompt = agp;
if (typeof token(cfg.bos_token) === "string") vars.bos_token = token(cfg.bos_token);
if (typeof token(cfg.eos_token) === "string") vars.eos_token = token(cfg.eos_token);
Object.assign(vars, kwargs);
try {
  process.stdout.write(new Template(src).render(vars));
} catch (e) {
  process.stderr.write(`reference error: ${e.message}\n`);
  process.exit(1);
}
