"""Where the suite finds the repository, its configs and the README demo's detector config."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / 'configs'
# model configs (mmdet / mmseg) and tokenizer-training configs (VQTokenizerTrainer)
TOKENIZER_CONFIGS = sorted((CONFIGS / 'tokenizers').glob('*.py'))
ALL_CONFIGS = sorted(p for p in CONFIGS.rglob('*.py')
                     if '_base_' not in p.parts and p not in TOKENIZER_CONFIGS)

# the README demo's detector (tools/demo_toy.sh), trained once per session by `trained_toy_detector`
DEMO_DET_CFG = 'configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py'


def config_id(path: Path) -> str:
    """A config's test id: its path under ``configs/``."""
    return str(path.relative_to(CONFIGS))
