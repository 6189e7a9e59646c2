#!/usr/bin/env bash
# End-to-end check of the CLI against the JS reference data written by
# tools/js/make_reference.js (the tokenizer_js_reference_data CTest fixture):
#   tests/tokenizer/cli_vs_js.sh PDSERVE_BINARY REFERENCE_DIR
set -euo pipefail
pdserve=$(realpath "$1")
ref=$(realpath "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$(dirname "$0")/../.."
compare="node tools/js/compare_jsonl.js"

"$pdserve" tokenize <"$ref/corpus.jsonl" >"$tmp/ids.jsonl"
$compare "$ref/ref_ids.jsonl" "$tmp/ids.jsonl" "pdserve tokenize vs JS encode"

"$pdserve" tokenize --decode <"$tmp/ids.jsonl" >"$tmp/text.jsonl"
$compare "$ref/corpus.jsonl" "$tmp/text.jsonl" "pdserve tokenize --decode round trip"

"$pdserve" chat-template <"$ref/chat.jsonl" >"$tmp/chat.jsonl"
$compare "$ref/ref_chat.jsonl" "$tmp/chat.jsonl" "pdserve chat-template vs Jinja"

# Bad input must fail cleanly (exit 1, a message naming the line), never crash.
expect_error() {  # expect_error NEEDLE CMD... (stdin from the caller)
  local needle=$1
  shift
  set +e
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  set -e
  if [ "$rc" -ne 1 ] || ! grep -q -- "$needle" "$tmp/err"; then
    echo "expected exit 1 with '$needle' from: $*; got rc=$rc, stderr:"
    cat "$tmp/err"
    exit 1
  fi
}
printf '"ok"\n"unterminated\n' | expect_error "line 2" "$pdserve" tokenize
printf '[1, 2]\n[5, 128815]\n' | expect_error "128815" "$pdserve" tokenize --decode
printf '[1, "x"]\n' | expect_error "32-bit integers" "$pdserve" tokenize --decode
printf '{"messages": [{"role": 1}]}\n' | expect_error "messages\[0\].role" "$pdserve" chat-template
mkdir "$tmp/broken"
echo '{"model": ' >"$tmp/broken/tokenizer.json"
echo '"x"' | expect_error "not valid JSON" "$pdserve" tokenize --tokenizer "$tmp/broken"
echo '"x"' | expect_error "NotFound" "$pdserve" tokenize --tokenizer "$tmp/missing"
echo "cli_vs_js: OK"
