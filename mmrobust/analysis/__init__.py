"""Analyses that explain robustness.

Fourier sensitivity, patch masking, attention rollout and channel gates, what discrete tokens keep.
"""
from .attention import AttentionRecorder, attention_probs, attention_report, rollout
from .perturbation import (
    PerturbationStudy,
    fourier_basis,
    fourier_perturb,
    frequency_grid,
    heatmap_matrix,
    mirror_heatmap,
    open_study,
    patch_mask,
    plot_heatmaps,
    plot_masking,
)
from .token_view import load_tokenizer, plot_code_changes, read_rgb, token_view

__all__ = ['AttentionRecorder', 'attention_probs', 'attention_report', 'rollout',
           'PerturbationStudy', 'fourier_basis', 'fourier_perturb', 'frequency_grid',
           'heatmap_matrix', 'mirror_heatmap', 'open_study', 'patch_mask', 'plot_heatmaps',
           'plot_masking', 'load_tokenizer', 'plot_code_changes', 'read_rgb', 'token_view']
