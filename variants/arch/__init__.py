"""Architectures in MLX: BERT (``encoder``) and ModernBERT, their activations, and the
fast and compiled paths each encoder chooses between."""
