// JS side of the tokenizer benchmark (bench/tokenizer):
//   node tools/js/bench_encode.js make-corpus OUT.jsonl [--bytes N] [--seed S]
//       writes the mixed benchmark corpus (one JSON string document per line)
//   node tools/js/bench_encode.js encode CORPUS.jsonl [--rounds R]
//       encodes every document with @lenml/tokenizers (single thread) and prints one JSON
//       object: load time, MB/s per timed round, token count and an FNV-1a hash of all ids
//       (so the C++ driver can check both sides produced the same ids).
"use strict";

const fs = require("fs");

function arg(args, name, fallback) {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
}

// FNV-1a 64 over the ids as little-endian int32, matching bench/tokenizer's C++ side.
function hashIds(h, ids) {
  const prime = 0x100000001b3n;
  const mask = 0xffffffffffffffffn;
  for (const id of ids) {
    let v = id >>> 0;
    for (let k = 0; k < 4; k++) {
      h ^= BigInt(v & 0xff);
      h = (h * prime) & mask;
      v >>>= 8;
    }
  }
  return h;
}

function makeCorpus(args) {
  const { buildMixedText } = require("./corpus.js");
  const out = args[0];
  const bytes = Number(arg(args, "--bytes", 10_000_000));
  const seed = Number(arg(args, "--seed", 1));
  const docs = buildMixedText(bytes, seed);
  fs.writeFileSync(out, docs.map((d) => JSON.stringify(d)).join("\n") + "\n");
}

function encode(args) {
  const { loadTokenizer } = require("./deepseek.js");
  const docs = fs.readFileSync(args[0], "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
  const rounds = Number(arg(args, "--rounds", 3));
  const bytes = docs.reduce((a, d) => a + Buffer.byteLength(d), 0);
  const t0 = process.hrtime.bigint();
  const tok = loadTokenizer();
  const loadSeconds = Number(process.hrtime.bigint() - t0) / 1e9;

  // Warm-up: let V8 optimise the hot paths on the first ~1 MB.
  let warm = 0;
  for (const d of docs) {
    tok.encode(d);
    warm += d.length;
    if (warm > 1_000_000) break;
  }
  const mbPerSecond = [];
  let tokens = 0;
  let hash = 0xcbf29ce484222325n;
  for (let r = 0; r < rounds; r++) {
    const start = process.hrtime.bigint();
    const all = [];
    for (const d of docs) all.push(tok.encode(d));
    const seconds = Number(process.hrtime.bigint() - start) / 1e9;
    mbPerSecond.push(bytes / 1e6 / seconds);
    if (r === 0) {
      for (const ids of all) {
        tokens += ids.length;
        hash = hashIds(hash, ids);
      }
    }
  }
  console.log(JSON.stringify({
    engine: `@lenml/tokenizers (node ${process.version})`,
    load_seconds: loadSeconds, bytes, documents: docs.length, tokens,
    ids_fnv1a64: hash.toString(16).padStart(16, "0"), mb_per_second: mbPerSecond,
  }));
}

const [cmd, ...rest] = process.argv.slice(2);
if (cmd === "make-corpus") makeCorpus(rest);
else if (cmd === "encode") encode(rest);
else {
  console.error("usage: bench_encode.js make-corpus OUT [--bytes N] [--seed S] | encode CORPUS [--rounds R]");
  process.exit(2);
}
