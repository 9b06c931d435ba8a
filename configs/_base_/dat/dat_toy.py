# DAT on the toy data: the project's own small tokenizer, trained first with
#   python tools/train_vq.py configs/tokenizers/vq-small-f16_toy-coco.py
_base_ = ['../../tokenizers/_base_/vq-small-f16-toy.py', './dat.py']
# NOTE: bf16 autocast for the tokenizer's convolutions (its code distances stay fp32): its two
# full-resolution round trips per step are the part of DAT's cost that does not scale with the
# model
dat_hook = dict(tokenizer=dict(_delete_=True, type='VQGAN', arch={{_base_.toy_tokenizer_arch}},
                               autocast=True,
                               init_cfg=dict(type='Pretrained',
                                             checkpoint={{_base_.toy_tokenizer_checkpoint}})))
