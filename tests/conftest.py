import variants  # noqa: F401  (loads OpenBLAS before any test imports mlx)
import pytest


@pytest.fixture(scope="session")
def checkpoint():
    from variants.checkpoint import load_checkpoint

    return load_checkpoint()
