"""Default settings of the metrics, in one place (the contract's ``[settings]``, :func:`evaluate`,
the ECE functions, the plots and the sweep read them from here).

- ``NEAR_TIE_MARGIN`` (raw-logit units): an example is a near tie when the reference's top-two
  margin is below this.
- ``N_BINS``: confidence bins of the expected calibration errors (Guo et al., ICML 2017, use 15).
- ``SMECE_BANDWIDTH`` (confidence units, 0..1): the Gaussian kernel's σ of the smooth ECE
  (:mod:`metrics.smooth_ece`; Błasiok & Nakkiran, ICLR 2024), fixed so that the reference and the
  variant are smoothed alike; its Lipschitz constant is 1 + sqrt(2/π)/σ (16.96 at 0.05).
- ``SMECE_GRID``: points of the trapezoid rule over [0, 1] that integrates the smoothed residual.
- ``HUMAN_TIE_GAP`` (rater-share units, 0..1): an item is a human near tie when its two most
  chosen options' shares differ by at most this.
- ``VALUE_TOLERANCE`` (units of the reference's spread): a regression row is within tolerance
  when ``|variant - reference| <= VALUE_TOLERANCE x std(reference values)``
  (:mod:`metrics.regression`; the contract's ``[settings] value_tolerance``).
"""

NEAR_TIE_MARGIN = 1.0
N_BINS = 15
SMECE_BANDWIDTH = 0.05
SMECE_GRID = 512
HUMAN_TIE_GAP = 0.2
VALUE_TOLERANCE = 0.05
#: A row is a numerical tie when the reference's raw top-two margin is at most this many times
#: the reference's own numerical noise (the largest |Δlogit| between two compute paths of the
#: reference on the eval rows, run.json ``reference_noise``): its answer is not stable across
#: machines, so its flips are reported apart (stratum ``numerical_tie``).
NUMERICAL_TIE_MULTIPLE = 10.0
