"""``python -m mmrobust.corruptions SRC OUT ...``: the same CLI as tools/make_corrupted.py."""
from ..utils.errors import run_tool
from .generate import main

run_tool(main)
