"""Load an exported folder packed: :func:`load_variant` (the whole decision model: the skeleton
from ``config.json`` and ``model.toml``, factored layers put in place from the ``mlx_variants``
block, each stored tensor put at its module path (the file names them as the original
checkpoint does, :func:`variants.checkpoints.packed.module_weights`; a folder written before
that, by module path, loads too), ``mlx.nn.quantize`` with the ``quantization`` block's
predicate — mlx-lm's
``load_model`` rule: a module listed there takes its entry, ``false`` keeps it full precision —
and ``load_weights(strict=True)`` from ``model.safetensors``). Nothing is re-quantized: the
packed integers, scales and biases are the file's. The folder's format and both of its loaders
live below the export room (:mod:`variants.families.artifact`,
:mod:`variants.checkpoints.packed`), so a sweep's cold start loads the same files.
"""

from variants.arch.lowrank import place_lowrank  # noqa: F401  (re-exported)
from variants.checkpoints.packed import BLOCK, is_export, quant_predicate  # noqa: F401
from variants.families.artifact import load_variant  # noqa: F401
