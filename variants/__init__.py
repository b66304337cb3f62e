"""mlx-variants: approximate variants of an MLX decision model, judged against a contract."""

from variants.runtime.blas import BLAS_INFO, load_openblas

load_openblas()  # must run before the first `import mlx` anywhere in the process

__version__ = "0.1.0"
__all__ = ["BLAS_INFO", "load_openblas", "__version__"]
