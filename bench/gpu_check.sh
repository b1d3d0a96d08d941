#!/usr/bin/env bash
# The paper scale's GPU check (issue 15), as one script for a lent CUDA machine: about 9.5 minutes.
#
#   OUT=out bash bench/gpu_check.sh        # from the repository root, on the GPU machine
#
# 1. bench/step.py on CUDA: steps/s and FLOP/s of the paper-shape bijection and HMM steps,
#    plain against compile, bf16, compile_bf16 and host_data (batches drawn on the host).
# 2. The paper bijection preset (configs/paper/bijection_transformer.toml) compiled in bf16
#    with its batches drawn on the GPU, stopped by a Ctrl-C (SIGINT: the trainer finishes the
#    step, saves, exits 130) after TRAIN_S seconds, evaluated every 1,000 steps: mae_bits and
#    kl_bits over time are in $OUT/metrics.jsonl.
# 3. The analyses whose forward passes run on the device (traced: keys, values, attention,
#    probes; through the predictor: calibration, layer ablation) on that run, on CUDA, into
#    $OUT/analysis_cuda. The run comes back in $OUT/bijection_run, so the same analyses on
#    the CPU, back here, are compared number by number at no device time:
#      windtunnel analyze $OUT/bijection_run --device cpu --only $ANALYSES --out /tmp/analysis_cpu
#      python bench/compare_analyses.py $OUT/analysis_cuda /tmp/analysis_cpu
#
# The device machine's image has its own python3 with a CUDA PyTorch (no installs there), so
# the code runs from src/ on PYTHONPATH; mambapy (imported by the model registry) is carried
# unpacked in .gpu_deps/: `pip download mambapy==1.2.0 --no-deps -d /tmp/w && unzip -o
# /tmp/w/*.whl -d .gpu_deps`, and `.gpu_deps` named in the device run's carry.
set -uo pipefail
OUT=${OUT:-gpu_check_out}
TRAIN_S=${TRAIN_S:-270}
ANALYSES="calibration layer_ablation key_orthogonality value_manifold qk_sharpening linear_probes"
export PYTHONPATH="src:.gpu_deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" | tee "$OUT/device.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$OUT/device.txt"

timeout 240 python3 bench/step.py --devices cuda --steps 60 \
    --variants plain compile bf16 compile_bf16 host_data >"$OUT/step.json" 2>"$OUT/step.log"
echo "bench/step.py rc=$?"; cat "$OUT/step.json"

run="$OUT/bijection_run"
timeout -s INT -k 60 "$TRAIN_S" python3 -m windtunnel train configs/paper/bijection_transformer.toml --out "$run" \
    --set train.device=cuda --set train.compile=true --set train.bf16=true \
    --set train.eval_every=1000 --set train.checkpoint_every=5000 --quiet 2>"$OUT/train.log"
echo "train rc=$? (124: stopped by the timer at a step boundary, state saved)"
cp "$run/metrics.jsonl" "$OUT/metrics.jsonl" 2>/dev/null
rm -rf "$run/checkpoints"  # the snapshots are not needed back; the resume state holds the last weights
python3 - "$OUT/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for r in rows:
    if "eval_mae_bits" in r:
        print(f"step {r['step']:>6}  mae_bits {r['eval_mae_bits']:.4f}  kl_bits {r['eval_kl_bits']:.4f}  elapsed {r.get('elapsed_s', 0):.0f} s")
rates = [r["seq_per_s"] / 128 for r in rows if "seq_per_s" in r][1:]
if rates:
    rates.sort()
    print(f"training: median {rates[len(rates) // 2]:.1f} steps/s over {len(rates)} logged intervals; last step {rows[-1]['step']}")
EOF

timeout 90 python3 -m windtunnel analyze "$run" --device cuda --only $ANALYSES --out "$OUT/analysis_cuda" \
    >"$OUT/analyze.json" 2>"$OUT/analyze.log"
echo "analyze on cuda rc=$?"; tail -3 "$OUT/analyze.log"
