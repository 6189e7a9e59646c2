#!/usr/bin/env bash
# Fails when the tests left anything in their TMPDIR (argument), naming each entry and its size.
set -uo pipefail
dir=${1:?usage: check_test_tmp.sh DIR}
[[ -d "$dir" ]] || { echo "test_tmp_check: $dir does not exist (test_tmp_setup did not run?)"; exit 1; }
mapfile -t left < <(find "$dir" -mindepth 1 -maxdepth 1 | sort)
if [[ ${#left[@]} -eq 0 ]]; then
  echo "test_tmp_check: no test left files in $dir"
  exit 0
fi
echo "test_tmp_check: tests left ${#left[@]} entries in $dir (every test must remove what it makes, also on failure):"
for e in "${left[@]}"; do
  echo "  $(du -sh "$e" 2>/dev/null | cut -f1)	${e#$dir/}"
done
rm -rf "${left[@]}"
exit 1
