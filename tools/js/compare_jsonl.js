// Compares two JSON-lines files value by value (not text, so escaping differences between
// JSON writers do not matter). Exits 1 and prints the first differences on any mismatch.
//   node tools/js/compare_jsonl.js EXPECTED ACTUAL [LABEL]
"use strict";

const fs = require("fs");

function readLines(file) {
  return fs.readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l));
}

const [expectedFile, actualFile, label = "values"] = process.argv.slice(2);
const expected = readLines(expectedFile);
const actual = readLines(actualFile);
let mismatches = 0;
for (let i = 0; i < Math.max(expected.length, actual.length); i++) {
  const a = JSON.stringify(expected[i]);
  const b = JSON.stringify(actual[i]);
  if (a !== b) {
    if (++mismatches <= 5) console.error(`${label}: line ${i + 1} differs\n  expected ${String(a).slice(0, 400)}\n  actual   ${String(b).slice(0, 400)}`);
  }
}
if (expected.length !== actual.length) console.error(`${label}: ${expected.length} expected lines, ${actual.length} actual`);
if (mismatches > 0 || expected.length !== actual.length) {
  console.error(`${label}: ${mismatches} of ${expected.length} lines differ`);
  process.exit(1);
}
console.log(`${label}: all ${expected.length} lines match`);
