#!/usr/bin/env bash
# One GPU window of the paper-scale reproduction: the next owed slice of runs, into results/paper.
#
#   OUT=out WINDTUNNEL_COMMIT=<commit> bash bench/gpu_slice.sh     # on the GPU machine, from the repository root
#   DRY_RUN=1 OUT=/tmp/dry bash bench/gpu_slice.sh                 # the same path on a CPU at a tiny size (CI runs it)
#   bash bench/unpack_slice.sh <folder with the parts>              # back here: results/paper updated
#
# 1. Sanity, about 30 s: the device, the code and its carried packages import, and a compiled
#    bf16 step of a one-layer paper model runs on it; anything wrong stops the window here.
# 2. Where the step's time goes (bench/profile_step.py, ~1 min): kept until the step is fast
#    enough for a paper HMM run in one command. PROFILE=0 skips it.
#    Then, the first time on a GPU, the run-group step's cost (bench/step.py --groups 1 3 5,
#    ~2 min, into results/paper/bench/step_groups_<GPU>.json).
# 3. The slice: `windtunnel reproduce --scale paper --only-runs $RUNS --time-limit $TRAIN_S
#    --out results/paper --resume` (TRAIN_S: what BUDGET_S leaves), trained on the device (the presets compile and train in
#    bf16), every analysis of the groups it joins computed on the device over every run of
#    the group present (at initialization too), each run reduced to its final float32 weights
#    in shards of at most 15 MiB, the report rebuilt. RUNS defaults to the owed runs of the run
#    group (one stacked model, --group) of the first run of
#    PRIORITY that results/paper does not hold. A run stopped by TRAIN_S says so everywhere.
# 4. bench/step.py's CUDA figures, when results/paper/bench/ has none for this GPU yet.
# 5. Packing: results/paper's new and changed files, and the list of every file it holds,
#    in one tar cut into parts of 15 MiB under $OUT (the device tool brings back at most 8
#    files of 16 MiB); bench/unpack_slice.sh applies them here.
#
# The device machine's python3 has its own CUDA PyTorch and no registry: the code runs from
# src/, mambapy (the model registry imports it) travels unpacked in .gpu_deps/ (`pip download
# mambapy==1.2.0 --no-deps -d /tmp/w && unzip -o /tmp/w/*.whl -d .gpu_deps`, then name
# .gpu_deps in the device run's carry), and huggingface_hub is on the machine already.
set -uo pipefail
OUT=${OUT:-gpu_slice_out}
# The paper-scale plan in the order its slices are owed (the rest of the plan follows).
PRIORITY=${PRIORITY:-"bijection_transformer_seed0 hmm_transformer_seed0 hmm_late_attention_off_seed0 bijection_mlp_seed0 hmm_mlp_seed0
    bijection_transformer_seed1 bijection_transformer_seed2 hmm_transformer_seed1 hmm_transformer_seed2 hmm_transformer_seed3
    hmm_transformer_seed4 hmm_transformer_floor_seed0 hmm_mlp_floor_seed0 hmm_late_attention_off_floor_seed0
    bijection_replacement_transformer_seed0 bijection_replacement_mlp_seed0"}
# The whole script's budget (give the device call a timeout_s some 40 s above it); the slice's
# training gets what the checks before it leave, less ANALYSIS_S for the analyses, the report
# and packing (TRAIN_S set outright overrides that).
BUDGET_S=${BUDGET_S:-540}
ANALYSIS_S=${ANALYSIS_S:-200}
PROFILE=${PROFILE:-1}
STEP_BENCH_S=${STEP_BENCH_S:-90}
GROUP_BENCH_S=${GROUP_BENCH_S:-150}
PY=${PY:-python3}
export PYTHONPATH="$PWD/src:$PWD/bench:$PWD/.gpu_deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export WINDTUNNEL_COMMIT=${WINDTUNNEL_COMMIT:-unknown}
started=$(date +%s)
work=$(mktemp -d)
mkdir -p "$OUT"
if [ "${DRY_RUN:-0}" = 1 ]; then
    # A tiny model and a few steps, on the CPU, into a scratch copy of the folder's layout.
    DEVICE=cpu
    RESULTS=${RESULTS:-$work/results}
    SETS=(--set model.n_layers=2 --set model.d_model=32 --set model.d_mlp=64 --set model.n_heads=2 --set train.steps=30
          --set train.eval_every=0 --set train.checkpoint_every=15 --set train.log_every=5 --set eval.n=64 --set eval.bootstrap=50
          --set train.compile=false)
    PROFILE_SETS=(--set model.n_layers=1 --set model.d_model=32 --set model.d_mlp=64 --set model.n_heads=2 --set train.compile=false)
else
    DEVICE=cuda
    RESULTS=${RESULTS:-results/paper}
    SETS=()
    PROFILE_SETS=()
fi

# 1. Sanity.
$PY - "$DEVICE" >"$OUT/device.json" <<'EOF' || { cat "$OUT/device.json"; echo "sanity check failed"; exit 3; }
import json, platform, sys
import torch
import huggingface_hub, mambapy, windtunnel.analysis, windtunnel.models  # noqa: F401  what the slice imports
device = sys.argv[1]
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
if device == "cuda":
    assert torch.cuda.is_available(), "CUDA is not available"
    info["gpu"] = torch.cuda.get_device_name()
print(json.dumps(info))
EOF
cat "$OUT/device.json"
timeout 120 $PY -m windtunnel train configs/paper/bijection_transformer.toml --out "$work/sanity" --quiet \
    --set train.device="$DEVICE" --set model.n_layers=1 --set train.steps=5 --set train.log_every=1 --set train.eval_every=0 \
    --set eval.n=64 >"$work/sanity.json" 2>"$work/sanity.log" \
    || { tail -20 "$work/sanity.log"; echo "sanity: a compiled step of the paper preset failed on $DEVICE"; exit 3; }
echo "sanity: a compiled step of the paper preset ran on $DEVICE"

# 2. Where the step's time goes.
if [ "$PROFILE" = 1 ]; then
    timeout 120 $PY bench/profile_step.py --device "$DEVICE" --preset bijection_transformer --steps 40 "${PROFILE_SETS[@]}" \
        >"$OUT/profile_bijection.json" 2>"$work/profile.log"; echo "profile rc=$?"
    head -c 600 "$OUT/profile_bijection.json"; echo
fi

# 2b. The run-group step's cost on this GPU, first, while results/paper/bench/ lacks it:
#     bench/step.py --groups 1 3 5 on the paper HMM transformer (plain float32, and the
#     presets' compiled bf16 step alone), dispatched ops per step included.
if [ "$DEVICE" = cuda ]; then
    gpu=$($PY -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
    if [ ! -f "$RESULTS/bench/step_groups_$gpu.json" ]; then
        mkdir -p "$RESULTS/bench"
        timeout "$GROUP_BENCH_S" $PY bench/step.py --devices cuda --steps 30 --presets hmm_transformer --variants plain compile_bf16 \
            --groups 1 3 5 >"$work/step_groups.json" 2>"$work/step_groups.log" \
            && cp "$work/step_groups.json" "$RESULTS/bench/step_groups_$gpu.json"
        echo "bench/step.py --groups rc=$?"; tail -c 1500 "$work/step_groups.json"; tail -5 "$work/step_groups.log"
    fi
fi

# 3. The slice.
elapsed=$(( $(date +%s) - started ))
TRAIN_S=${TRAIN_S:-$(( BUDGET_S - elapsed - ANALYSIS_S ))}
[ "$TRAIN_S" -ge 60 ] || { echo "only ${TRAIN_S}s left to train: no slice this window"; exit 4; }
if [ -z "${RUNS:-}" ]; then
    # The owed runs of the first owed run's run group that can finish in TRAIN_S (by this GPU's group bench, once measured).
    RUNS=$($PY bench/owed_group.py "$RESULTS" "$TRAIN_S" $PRIORITY --bench "$RESULTS/bench/step_groups_${gpu:-none}.json")
fi
[ -n "${RUNS:-}" ] || { echo "no owed run of PRIORITY can finish in ${TRAIN_S}s here (or none is owed): nothing to train"; exit 0; }
echo "slice: $RUNS (time limit ${TRAIN_S}s per run)"
mkdir -p "$RESULTS"
touch "$work/started"
sleep 1  # file times have a one-second grain on some file systems: everything written from here on is newer
resume=(); [ -f "$RESULTS/reproduce.json" ] && resume=(--resume)
t0=$(date +%s)
# Stopped before the budget runs out, so that packing always happens; a run whose analyses
# did not finish still keeps its final weights (the next slice of its group computes them).
timeout $(( BUDGET_S - (t0 - started) - 20 )) $PY -m windtunnel reproduce --scale paper --only-runs $RUNS --group \
    --time-limit "$TRAIN_S" --out "$RESULTS" "${resume[@]}" "${SETS[@]}" >"$work/reproduce.json" 2>"$work/reproduce.log"
rc=$?
echo "reproduce rc=$rc in $(( $(date +%s) - t0 ))s"; grep -v "^\[train\] " "$work/reproduce.log" | tail -15
cp "$work/reproduce.log" "$OUT/reproduce.log"
for name in $RUNS; do
    if [ -f "$RESULTS/runs/$name/resume.safetensors" ]; then
        $PY -c "import sys; from windtunnel.runs import keep_final_weights; keep_final_weights(sys.argv[1])" "$RESULTS/runs/$name" \
            && echo "kept the final weights of $name" || echo "$name is unfinished: its training state stays behind"
    fi
done

# 4. The step's cost on this GPU, once.
if [ "$DEVICE" = cuda ]; then
    gpu=$($PY -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
    if [ ! -f "$RESULTS/bench/step_$gpu.json" ]; then
        mkdir -p "$RESULTS/bench"
        timeout "$STEP_BENCH_S" $PY bench/step.py --devices cuda --steps 30 --presets hmm_transformer bijection_transformer \
            --variants plain compile_bf16 >"$work/step.json" 2>"$work/step.log" && cp "$work/step.json" "$RESULTS/bench/step_$gpu.json"
        echo "bench/step.py rc=$?"
    fi
fi

# 5. Pack.
(cd "$RESULTS" && find . -type f | sort >"$work/FILES" && cp "$work/FILES" ./FILES \
    && find . -type f -newer "$work/started" ! -name resume.safetensors ! -path "*/checkpoints/*" | sort | tar cf - -T - ) \
    | split -b 15M -d - "$OUT/results.tar.part"
rm -f "$RESULTS/FILES"
ls -la "$OUT"
rm -rf "$work"
exit $rc
