#!/usr/bin/env bash
# A smoke check for one GPU after `bash tools/setup_env.sh`: each step runs a few iterations on
# the toy data and prints its time per step, so a broken CUDA build, a device or AMP problem
# shows up in minutes instead of in the first hour of a cluster job.
#   1. the toy tokenizer (tools/train_vq.py), --amp; its result is step 3's tokenizer;
#   2. the toy FAN-T-Hybrid Mask R-CNN, --amp (fp16 with loss scaling);
#   3. the same with DAT (attack pass, two VQ round trips per step), --amp;
#   4. a 2-cell robustness evaluation (clean + fog 3 + gaussian_noise 3) of step 2's checkpoint,
#      into a results file of its own per run (a rerun in the same work dir starts afresh);
#   5. two processes (torchrun): a few training iterations (dist_train.sh) and a 1-cell
#      robustness evaluation (dist_test.sh) on 2 GPUs, or with gloo on the CPU where there is
#      one GPU (then they check the launchers, not the GPUs).
#
#   bash tools/gpu_check.sh [WORK_DIR]          # default work_dirs/gpu_check; ITERS=20
#   DRY_RUN=1 bash tools/gpu_check.sh           # print the commands only
#   ON_CPU=1 ITERS=2 bash tools/gpu_check.sh    # the same steps on the CPU, without --amp (a
#                                               # check of the script itself, not of a GPU)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$VENV/bin/python" ]; then PYTHON="$VENV/bin/python"; else PYTHON=python; fi
fi
WORK=${1:-work_dirs/gpu_check}
ITERS=${ITERS:-20}
DET=configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py
DET_DAT=configs/toy/mask-rcnn_fan-t-hybrid_fpn_dat_toy-coco.py
AMP=(--amp)
[ -n "${ON_CPU:-}" ] && AMP=()  # NOTE: bf16 is emulated, ~100x slower, on CPUs without AVX-512
SHORT=(train_cfg.max_iters="$ITERS" train_cfg.val_interval=100000
       default_hooks.checkpoint.interval="$ITERS" default_hooks.logger.interval=1)
cd "$ROOT"

run() {
  echo "+ $*"
  if [ -z "${DRY_RUN:-}" ]; then "$@"; fi
}

if [ -z "${DRY_RUN:-}" ] && [ -z "${ON_CPU:-}" ]; then
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
    "gpu_check: torch sees no GPU (CUDA build? CUDA_VISIBLE_DEVICES? driver?)")'
  "$PYTHON" -c 'import torch; print("GPU:", torch.cuda.get_device_name(0), "| torch",
    torch.__version__, "CUDA", torch.version.cuda)'
fi
run "$PYTHON" data/generate_toy_data.py --only toy_coco toy_cityscapes
run "$PYTHON" tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py "${AMP[@]}" \
  --work-dir "$WORK/tokenizer" --cfg-options "${SHORT[@]}" train_cfg.val_interval="$ITERS" \
  param_scheduler.0.T_max="$ITERS" param_scheduler.0.end="$ITERS"
run "$PYTHON" tools/train.py "$DET" "${AMP[@]}" --work-dir "$WORK/fan-t" --cfg-options "${SHORT[@]}"
run "$PYTHON" tools/train.py "$DET_DAT" "${AMP[@]}" --work-dir "$WORK/fan-t_dat" --cfg-options \
  "${SHORT[@]}" custom_hooks.0.tokenizer.init_cfg.checkpoint="$WORK/tokenizer/tokenizer.pth"
STAMP=$(date +%Y%m%d_%H%M%S)_$$  # NOTE: each run retrains, so each gets its own results
RESULTS="$WORK/robustness/robustness_$STAMP.json"
run "$PYTHON" tools/test_robustness.py "$DET" "$WORK/fan-t/iter_$ITERS.pth" \
  --corruptions fog gaussian_noise --severities 3 --results "$RESULTS" \
  --work-dir "$WORK/robustness"
# 5. two processes: on 2 GPUs when there are, else on the CPU with gloo
TWO=()
if [ -z "${ON_CPU:-}" ] && [ -z "${DRY_RUN:-}" ] && [ "$("$PYTHON" -c \
    'import torch; print(torch.cuda.device_count())')" -lt 2 ]; then
  echo "one GPU: the 2-process steps run on the CPU (gloo), a check of the launchers"
  TWO=(env CUDA_VISIBLE_DEVICES=)
fi
run "${TWO[@]}" env PYTHON="$PYTHON" PORT=$((29500 + $$ % 1000)) bash tools/dist_train.sh "$DET" 2 \
  --work-dir "$WORK/fan-t_2proc" --cfg-options train_cfg.max_iters=2 \
  train_cfg.val_interval=100000 default_hooks.checkpoint.interval=2
run "${TWO[@]}" env PYTHON="$PYTHON" PORT=$((30500 + $$ % 1000)) TOOL=test_robustness.py \
  bash tools/dist_test.sh "$DET" "$WORK/fan-t/iter_$ITERS.pth" 2 --corruptions fog \
  --severities 3 --results "$WORK/robustness/robustness_2proc_$STAMP.json" \
  --work-dir "$WORK/robustness_2proc"
[ -n "${DRY_RUN:-}" ] && exit 0

"$PYTHON" - "$WORK" "$RESULTS" "$WORK/robustness/robustness_2proc_$STAMP.json" <<'PY'
import glob, json, statistics, sys
work, results, two = sys.argv[1:4]
vq = json.load(open(f'{work}/tokenizer/eval.json'))
print(f"\ngpu_check summary ({work})\n  tokenizer: {vq['seconds'] / vq['iters']:.3f} s/iter "
      f"({vq['iters']} iters, PSNR {vq['psnr']:.1f} dB)")
for name in ('fan-t', 'fan-t_dat'):
    log = sorted(glob.glob(f'{work}/{name}/*/vis_data/scalars.json'))[-1]
    steps = [r['time'] for r in map(json.loads, open(log)) if 'loss' in r]  # training only
    times = steps[2:] or steps  # the first two steps warm up
    print(f'  {name}: {statistics.median(times):.3f} s/iter (median of {len(times)})')
timing = json.load(open(results))['timing']
for corruption, cells in timing.items():
    for severity, t in cells.items():
        print(f"  robustness {corruption} {severity}: {t['wall_s']:.1f} s")
both = json.load(open(two))['cells']
one = json.load(open(results))['cells']
same = all(both[c] == one[c] for c in both)
print(f"  2 processes: {len(both)} cells, {'the same' if same else 'other'} numbers than 1 "
      "process (expected the same when both ran on the same kind of device)")
PY
