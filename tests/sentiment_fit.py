"""minilm-sentiment fitted on small splits of the bundled VADER data: what many family and
search tests build once per module (their fixtures pick the sizes)."""


def sentiment_splits(fit, calibration, eval_, seed=0):
    """``{"fit", "calibration", "eval": TaskSet}`` of ``fit`` / ``calibration`` / ``eval_`` rows
    sampled (``seed``) from the bundled data's splits of the same names."""
    from variants.datasets import bundled as data
    from variants.models import sentiment

    fr = data.load_vader()
    return {s: sentiment.make_taskset(data.sample(data.split_frame(fr, s), n, seed=seed))
            for s, n in (("fit", fit), ("calibration", calibration), ("eval", eval_))}


def fitted_sentiment(checkpoint, splits):
    """minilm-sentiment on ``checkpoint``, its head fitted on ``splits["fit"]`` and its
    temperatures on ``splits["calibration"]``."""
    from variants.models import sentiment

    m = sentiment.build(checkpoint)
    m.fit_head(splits["fit"])
    m.calibrate(splits["calibration"])
    return m
