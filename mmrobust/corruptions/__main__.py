"""``python -m mmrobust.corruptions SRC OUT ...``: the same CLI as tools/make_corrupted.py."""
import sys

from .generate import main

sys.exit(main())
