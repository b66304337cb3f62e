"""Ship a judged variant: write it as an MLX checkpoint folder (:mod:`variants.export.write`),
load it packed (:mod:`variants.export.load`), and prove the folder is the model that was judged
(:mod:`variants.export.verify`).

The folder is the layout MLX users already load (mlx-lm's, mlx-embeddings'):
``model.safetensors`` holds every tensor of the original checkpoint under its transformers name
(:mod:`variants.checkpoints.hf_names`), each quantized module as ``weight`` (packed uint32),
``scales`` and ``biases`` exactly as ``mlx.nn.quantize`` makes them (in the dtype they were
judged in: float32, or float16 / bfloat16 as mlx-lm stores them; the microscaling modes' uint8
scales and no biases), the tensors the variant does not change (a pooler, buffers) as the
checkpoint has them; ``config.json`` is the original checkpoint's config plus a
``quantization`` block keyed by those names (``group_size``, ``bits``, ``mode``, and a
``{"group_size", "bits"[, "mode"]}`` entry per module that differs, ``false`` for a module of
a quantizable type left full precision) as mlx-lm writes it, plus an ``mlx_variants`` block
(the decision model: kind, temperatures, low-rank factor shapes, the head skeleton, the names
map; ``wrapper``: a token-pruning or early-exit rule's settings,
:mod:`variants.families.wrapper_place`; ``row_embedding``: the formats and row counts of a
word-embedding table stored by use, ``<name>.tables.<k>.*``, ``<name>.row_table``,
``<name>.row_index``, :mod:`variants.runtime.row_embedding`). A decision head fitted
here and exit heads (no transformers name) are in ``decision_head.safetensors`` by module path.
Next to them: the tokenizer files, ``model.toml``, ``contract.toml``, ``verdict.json``, the judged
``outputs.npz`` and the eval rows (``eval_rows.npz``) that ``variants verify`` recomputes,
``manifest.json`` (SHA-256 of every file, the reference checkpoint's, the data fingerprint,
package / MLX / NumPy versions) and a ``README.md`` model card that names the architecture and
the loaders that read the folder.
"""

from variants.families.artifact import (EXPORTABLE, FORMAT_VERSION,  # noqa: F401
                                       NOT_EXPORTABLE)
