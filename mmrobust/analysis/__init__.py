"""Analyses that explain robustness (what discrete tokens keep, ...)."""
from .token_view import load_tokenizer, plot_code_changes, read_rgb, token_view

__all__ = ['load_tokenizer', 'plot_code_changes', 'read_rgb', 'token_view']
