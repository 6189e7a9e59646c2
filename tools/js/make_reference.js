// Writes the JS reference data the tokenizer tests compare against:
//   node tools/js/make_reference.js OUT_DIR [--seed N]
// OUT_DIR/corpus.jsonl        test strings (JSON string per line)
// OUT_DIR/ref_ids.jsonl       @lenml/tokenizers encode() of each string
// OUT_DIR/decode_cases.jsonl  {"ids": [...], "skip_special_tokens": bool}: random id sequences
// OUT_DIR/ref_decode.jsonl    the reference decode() of each case
// OUT_DIR/chat.jsonl          chat requests; OUT_DIR/ref_chat.jsonl the reference prompts
//                             (package Jinja template via @huggingface/jinja)
"use strict";

const fs = require("fs");
const path = require("path");
const { buildCorpus, buildConversations, rng } = require("./corpus.js");
const { tokenizerJSON, loadTokenizer, renderChat } = require("./deepseek.js");

function main() {
  const args = process.argv.slice(2);
  const outDir = args[0];
  if (!outDir) throw new Error("usage: make_reference.js OUT_DIR [--seed N]");
  const seedAt = args.indexOf("--seed");
  const seed = seedAt >= 0 ? Number(args[seedAt + 1]) : 20250101;
  fs.mkdirSync(outDir, { recursive: true });
  const write = (name, rows) =>
    fs.writeFileSync(path.join(outDir, name), rows.map((x) => JSON.stringify(x)).join("\n") + "\n");

  const tok = loadTokenizer();
  const added = tokenizerJSON.added_tokens.map((a) => a.content);

  // Encode.
  const corpus = buildCorpus(seed, added);
  write("corpus.jsonl", corpus);
  write("ref_ids.jsonl", corpus.map((s) => tok.encode(s)));

  // Decode of arbitrary id sequences (partial characters, specials, skip on/off).
  const r = rng(seed + 1);
  const vocab = tokenizerJSON.model.vocab;
  const byteIds = Object.entries(vocab).filter(([t]) => [...t].length === 1).map(([, id]) => id);
  const addedIds = tokenizerJSON.added_tokens.map((a) => a.id);
  const cases = [];
  for (let i = 0; i < 600; i++) {
    const ids = [];
    const n = r.range(1, 24);
    for (let k = 0; k < n; k++) {
      const kind = r.int(4);
      ids.push(kind === 0 ? r.pick(byteIds) : kind === 1 ? r.pick(addedIds) : r.int(128000));
    }
    cases.push({ ids, skip_special_tokens: r.chance(0.5) });
  }
  write("decode_cases.jsonl", cases);
  write("ref_decode.jsonl", cases.map((c) => tok.decode(c.ids, { skip_special_tokens: c.skip_special_tokens })));

  // Chat template.
  const conversations = buildConversations(seed + 2, 120);
  const prompts = conversations.map((req) => {
    const prompt = renderChat(req);
    if (req.thinking === undefined) {
      // The package's own apply_chat_template must agree with the direct Jinja rendering.
      const viaPackage = tok.apply_chat_template(req.messages, {
        add_generation_prompt: req.add_generation_prompt, tokenize: false });
      if (viaPackage !== prompt) throw new Error("apply_chat_template disagrees with @huggingface/jinja");
    }
    return prompt;
  });
  write("chat.jsonl", conversations);
  write("ref_chat.jsonl", prompts);
  console.log(`make_reference: ${corpus.length} strings, ${cases.length} decode cases, ` +
              `${conversations.length} conversations -> ${outDir}`);
}

main();
