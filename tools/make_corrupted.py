"""Write COCO-C / Cityscapes-C style corrupted copies of a dataset (see --help).

    python tools/make_corrupted.py data/coco data/coco-c --protocol benchmark --workers 8
"""
import sys

from mmrobust.corruptions.generate import main

if __name__ == '__main__':
    sys.exit(main())
