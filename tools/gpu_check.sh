#!/usr/bin/env bash
# A smoke check for one GPU after `bash tools/setup_env.sh`: each step runs a few iterations on
# the toy data and prints its time per step, so a broken CUDA build, a device or AMP problem
# shows up in minutes instead of in the first hour of a cluster job.
#   1. the toy tokenizer (tools/train_vq.py), --amp; its result is step 3's tokenizer;
#   2. the toy FAN-T-Hybrid Mask R-CNN, --amp (fp16 with loss scaling);
#   3. the same with DAT (attack pass, two VQ round trips per step), --amp;
#   4. a 2-cell robustness evaluation (clean + fog 3 + gaussian_noise 3) of step 2's checkpoint.
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
run "$PYTHON" tools/test_robustness.py "$DET" "$WORK/fan-t/iter_$ITERS.pth" \
  --corruptions fog gaussian_noise --severities 3 --results "$WORK/robustness.json" \
  --work-dir "$WORK/robustness"
[ -n "${DRY_RUN:-}" ] && exit 0

"$PYTHON" - "$WORK" <<'PY'
import glob, json, statistics, sys
work = sys.argv[1]
vq = json.load(open(f'{work}/tokenizer/eval.json'))
print(f"\ngpu_check summary ({work})\n  tokenizer: {vq['seconds'] / vq['iters']:.3f} s/iter "
      f"({vq['iters']} iters, PSNR {vq['psnr']:.1f} dB)")
for name in ('fan-t', 'fan-t_dat'):
    log = sorted(glob.glob(f'{work}/{name}/*/vis_data/scalars.json'))[-1]
    steps = [r['time'] for r in map(json.loads, open(log)) if 'loss' in r]  # training only
    times = steps[2:] or steps  # the first two steps warm up
    print(f'  {name}: {statistics.median(times):.3f} s/iter (median of {len(times)})')
timing = json.load(open(f'{work}/robustness.json'))['timing']
for corruption, cells in timing.items():
    for severity, t in cells.items():
        print(f"  robustness {corruption} {severity}: {t['wall_s']:.1f} s")
PY
