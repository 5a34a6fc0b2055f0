"""
Summary statistics shared by the analyses and the sink study's tests, in the standard library alone (the study's
significance.py imports nothing else).
"""
import statistics


def mean_std(values):
    """(mean, sample standard deviation) of the values given (None: not measured, left out); None where undefined."""
    values = [v for v in values if v is not None]
    return (statistics.fmean(values) if values else None), (statistics.stdev(values) if len(values) > 1 else None)
