#!/usr/bin/env bash
# One paper-scale run for one GPU window: train a configs/paper preset on CUDA (compiled, bf16
# autocast, fp32 master weights, batches drawn on the GPU), evaluate it, run every analysis
# that applies on CUDA, time bench/step.py, and pack the run into at most 4 files of 15 MiB
# under $OUT (the device tool brings back 8 files of 16 MiB at most).
#
#   OUT=out PRESET=bijection_transformer SEED=0 COMMIT=$(git rev-parse HEAD) bash bench/gpu_slice.sh
#   DRY_RUN=1 OUT=/tmp/dry bash bench/gpu_slice.sh     # the same path on the CPU, at tiny size
#
# Training stops at TRAIN_S seconds (SIGINT: the trainer ends the step, saves its state and
# exits); a run stopped before its configured steps is packed as it stands and its
# provenance says how far it got. The device machine's python3 has its own CUDA PyTorch:
# the code runs from src/, and mambapy travels unpacked in .gpu_deps/ (see bench/gpu_check.sh).
set -uo pipefail
OUT=${OUT:-gpu_slice_out}
PRESET=${PRESET:-bijection_transformer}
SEED=${SEED:-0}
TRAIN_S=${TRAIN_S:-400}
BUDGET_S=${BUDGET_S:-575}  # the whole script; the analyses get what training and the rest leave
STEP_BENCH_S=${STEP_BENCH_S:-70}
COMMIT=${COMMIT:-unknown}
PY=${PY:-python3}
export PYTHONPATH="src:bench:.gpu_deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
started=$(date +%s)
work=$(mktemp -d)
run="$work/${PRESET}_seed${SEED}"
mkdir -p "$OUT"
if [ "${DRY_RUN:-0}" = 1 ]; then
    DEVICE=cpu
    SETS=(--set train.device=cpu --set train.steps=40 --set train.eval_every=20 --set train.checkpoint_every=20
          --set train.log_every=10 --set eval.n=64 --set model.n_layers=2 --set model.d_model=32 --set model.d_mlp=64
          --set model.n_heads=2)
    PRECISION=fp32
else
    DEVICE=cuda
    SETS=(--set train.device=cuda --set train.compile=true --set train.bf16=true)
    PRECISION=bf16-autocast
fi

# 1. Sanity: the device, the code and its carried packages import, before any time is spent.
$PY - "$DEVICE" >"$OUT/device.json" <<'EOF' || { cat "$OUT/device.json"; echo "sanity check failed"; exit 3; }
import json, platform, sys
import torch
import windtunnel.models, windtunnel.analysis, mambapy  # noqa: F401  the registry imports mambapy
device = sys.argv[1]
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
if device == "cuda":
    assert torch.cuda.is_available(), "CUDA is not available"
    info["gpu"] = torch.cuda.get_device_name()
    x = torch.randn(256, 256, device="cuda")
    info["matmul_ok"] = bool(torch.isfinite(x @ x).all())
else:
    info["cpu"] = platform.processor() or platform.machine()
print(json.dumps(info))
EOF
cat "$OUT/device.json"

# 2. Train.
t0=$(date +%s)
timeout -s INT -k 60 "$TRAIN_S" $PY -m windtunnel train "configs/paper/$PRESET.toml" --out "$run" \
    --set train.seed="$SEED" "${SETS[@]}" --quiet 2>"$work/train.log"
train_rc=$?
train_s=$(( $(date +%s) - t0 ))
echo "train rc=$train_rc in ${train_s}s (130 or 124: stopped by the timer at a step boundary, state saved)"
tail -2 "$work/train.log"
cp "$work/train.log" "$run/train.log" 2>/dev/null

# 3. Evaluate the weights it ended with (eval.json), then every analysis that applies, on the device.
$PY -m windtunnel eval "$run" >"$run/eval_stdout.txt" 2>"$run/eval.log"; echo "eval rc=$?"
t1=$(date +%s)
ANALYZE_S=$(( started + BUDGET_S - t1 - STEP_BENCH_S - 20 )); [ "$ANALYZE_S" -lt 30 ] && ANALYZE_S=30
echo "analyses get ${ANALYZE_S}s"
timeout "$ANALYZE_S" $PY -m windtunnel analyze "$run" --device "$DEVICE" --out "$run/analysis" \
    >"$run/analyze_stdout.txt" 2>"$run/analyze.log"
echo "analyze rc=$? in $(( $(date +%s) - t1 ))s"; tail -3 "$run/analyze.log"

# 4. The step's cost on this device (once per window is plenty; the HMM step decides whether
#    the paper HMM run fits in one command).
if [ "$DEVICE" = cuda ]; then
    timeout "$STEP_BENCH_S" $PY bench/step.py --devices cuda --steps 30 --presets hmm_transformer bijection_transformer \
        --variants compile_bf16 >"$OUT/step.json" 2>"$work/step.log"
    echo "bench/step.py rc=$?"; cat "$OUT/step.json"; tail -3 "$work/step.log"
fi

# 5. Pack, with provenance.
provenance=$($PY - "$run" "$DEVICE" "$PRECISION" "$COMMIT" "$train_s" "$train_rc" "$OUT/device.json" <<'EOF'
import json, statistics, sys
run, device, precision, commit, train_s, train_rc, device_json = sys.argv[1:]
rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
config = json.load(open(f"{run}/config.json"))
batch = config["train"]["batch_size"]
rates = [r["seq_per_s"] / batch for r in rows if "seq_per_s" in r][1:]
print(json.dumps({
    **json.load(open(device_json)), "device": device, "precision": precision, "commit": commit,
    "steps_configured": config["train"]["steps"], "steps_done": max(r["step"] for r in rows),
    "steps_per_s_median": statistics.median(rates) if rates else None, "train_wall_s": int(train_s),
    "train_rc": int(train_rc), "command": "bash bench/gpu_slice.sh",
}))
EOF
)
echo "$provenance"
$PY bench/pack_run.py "$run" "$OUT" --provenance "$provenance"
ls -la "$OUT"
rm -rf "$work"
