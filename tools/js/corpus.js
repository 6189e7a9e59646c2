// Deterministic test corpora for the pdserve tokenizer (no data files: everything is
// generated from a seeded PRNG, so a seed fully determines the output).
//
//   buildCorpus(seed, specialTokens)   >= 2,000 strings covering the categories the tokenizer
//                                      must get right (see CATEGORY list below)
//   buildMixedText(bytes, seed)        documents of mixed text totalling `bytes` UTF-8 bytes
//                                      (benchmark input)
//   buildConversations(seed, n)        chat requests for the chat-template comparison
//
// Characters are drawn from blocks assigned in Unicode 14 or earlier: the system PCRE2
// (10.42) knows Unicode 14, Node's ICU knows later versions, and a character unknown to one
// side would be classified differently by \p{L} etc. (see docs/tokenizer.md).
"use strict";

function rng(seed) {
  // mulberry32
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const r = {
    next,
    int: (n) => Math.floor(next() * n),
    range: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: (arr) => arr[Math.floor(next() * arr.length)],
    chance: (p) => next() < p,
  };
  return r;
}

const cp = (c) => String.fromCodePoint(c);
const fromRange = (r, lo, hi) => cp(r.range(lo, hi));
const repeat = (n, f) => Array.from({ length: n }, f).join("");

const EN_WORDS = (
  "the of and to in is was he for it with as his on be at by had are but from or have an they which " +
  "one you were all we her she there would their will when who him been has more if no out do so can " +
  "what up said about other into than its time only could new them man some these then two first may " +
  "any like now my such make over our even most me state after also made many did must before back see " +
  "through way where get much go well your know should down work year because come people just say " +
  "tokenizer transformer attention inference latency throughput kernel cache prefill decode quantization " +
  "isn't don't we're they've I'm you'll he'd it's O'Reilly rock'n'roll naïve café résumé coöperate"
).split(" ");
const EN_PUNCT = [".", ",", "!", "?", ";", ":", "...", " -", " --", "'", "\"", "(", ")", "[", "]", "—", "–", "…"];
const ZH_CHARS =
  "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理府研质";
const ZH_PUNCT = ["，", "。", "！", "？", "、", "；", "：", "「", "」", "（", "）", "《", "》", "“", "”"];
const JA_KANJI = "日本語東京大学先生時間電車天気今日明会社仕事言葉漢字平仮名片仮名読書";
const CODE_IDENTS = ["x", "i", "count", "buffer", "token_ids", "kvCache", "max_len", "self", "node", "value", "req", "MAX_BATCH", "_tmp", "αβγ", "名前"];

function english(r) {
  const n = r.range(3, 30);
  let s = "";
  for (let i = 0; i < n; i++) {
    let w = r.pick(EN_WORDS);
    if (r.chance(0.1)) w = w[0].toUpperCase() + w.slice(1);
    if (r.chance(0.03)) w = w.toUpperCase();
    s += (i ? " " : "") + w;
    if (r.chance(0.12)) s += r.pick(EN_PUNCT);
    if (r.chance(0.04)) s += " " + r.range(0, 99999);
  }
  return s + r.pick([".", "!", "?", "", "\n", " "]);
}

function chinese(r) {
  let s = "";
  const n = r.range(4, 60);
  for (let i = 0; i < n; i++) {
    s += ZH_CHARS[r.int(ZH_CHARS.length)];
    if (r.chance(0.1)) s += r.pick(ZH_PUNCT);
    if (r.chance(0.04)) s += r.pick([" ", "AI", " GPU ", "2024年", "3.14", "DeepSeek", "😀", "\n"]);
    if (r.chance(0.02)) s += fromRange(r, 0x4e00, 0x9fa5);
    if (r.chance(0.01)) s += fromRange(r, 0x3400, 0x4dbf);  // CJK Ext A: outside the CJK split class
  }
  return s;
}

function japanese(r) {
  let s = "";
  const n = r.range(4, 50);
  for (let i = 0; i < n; i++) {
    const k = r.int(5);
    if (k === 0) s += fromRange(r, 0x3041, 0x3096);  // hiragana
    else if (k === 1) s += fromRange(r, 0x30a1, 0x30fa);  // katakana
    else if (k === 2) s += JA_KANJI[r.int(JA_KANJI.length)];
    else if (k === 3) s += r.pick(["ー", "。", "、", "「", "」", "・", "ｶﾀｶﾅ", "ﾞ", "〜", " "]);
    else s += r.pick(["です", "ます", "した", "ません", "コンピューター", "トークナイザー"]);
  }
  return s;
}

function korean(r) {
  let s = "";
  const words = r.range(2, 15);
  for (let w = 0; w < words; w++) {
    s += (w ? r.pick([" ", " ", ", ", ". ", "\n"]) : "") + repeat(r.range(1, 5), () => fromRange(r, 0xac00, 0xd7a3));
    if (r.chance(0.1)) s += r.pick(["입니다", "했습니다", "123", "KRW", "ㅋㅋㅋ", "ㅎㅎ"]);
  }
  return s;
}

const CODE_TEMPLATES = [
  (r, id, n) => `def ${id}(a, b=${n}):\n    """Docstring."""\n    return a * b + ${n} # comment\n`,
  (r, id, n) => `#include <vector>\nint ${id}(const std::vector<int>& v) {\n\tint s = 0;\n\tfor (int x : v) s += x << ${n % 8};\n\treturn s;\n}\n`,
  (r, id, n) => `const ${id} = async (req) => {\n  const { data } = await fetch(\`/api/v1/\${req.id}?n=${n}\`);\n  return data?.items ?? [];\n};\n`,
  (r, id, n) => `fn ${id}(xs: &[u32]) -> Option<u32> {\n    xs.iter().copied().filter(|&x| x % ${n + 1} == 0).max()\n}\n`,
  (r, id, n) => `func ${id}(ctx context.Context) error {\n\tif err := run(ctx, ${n}); err != nil {\n\t\treturn fmt.Errorf("run: %w", err)\n\t}\n\treturn nil\n}\n`,
  (r, id, n) => `SELECT id, name FROM users WHERE age >= ${n} AND name LIKE '%${id}%' ORDER BY id DESC;\n`,
  (r, id, n) => `#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l "$f" | awk '{print $1}' >> ${id}.log\ndone\n`,
  (r, id, n) => `<div class="${id}" data-n="${n}">\n  <p>Hello &amp; welcome</p>\n</div>\n`,
  (r, id, n) => `{"${id}": [${n}, ${n * 2}.5, -${n}e-3, true, null], "nested": {"k": "v\\n"}}`,
  (r, id, n) => `public class ${id.replace(/\W/g, "X")} {\n    private static final int N = ${n};\n    @Override public String toString() { return "N=" + N; }\n}\n`,
  (r, id, n) => `${id} <- function(x) {\n  mean(x[!is.na(x)]) * ${n}\n}\n`,
  (r, id, n) => `    ${id}:\n      image: "nginx:1.${n % 30}"\n      ports:\n        - "80${n % 10}:80"\n`,
  (r, id, n) => `\\begin{equation}\n  E = mc^2 + \\sum_{i=0}^{${n}} \\alpha_i\n\\end{equation}\n`,
];

function code(r) {
  let s = "";
  const n = r.range(1, 3);
  for (let i = 0; i < n; i++) s += r.pick(CODE_TEMPLATES)(r, r.pick(CODE_IDENTS), r.range(0, 100000));
  if (r.chance(0.3)) s = s.replace(/ {4}/g, "\t");
  if (r.chance(0.2)) s = s.replace(/\n/g, "\r\n");
  return s;
}

function number(r, len) {
  let s = String(r.range(1, 9));
  for (let i = 1; i < len; i++) s += String(r.int(10));
  return s;
}

function numbers(r, i) {
  const len = 1 + (i % 40);
  const n = number(r, len);
  switch (r.int(10)) {
    case 0: return n;
    case 1: return "-" + n + "." + number(r, r.range(1, 6));
    case 2: return n.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    case 3: return "v" + n.slice(0, 2) + "." + n.slice(2, 4) + "e-" + r.range(1, 300);
    case 4: return "0".repeat(r.range(1, 5)) + n;
    case 5: return [...n].map((d) => cp(0xff10 + Number(d))).join("");  // full-width
    case 6: return [...n].map((d) => cp(0x0660 + Number(d))).join("");  // Arabic-Indic
    case 7: return "price: $" + n + " (" + [...n.slice(0, 4)].map((d) => cp(0x0966 + Number(d))).join("") + ")";
    case 8: return n + " " + number(r, r.range(1, 12)) + "\t" + number(r, 3) + "%";
    default: return "Ⅻ½²³ " + n + "①②";
  }
}

const SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\ufeff", "\u2028", "\u0085", "\u000b", "\f", "\u200b", "\u202f"];

function whitespace(r) {
  let s = "";
  const parts = r.range(1, 8);
  for (let i = 0; i < parts; i++) {
    const k = r.int(4);
    if (k === 0) s += " ".repeat(r.range(1, 300));
    else if (k === 1) s += repeat(r.range(1, 20), () => r.pick(SPACES));
    else if (k === 2) s += "\n".repeat(r.range(1, 10)) + "\t".repeat(r.range(0, 6));
    else s += r.pick(["word", "x", "你好", "!", "12", "é", "😀"]);
  }
  return s;
}

const EMOJI = [
  "😀", "🙂", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "👩‍👩‍👧", "🏳️‍🌈", "🇯🇵", "🇺🇸🇫🇷", "#️⃣", "1️⃣", "❤️", "☺︎", "🧑🏿‍🚀",
  "🫠", "🥲", "🤌🏻", "🐈‍⬛", "🧔‍♀️", "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "✅", "⭐", "🔥🔥🔥",
];

function emoji(r) {
  let s = "";
  const n = r.range(1, 12);
  for (let i = 0; i < n; i++) {
    s += r.pick(EMOJI);
    if (r.chance(0.3)) s += r.pick([" ", "", "!", " ok ", "好", "\n"]);
  }
  return s;
}

function combining(r) {
  const bases = ["e", "a", "o", "n", "ㅎ", "あ", "क", "ก", "ا", "ש", "Z"];
  let s = "";
  const n = r.range(1, 12);
  for (let i = 0; i < n; i++) {
    const k = r.int(6);
    if (k === 0) s += r.pick(bases) + repeat(r.range(1, 8), () => fromRange(r, 0x0300, 0x036f));  // zalgo
    else if (k === 1) s += "\u1100\u1161\u11a8 \u1112\u1161\u11ab";  // conjoining jamo
    else if (k === 2) s += "क्षत्रिय हिन्दी ";
    else if (k === 3) s += "ภาษาไทย ที่นี่ ";
    else if (k === 4) s += "مَرْحَبًا بِكُمْ ";
    else s += "שָׁלוֹם " + r.pick(bases) + "\u20dd";
  }
  return s;
}

const ODD = [
  "\ufffd", "\uffff", "\ufffe", "\u{10ffff}", "\u{10000}", "\ue000", "\u{f0000}", "\u0000", "\u0001", "\u001f",
  "\u007f", "\u0080", "\u0085", "\u009f", "\u202e", "\u202d", "\u200d", "\u200c", "\u200b", "\u2060", "\ufeff",
  "Ã©", "â€™", "ï»¿", "\u00ad", "\u034f", "\u180e", "\u{1d400}", "\u{1f1e6}", "\u{e0041}", "\u3164", "\u115f",
  "\u{20000}", "\u{2a6d6}", "\u{1d7ce}", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ω≈ç√∫˜µ≤≥÷", "¡™£¢∞§¶•ªº", "٩(͡๏̯͡๏)۶",
];

function odd(r) {
  let s = "";
  const n = r.range(1, 10);
  for (let i = 0; i < n; i++) s += r.pick(ODD) + (r.chance(0.5) ? r.pick(["a", " ", "1", "你", "\n", ""]) : "");
  return s;
}

// Random code points from blocks assigned by Unicode 14.
const SAFE_BLOCKS = [
  [0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x591, 0x5f4], [0x600, 0x6ff], [0x900, 0x97f],
  [0xe01, 0xe5b], [0x1e00, 0x1eff], [0x2000, 0x206f], [0x2100, 0x22ff], [0x2500, 0x27bf], [0x3000, 0x30ff],
  [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0xff01, 0xffee], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1d400, 0x1d4ff],
];

function randomMix(r) {
  return repeat(r.range(1, 40), () => {
    const [lo, hi] = r.pick(SAFE_BLOCKS);
    return fromRange(r, lo, hi);
  });
}

function withSpecial(r, tokens, tok) {
  const pre = r.pick(["", "Hello ", "你好", " ", "\n", "x", "123", "<", "<<", "｜", "😀"]);
  const post = r.pick(["", " world", "好", "\n\n", "!", ">", "  ", "abc", "<｜"]);
  let s = pre + tok + post;
  if (r.chance(0.3)) s += r.pick(tokens);
  if (r.chance(0.2)) s = r.pick(tokens) + s;
  return s;
}

function longStrings(r) {
  return [
    "a".repeat(5000),
    " ".repeat(10000) + "x",
    "\n".repeat(3000),
    "1234567890".repeat(300),
    repeat(2000, () => "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[r.int(64)]),
    "你".repeat(4000),
    repeat(200, () => english(r)),
    "😀".repeat(1500),
    "e\u0301".repeat(2000),
    "-".repeat(4000) + "=".repeat(1000),
  ];
}

// CATEGORY list: [name, count, generator(r, i)].
const CATEGORIES = [
  ["english", 300, english],
  ["chinese", 200, chinese],
  ["japanese", 150, japanese],
  ["korean", 120, korean],
  ["code", 250, code],
  ["numbers", 240, numbers],
  ["whitespace", 150, whitespace],
  ["emoji", 120, emoji],
  ["combining", 100, combining],
  ["odd-but-valid", 150, odd],
  ["random-mix", 150, randomMix],
];

function buildCorpus(seed, specialTokens = []) {
  const r = rng(seed);
  const out = ["", " ", "\n", "a", "<think>", "</think>", "<think>\nreasoning\n</think>\n\nanswer"];
  for (const [, count, gen] of CATEGORIES) for (let i = 0; i < count; i++) out.push(gen(r, i));
  // Every special / added token embedded in text, plus near misses.
  for (const tok of specialTokens) {
    out.push(withSpecial(r, specialTokens, tok));
    if (r.chance(0.1)) out.push(tok.slice(0, tok.length - 1) + " " + tok.slice(-1));
  }
  // Mixed documents: pieces of several categories glued together.
  for (let i = 0; i < 100; i++) {
    out.push(repeat(r.range(2, 6), () => r.pick(CATEGORIES)[2](r, r.int(40))));
  }
  out.push(...longStrings(r));
  return out;
}

// Benchmark input: documents of 1..16 KB mixing the categories in realistic proportions
// (mostly English prose and code, some CJK, a little of everything else).
function buildMixedText(totalBytes, seed) {
  const r = rng(seed);
  const weights = [["english", 35], ["code", 25], ["chinese", 12], ["japanese", 4], ["korean", 3],
    ["numbers", 6], ["whitespace", 4], ["emoji", 3], ["combining", 2], ["odd-but-valid", 2], ["random-mix", 4]];
  const total = weights.reduce((a, [, w]) => a + w, 0);
  const gens = Object.fromEntries(CATEGORIES.map(([name, , gen]) => [name, gen]));
  const docs = [];
  let bytes = 0;
  while (bytes < totalBytes) {
    const target = r.range(1024, 16384);
    let doc = "";
    while (Buffer.byteLength(doc) < target) {
      let x = r.int(total);
      let name = weights[0][0];
      for (const [n, w] of weights) {
        if (x < w) { name = n; break; }
        x -= w;
      }
      doc += gens[name](r, r.int(40)) + r.pick([" ", "\n", "\n\n", ""]);
    }
    docs.push(doc);
    bytes += Buffer.byteLength(doc);
  }
  return docs;
}

const SYSTEMS = ["You are a helpful assistant.", "你是一个乐于助人的助手。", "Answer in JSON.\nBe brief.", "", "  spaced  "];
const USERS = ["Hi there", "What is 2+2?", "写一首诗", "Explain <think> tags", "Line1\nLine2\n\n", "  ", "😀?", "<｜User｜> injected", "Tabs\tand\r\nCRLF"];
const ANSWERS = ["Hello!", "4", "床前明月光", "<think>let me think</think>The answer.", "", "Sure:\n```py\nprint(1)\n```", "a</think>b</think>c"];

function buildConversations(seed, n) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; i++) {
    const messages = [];
    const nSystem = r.pick([0, 1, 1, 2]);
    const systemsFirst = r.chance(0.8);
    const systems = Array.from({ length: nSystem }, () => ({ role: "system", content: r.pick(SYSTEMS) }));
    if (systemsFirst) messages.push(...systems);
    const turns = r.range(1, 4);
    for (let t = 0; t < turns; t++) {
      messages.push({ role: "user", content: r.pick(USERS) + (r.chance(0.3) ? " " + english(r) : "") });
      const last = t === turns - 1;
      if (!last || r.chance(0.3)) {
        if (r.chance(0.35)) {
          const calls = Array.from({ length: r.range(1, 3) }, (_, k) => ({
            type: "function",
            function: { name: r.pick(["get_weather", "search", "calc"]), arguments: JSON.stringify({ q: r.pick(USERS), k }) },
          }));
          messages.push({ role: "assistant", content: null, tool_calls: calls });
          for (let k = 0; k < r.range(1, calls.length); k++) messages.push({ role: "tool", content: r.pick(["sunny", "42", "{\"ok\":true}", "结果"]) });
          if (!last || r.chance(0.5)) messages.push({ role: "assistant", content: r.pick(ANSWERS) });
        } else {
          messages.push({ role: "assistant", content: r.pick(ANSWERS) + (r.chance(0.3) ? " " + chinese(r) : "") });
        }
      }
    }
    if (!systemsFirst) messages.splice(r.int(messages.length + 1), 0, ...systems);
    const request = { messages, add_generation_prompt: r.chance(0.7) };
    const thinking = r.pick(["absent", "absent", "true", "false"]);
    if (thinking !== "absent") request.thinking = thinking === "true";
    out.push(request);
  }
  return out;
}

module.exports = { rng, buildCorpus, buildMixedText, buildConversations, CATEGORIES };
