"""Train a VQ tokenizer (Dr-ViT's stage 1, DAT's discretizer) on a dataset's images.

    python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py [--work-dir DIR]
                             [--resume [CKPT]] [--amp] [--cfg-options train_cfg.max_iters=2000]

The same as ``python tools/train.py CONFIG ...``: the tokenizer trains with mmengine's Runner
(mmrobust.models.VQTokenizerTrainer), so ``tools/dist_train.sh``, ``--amp`` and ``--resume`` work as
for any model. Writes DIR/tokenizer.pth (the VQGAN's plain state dict, what the DAT hook and
Dr-ViT load), Runner checkpoints DIR/iter_<n>.pth (VQGAN loads them too), reconstruction
previews in DIR/previews/, the held-out PSNR / perplexity / used codes in the log and, at the
end, with two trivial baselines in DIR/eval.json.
"""
import runpy
from pathlib import Path

if __name__ == '__main__':
    # NOTE: one code path for every model: tools/train.py (which reports the checkout it runs)
    runpy.run_path(str(Path(__file__).with_name('train.py')), run_name='__main__')
