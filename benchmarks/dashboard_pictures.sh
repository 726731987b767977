#!/usr/bin/env bash
# The README's dashboard pictures, from real data: Prometheus (Debian's package) with the shipped
# dashboards/prometheus.yml and alerts.yml, `autotune daemon`, and the example job on 4 CPU ranks
# with its exporters on, then `autotune report --prometheus` draws every panel.
#
#   bash benchmarks/dashboard_pictures.sh [OUT_DIR] [STEPS]     # (docs/img, 8000)
#
# Uses the ports the shipped config names (9090, 9409, 9410-9413); fails if one is taken.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/img}"
steps="${2:-8000}"
py=.venv/bin/python
work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

prometheus --config.file=dashboards/prometheus.yml --storage.tsdb.path="$work/data" \
    --web.listen-address=127.0.0.1:9090 --log.level=warn 2>"$work/prometheus.log" &
pids+=($!)
.venv/bin/autotune daemon --port 9409 >"$work/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 60); do
    curl -fs http://127.0.0.1:9090/-/ready >/dev/null && break
    sleep 1
done
start=$(date +%s)
# A storage of its own, so the tuner explores from scratch and the pictures show it lock in.
AUTOTUNE_METRICS_PORT=9410 AUTOTUNE_STORAGE="sqlite:///$work/tuning.db" \
    "$py" examples/train_ddp.py --world-size 4 --steps "$steps"
# The ranks are gone now; their series stay, and instant queries see the last scrape for 5 min.
minutes=$(( ($(date +%s) - start) / 60 + 2 ))
.venv/bin/autotune report --prometheus http://127.0.0.1:9090 --minutes "$minutes" -o "$out"
