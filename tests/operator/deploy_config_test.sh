#!/usr/bin/env bash
# Deploy files as an operator uses them:
#   1. every docker-compose file under deploy/ (a YAML with a top-level `services:` key) passes
#      `docker-compose config` (no Docker engine needed);
#   2. the image's build context, as .dockerignore cuts it, holds the sources the Dockerfile
#      needs and none of the host's build outputs, models, node_modules or results (a host
#      build/ brings a CMakeCache.txt with host paths that breaks the image's own configure).
# Usage: deploy_config_test.sh REPO_ROOT
set -euo pipefail
root=${1:?usage: deploy_config_test.sh REPO_ROOT}
here=$(cd "$(dirname "$0")" && pwd)
cd "$root"
command -v docker-compose >/dev/null || { echo "deploy_config_test: docker-compose is missing (scripts/setup.sh installs it)"; exit 1; }

n=0
while IFS= read -r f; do
  if grep -qE '^services:' "$f"; then
    echo "docker-compose config: $f"
    docker-compose -f "$f" config -q || { echo "deploy_config_test: $f does not pass docker-compose config"; exit 1; }
    n=$((n + 1))
  fi
done < <(find deploy -name '*.yml' -o -name '*.yaml' | sort)
[[ $n -gt 0 ]] || { echo "deploy_config_test: found no compose file under deploy/"; exit 1; }
echo "$n compose file(s) valid"

exec /usr/bin/python3 "$here/docker_context_check.py" "$root"
