"""Checkpoint loading: the bundled all-MiniLM-L6-v2 and Hugging Face folders
(safetensors, tokenizer, config), their classification heads and special tokens."""
