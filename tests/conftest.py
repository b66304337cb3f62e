"""Shared fixtures.

Plots are stubbed unless a test asks for them (:func:`_plots_only_where_marked`): a sweep's plot
pass (``runs.plots.render.plot_run``, five matplotlib figures) takes ~3 s alone and 5-14 s under
load, and most tests that run a sweep check its numbers, files, resume or errors, not its
pictures. During a test marked ``@pytest.mark.plots`` (the test, its class or module; also the
module/session fixtures that test sets up first) ``plot_run`` is the real one; otherwise it
writes nothing and returns ``[]`` (as a run whose plots were all skipped; report.md then has no
plot section). Marked: every test that asserts anything about plots/*.png, report.md's plot
links, ``variants plot`` or that a complete run has its plots (tests/runs/test_plots.py, the
run-lifecycle invariant tests, one small real sweep in tests/commands/test_cli.py, ...); the marked set
was found by running the whole suite with the stub everywhere. Subprocesses (``variants sweep``
in a child process, the notebooks) always plot.
"""
import os

import variants  # noqa: F401  (loads OpenBLAS before any test imports mlx)
import pytest

_REAL = {"plots": False, "html": False}  # does the test being set up / run want the real one


def _one_thread_for_numpys_and_scipys_openblas():
    """NumPy and SciPy each bundle their own OpenBLAS (``libscipy_openblas*``), each with a pool
    of one thread per core that spins after a call. In this one test process, beside MLX's
    OpenBLAS (the one :mod:`variants.runtime.blas` loads; untouched here: the product sets it),
    those pools oversubscribe 2 cores: a float64 Cholesky of a 384 x 384 Hessian (GPTQ) took
    ~1 s instead of ~10 ms, an sklearn head fit several seconds more. The product pins one
    BLAS thread for the same reason around its activation statistics and low-rank factoring
    (``threadpool_limits(1)`` in variants/arch/activations.py and families/lowrank/build.py);
    the test session does it for the two bundled libraries alone. Results are unchanged (the
    float64 work splits over output blocks, not reductions) and child processes (CLI runs,
    cold starts, notebooks) keep their defaults. ``VARIANTS_TEST_BUNDLED_BLAS_THREADS=0`` keeps
    the libraries' own default (for A/B)."""
    n = int(os.environ.get("VARIANTS_TEST_BUNDLED_BLAS_THREADS", "1"))
    if n <= 0:
        return
    import numpy  # noqa: F401  (their OpenBLAS loaded, so threadpoolctl sees them)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import ThreadpoolController

    from variants.runtime.blas import BLAS_INFO

    mlx_blas = os.path.realpath(BLAS_INFO["library"]) if BLAS_INFO.get("library") else None
    for lib in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        if os.path.realpath(lib.filepath) != mlx_blas:
            lib.set_num_threads(n)


_one_thread_for_numpys_and_scipys_openblas()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures are set up: real plots only for a test marked ``plots``."""
    _REAL["plots"] = item.get_closest_marker("plots") is not None
    _REAL["html"] = item.get_closest_marker("html") is not None


@pytest.fixture(scope="session", autouse=True)
def _plots_only_where_marked():
    """``runs.plots.render.plot_run`` for the session: the real one during a test marked
    ``plots``, else a stub writing nothing (returns ``[]``); see the module docstring."""
    import runs.plots.render as render

    real = render.plot_run

    def plot_run(run_dir, **kw):
        return real(run_dir, **kw) if _REAL["plots"] else []

    render.plot_run = plot_run
    yield real
    render.plot_run = real


@pytest.fixture(scope="session", autouse=True)
def _html_only_where_marked():
    """``runs.html.render.write_beside_markdown`` (report.html beside report.md: matplotlib SVG
    charts, ~1-3 s a run) and ``runs.html.search.write_search_html`` (a search's report.html)
    for the session: the real ones during a test marked ``html``, else stubs writing nothing
    (as a run whose HTML could not be rendered)."""
    import runs.html.render as render
    import runs.html.search as search

    real, real_search = render.write_beside_markdown, search.write_search_html

    def write_beside_markdown(run_dir, **kw):
        return real(run_dir, **kw) if _REAL["html"] else None

    def write_search_html(out, **kw):
        return real_search(out, **kw) if _REAL["html"] else None

    render.write_beside_markdown = write_beside_markdown
    search.write_search_html = write_search_html
    yield real
    render.write_beside_markdown, search.write_search_html = real, real_search


@pytest.fixture(scope="session")
def real_plots():
    """A context manager under which ``plot_run`` is the real one whatever the test's marks:
    for a module/session fixture whose sweep must have its plots for every test using it."""
    import contextlib

    @contextlib.contextmanager
    def real():
        before, _REAL["plots"] = _REAL["plots"], True
        try:
            yield
        finally:
            _REAL["plots"] = before
    return real


@pytest.fixture(scope="session")
def checkpoint():
    from variants.checkpoints.load import load_checkpoint

    return load_checkpoint()


@pytest.fixture(scope="session")
def plotted_sweep_small(tmp_path_factory, _plots_only_where_marked):
    """``(run_dir, paths)``: a copy of tests/fixtures/sweep_small with its plots written by
    ``plot_run`` (default dpi), drawn once per session (a plot pass takes seconds). Read-only:
    copy ``run_dir`` before changing anything in it."""
    import shutil
    from pathlib import Path

    plot_run = _plots_only_where_marked  # the real one, whichever test sets this up

    run = tmp_path_factory.mktemp("plotted") / "sweep_small"
    shutil.copytree(Path(__file__).parent / "fixtures" / "sweep_small", run)
    return run, plot_run(run)


@pytest.fixture(scope="session")
def html_sweep_small(tmp_path_factory, _html_only_where_marked):
    """A copy of tests/fixtures/sweep_small checked in place by ``variants check``'s
    :func:`runs.judge.check_run` with the real report.html writer (its report.html and
    report.json beside report.md). Request it from tests marked ``html``."""
    import shutil
    from pathlib import Path

    from runs.judge import check_run

    run = tmp_path_factory.mktemp("html") / "sweep_small"
    shutil.copytree(Path(__file__).parent / "fixtures" / "sweep_small", run)
    before, _REAL["html"] = _REAL["html"], True
    try:
        check_run(run)
    finally:
        _REAL["html"] = before
    return run


@pytest.fixture(scope="module")
def enc():
    """A tiny random BERT encoder (2 layers, 4 heads of 8, FFN 64), one per test module, for
    tests that compare the encoder's execution paths (streams, packing, head split)."""
    import mlx.core as mx

    from variants.arch.encoder import BertEncoder, ModelArgs

    mx.random.seed(3)
    e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=64))
    mx.eval(e.parameters())
    return e


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped, naming the device, where MLX has no GPU backend."""
    from variants.runtime import device

    if device.backend() is not None:
        return
    skip = pytest.mark.skip(reason="needs a GPU backend (Metal or CUDA); none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def qk():
    """The compiled extension with its fused BERT layer ops (variants.runtime.qkernel), or a skip naming
    why it is unavailable here (tests/runtime/test_qkernel.py has its own, for the dequantizer alone)."""
    from variants.runtime import qkernel

    mod = qkernel.load()
    if mod is None or not hasattr(mod, "fused_bert_layer"):
        pytest.skip(f"compiled kernel unavailable here: {qkernel.why_unavailable()}")
    return mod


class FakeClock:
    """A ``perf_counter`` that moves only when a timed function says so (``advance_ms``): the
    timing harness's bookkeeping and statistics tested on exact durations, not on how loaded
    the machine is (a real-clock A-vs-A test failed on CI with a median ratio of 1.15)."""

    def __init__(self):
        self.t = 1000.0

    def perf_counter(self):
        return self.t

    def advance_ms(self, ms):
        self.t += ms / 1e3


@pytest.fixture
def fake_clock(monkeypatch):
    """:class:`FakeClock` standing in for ``time.perf_counter`` inside ``variants.runtime.timing``."""
    from types import SimpleNamespace

    import variants.runtime.timing as timing

    clock = FakeClock()
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    return clock
