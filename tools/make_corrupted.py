"""Write COCO-C / Cityscapes-C style corrupted copies of a dataset (see --help).

python tools/make_corrupted.py data/coco data/coco-c --protocol benchmark --workers 8
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrobust.utils.errors import run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

from mmrobust.corruptions.generate import main

if __name__ == '__main__':
    run_tool(main)
