"""
What the analyses compute and draw with: mean_std (the sink study's tests), the gradient-norm
statistics of the paper's Tables 4 and 5 (grad_norm_statistics, spike_counts), and matplotlib set up
for figures (pyplot). The standard library alone at import (the study's significance.py imports
nothing else); numpy and matplotlib when called.
"""
import math
import statistics


def mean_std(values):
    """(mean, sample standard deviation) of the values given (None: not measured, left out); None
    where undefined."""
    values = [v for v in values if v is not None]
    return (statistics.fmean(values) if values else None), (statistics.stdev(values)
                                                            if len(values) > 1 else None)


def pyplot():
    import matplotlib
    matplotlib.use('Agg')  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def grad_norm_statistics(grad_norms, start=0, end=500):
    """Table 4 over steps [start, end) of the raw (unclipped) gradient norms: mean, standard
    deviation and variance (population, ddof = 0) and the coefficient of variation std / mean."""
    import numpy as np
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} "
                         "steps")
    mean, std = g.mean(), g.std()
    return dict(mean=mean, std=std, variance=std ** 2, cv=std / mean if mean else math.nan)


def spike_counts(grad_norms, ks=(6, 9), start=0, end=500):
    """Table 5: the number of steps in [start, end) whose gradient norm exceeds median(g) + k *
    MAD(g), with MAD(g) = median(|g - median(g)|), the raw median absolute deviation (no 1.4826
    normal-consistency factor; the paper does not give one)."""
    import numpy as np
    g = np.asarray(grad_norms[start:end], dtype=np.float64)
    if len(g) < end - start:
        raise ValueError(f"asked for steps {start}-{end}, but the run has only {len(grad_norms)} "
                         "steps")
    median = np.median(g)
    mad = np.median(np.abs(g - median))
    return {k: int((g > median + k * mad).sum()) for k in ks}
