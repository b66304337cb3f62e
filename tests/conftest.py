import variants  # noqa: F401  (loads OpenBLAS before any test imports mlx)
import pytest


@pytest.fixture(scope="session")
def checkpoint():
    from variants.checkpoint import load_checkpoint

    return load_checkpoint()


@pytest.fixture(scope="session")
def plotted_sweep_small(tmp_path_factory):
    """``(run_dir, paths)``: a copy of tests/fixtures/sweep_small with its plots written by
    ``plot_run`` (default dpi), drawn once per session (a plot pass takes seconds). Read-only:
    copy ``run_dir`` before changing anything in it."""
    import shutil
    from pathlib import Path

    from runs.plots.render import plot_run

    run = tmp_path_factory.mktemp("plotted") / "sweep_small"
    shutil.copytree(Path(__file__).parent / "fixtures" / "sweep_small", run)
    return run, plot_run(run)


@pytest.fixture(scope="module")
def enc():
    """A tiny random BERT encoder (2 layers, 4 heads of 8, FFN 64), one per test module, for
    tests that compare the encoder's execution paths (streams, packing, head split)."""
    import mlx.core as mx

    from variants.encoder import BertEncoder, ModelArgs

    mx.random.seed(3)
    e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=64))
    mx.eval(e.parameters())
    return e


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped, naming the device, where MLX has no GPU backend."""
    from variants import device

    if device.backend() is not None:
        return
    skip = pytest.mark.skip(reason="needs a GPU backend (Metal or CUDA); none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
