#!/usr/bin/env bash
# The main job: start the local disaggregated cluster (router + prefill + decode workers, see
# deploy/local/cluster.yaml), stream one chat reply through it, say where the metrics are, stop.
set -euo pipefail
cd "$(dirname "$0")/.."
exec scripts/demo_cluster.sh "${1:-build}"
