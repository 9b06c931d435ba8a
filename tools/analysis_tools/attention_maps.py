"""Attention rollout (FAN-Hybrid, Dr-ViT) and FAN's channel-attention gates, clean and corrupted.

    python tools/analysis_tools/attention_maps.py CONFIG CKPT --images a.jpg b.jpg \
        --corruptions gaussian_noise fog --severity 3 --out-dir work_dirs/attention
    python tools/analysis_tools/attention_maps.py CONFIG CKPT --num-images 4 --out-dir ...

Per image: <name>.png with the inputs (top: clean, then each corruption) above their rollout
overlays, and for FAN gates_<name>.png (mean channel gate per block and head); attention.json
holds, per image and corruption, the L1 distance of the rollout map to the clean one and the
gate statistics.
"""
import argparse
import json
import os
import os.path as osp

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

from mmrobust.analysis import read_rgb
from mmrobust.analysis.attention import AttentionRecorder
from mmrobust.corruptions import corrupt, derive_seed
from mmrobust.utils import config_scope


def overlay(rgb: np.ndarray, heat: np.ndarray) -> np.ndarray:
    heat = (255 * heat / max(heat.max(), 1e-12)).astype(np.uint8)
    color = cv2.applyColorMap(heat, cv2.COLORMAP_JET)
    return cv2.addWeighted(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), 0.5, color, 0.5, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('--images', nargs='+', help='image files (default: test images)')
    parser.add_argument('--num-images', type=int, default=4)
    parser.add_argument('--max-size', type=int, default=512)
    parser.add_argument('--corruptions', nargs='+', default=['gaussian_noise', 'defocus_blur',
                                                             'fog', 'jpeg_compression'])
    parser.add_argument('--severity', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out-dir', required=True)
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args()

    import mmrobust  # noqa: F401  (registers the backbones)
    from mmengine.registry import MODELS
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    init_default_scope(config_scope(cfg))
    if args.images:
        paths = args.images
    else:
        from mmrobust.apis.train_vq import dataset_image_paths
        paths = dataset_image_paths(args.config, 'test_dataloader')[:args.num_images]
    model = MODELS.build(cfg.model)
    load_checkpoint(model, args.checkpoint, map_location='cpu')
    model.eval()
    recorder = AttentionRecorder(model)
    os.makedirs(args.out_dir, exist_ok=True)
    report = {}
    for path in paths:
        name = osp.splitext(osp.basename(path))[0]
        img = read_rgb(path, args.max_size)
        variants = {'clean': img}
        for c in args.corruptions:
            variants[c] = corrupt(img, c, args.severity,
                                  seed=derive_seed(args.seed, path, c, args.severity))
        maps, gates = {}, {}
        for label, rgb in variants.items():
            # NOTE: as loaded by the pipelines (BGR); the preprocessor flips it if it should
            inputs = torch.from_numpy(np.ascontiguousarray(rgb[..., ::-1])).permute(2, 0, 1)
            data = model.data_preprocessor(dict(inputs=[inputs]), False)
            with recorder.record():
                model.backbone(data['inputs'])
            grid = recorder.maps()[0]
            up = F.interpolate(grid[None, None], scale_factor=16, mode='bilinear')[0, 0]
            maps[label] = up[:img.shape[0], :img.shape[1]].numpy()
            gates[label] = recorder.gate_matrix()
        top = np.concatenate([cv2.cvtColor(v, cv2.COLOR_RGB2BGR) for v in variants.values()], 1)
        bottom = np.concatenate([overlay(variants[k], m) for k, m in maps.items()], 1)
        cv2.imwrite(osp.join(args.out_dir, f'{name}.png'), np.concatenate([top, bottom], 0))
        clean = maps['clean'] / maps['clean'].sum()
        entry = {k: dict(rollout_l1_to_clean=float(np.abs(m / m.sum() - clean).sum()))
                 for k, m in maps.items()}
        if gates['clean'].numel():
            import matplotlib
            matplotlib.use('Agg')
            import matplotlib.pyplot as plt
            fig, axes = plt.subplots(1, len(gates), figsize=(3 * len(gates), 3), squeeze=False)
            for ax, (k, g) in zip(axes[0], gates.items()):
                ax.imshow(g[0].numpy(), aspect='auto', cmap='viridis')
                ax.set_title(k, fontsize=8)
                ax.set_xlabel('channel')
                ax.set_ylabel('FAN block')
                entry[k]['gate_mean'] = float(g.mean())
                entry[k]['gate_l1_to_clean'] = float((g - gates['clean']).abs().mean())
            fig.tight_layout()
            fig.savefig(osp.join(args.out_dir, f'gates_{name}.png'), dpi=100)
            plt.close(fig)
        report[path] = entry
        print(name, ', '.join(f'{k}: rollout L1 {v["rollout_l1_to_clean"]:.3f}'
                              for k, v in entry.items() if k != 'clean'))
    tmp = osp.join(args.out_dir, 'attention.json.tmp')
    with open(tmp, 'w') as f:
        json.dump(dict(severity=args.severity, images=report), f, indent=1)
    os.replace(tmp, osp.join(args.out_dir, 'attention.json'))
    print(f'figures and attention.json in {args.out_dir}')


if __name__ == '__main__':
    main()
