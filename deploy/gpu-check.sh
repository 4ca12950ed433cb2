#!/usr/bin/env bash
# GPU check for the vllm-pool backend: a few minutes on a machine with NVIDIA GPUs and a model.
#
#   deploy/gpu-check.sh MODEL [GPUS] [TENSOR_PARALLEL_SIZE]
#
# Starts `gateway serve` with a vllm-pool of MODEL (a path or a model id vLLM can load) on
# GPUS (default: all, as nvidia-smi lists them), waits for every worker to be ready, sends a
# short shared-prefix load (bench/pool_load.py), prints throughput, TTFT and the
# routing decisions (the score terms, or the prefix-affinity hit rate), shows `gateway pool status`, then stops the gateway (SIGTERM)
# and fails if any worker process is left.
#
# Environment (all optional):
#   VLLM_CMD         the worker command, default "vllm serve" (e.g. "/opt/vllm/bin/vllm serve")
#   VLLM_ARGS        extra vllm serve flags, default "--max-model-len 4096 --gpu-memory-utilization 0.85"
#   WORKERS          number of workers (needed when GPUS is "[]", i.e. CPU workers)
#   REQUESTS=200 CONCURRENCY=16 PREFIXES=8 PREFIX_CHARS=2048 MAX_TOKENS=64   the load
#   PORT=8080 STARTUP_TIMEOUT=900 POLL=2 (seconds between readiness checks)
#   PYTHON=.venv/bin/python KEEP=1 (keep the work dir)
#   GPU_CHECK_NO_GPU=1  skip the nvidia-smi check (for a dry run with a stand-in worker)
set -euo pipefail

model="${1:?usage: deploy/gpu-check.sh MODEL [GPUS] [TENSOR_PARALLEL_SIZE]}"
gpus="${2:-all}"
tp="${3:-1}"
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
port="${PORT:-8080}"
startup_timeout="${STARTUP_TIMEOUT:-900}"

if [ -z "${GPU_CHECK_NO_GPU:-}" ]; then
  command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi not found" >&2; exit 2; }
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
config="$work/gateway.yaml"
GC_MODEL="$model" GC_GPUS="$gpus" GC_TP="$tp" GC_WORK="$work" GC_STARTUP="$startup_timeout" \
GC_CMD="${VLLM_CMD:-vllm serve}" GC_ARGS="${VLLM_ARGS:---max-model-len 4096 --gpu-memory-utilization 0.85}" \
GC_WORKERS="${WORKERS:-}" "$python" - >"$config" <<'PY'
import json, os, shlex
e = os.environ
gpus = e["GC_GPUS"]
gpus = gpus if gpus == "all" else json.loads(gpus if gpus.startswith("[") or "," not in gpus else f"[{gpus}]")
workers = f"\n    workers: {e['GC_WORKERS']}" if e["GC_WORKERS"] else ""
print(f"""server: {{host: 127.0.0.1}}
backends:
  - name: gpu-pool
    type: vllm-pool
    model: {json.dumps(e["GC_MODEL"])}
    served_model_name: check
    gpus: {json.dumps(gpus)}
    tensor_parallel_size: {e["GC_TP"]}{workers}
    command: {json.dumps(shlex.split(e["GC_CMD"]))}
    vllm_args: {json.dumps(shlex.split(e["GC_ARGS"]))}
    log_dir: {json.dumps(e["GC_WORK"] + "/pool")}
    startup_timeout: {e["GC_STARTUP"]}
    stop_timeout: 30
    routing: {{wait_for_ready: 60}}
    circuit_breaker: {{enabled: false}}
models:
  - name: check
    routes: [{{backend: gpu-pool, model: check}}]""")
PY

"$python" -m gateway serve --config "$config" --port "$port" >"$work/gateway.log" 2>&1 &
gateway=$!
pids_file="$work/worker-pids"
cleanup() {
  if kill -0 "$gateway" 2>/dev/null; then
    kill -TERM "$gateway"
    wait "$gateway" || true
  fi
  if [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "gpu-check: kept $work"; fi
}
trap cleanup EXIT

status() { "$python" -m gateway pool status --config "$config" "$@"; }

echo "gpu-check: gateway pid $gateway on port $port; logs in $work (waiting up to ${startup_timeout}s for the workers)"
started=$(date +%s)
while :; do
  if ! kill -0 "$gateway" 2>/dev/null; then
    echo "gpu-check: the gateway exited:" >&2; tail -n 30 "$work/gateway.log" >&2; exit 1
  fi
  states="$(status --json 2>/dev/null | "$python" -c 'import json,sys; print(" ".join(w["state"] for s in json.load(sys.stdin) for w in s["workers"]))' 2>/dev/null || true)"
  case " $states " in
    *" failed "*) echo "gpu-check: a worker failed:" >&2; status >&2 || true; exit 1 ;;
  esac
  if [ -n "$states" ] && [ -z "$(echo "$states" | tr ' ' '\n' | grep -v '^ready$' || true)" ]; then
    break
  fi
  if [ $(( $(date +%s) - started )) -gt "$startup_timeout" ]; then
    echo "gpu-check: workers not ready after ${startup_timeout}s:" >&2; status >&2 || true; exit 1
  fi
  sleep "${POLL:-2}"
done
echo "gpu-check: $(echo "$states" | wc -w) worker(s) ready in $(( $(date +%s) - started ))s"
status --json | "$python" -c 'import json,sys; print(" ".join(str(w["pid"]) for s in json.load(sys.stdin) for w in s["workers"]))' >"$pids_file"

echo "gpu-check: load: ${REQUESTS:-200} streamed requests, ${CONCURRENCY:-16} concurrent, ${PREFIXES:-8} shared prefixes"
"$python" bench/pool_load.py --url "http://127.0.0.1:$port" --model check \
  --requests "${REQUESTS:-200}" --concurrency "${CONCURRENCY:-16}" --groups "${PREFIXES:-8}" \
  --prefix-chars "${PREFIX_CHARS:-2048}" --max-tokens "${MAX_TOKENS:-64}"
status

kill -TERM "$gateway"
wait "$gateway" || { echo "gpu-check: the gateway exited with an error" >&2; exit 1; }
sleep 1
left=""
for pid in $(cat "$pids_file"); do
  if [ -e "/proc/$pid" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; then left="$left $pid"; fi
  # anything still in the worker's process group (vLLM's engine processes included)
  for p in $(ps -e -o pid=,pgid=,stat= | awk -v g="$pid" '$2 == g && $3 !~ /^Z/ {print $1}'); do left="$left $p"; done
done
if [ -n "$left" ]; then echo "gpu-check: FAILED: processes left behind:$left" >&2; exit 1; fi
echo "gpu-check: OK (gateway stopped, no worker process left)"
