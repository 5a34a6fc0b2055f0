"""
The sink study's statistics, fixed before its runs (docs/analysis.md, "The sink study's tests"): an
exact two-sided permutation test on per-seed values (permuted within strata: the kd arm's teachers),
its paired form for matched seeds (v2: an exact sign-flip test on per-seed differences), Fisher's
exact test on counts, Holm's correction within a family, seeded bootstrap intervals, and the seeds
per variant a difference of the observed size would need. The standard library only (itertools,
math, random, statistics): no dependency. tests/test_significance.py holds each test to a second
implementation.
"""
import itertools
import math
import random
import statistics

from lmkit.stats import mean_std  # noqa: F401  (sig.mean_std: the report's means, as analyze.py's; stdlib only)

ALPHA = 0.05  # the family-wise error rate Holm's correction holds
POWER = 0.8  # the power the seeds-needed estimate aims at
MIN_SEEDS = 3  # a comparison where a variant has fewer seeds gives numbers, never a verdict word
BOOTSTRAP_SAMPLES = 10_000
BOOTSTRAP_SEED = 0
TIE = 1e-12  # differences within this (relative) of the observed one count as at least as extreme


def mean_difference(a, b):
    return statistics.fmean(a) - statistics.fmean(b)


def by_stratum(values, strata):
    """{stratum: [values]}; one stratum (None) where strata is None."""
    out = {}
    for value, stratum in zip(values, strata or [None] * len(values)):
        out.setdefault(stratum, []).append(value)
    return out


def permutation_test(a, b, strata_a=None, strata_b=None):
    """Exact two-sided p of the difference of means mean(a) - mean(b): the share of the
    reassignments of the pooled values to the two groups, each stratum keeping its own group sizes
    (the kd arm: the students of one teacher are exchanged among themselves only), whose
    |difference| is at least the observed one's. The observed assignment is one of them, so p >= 1 /
    (their number): 3 seeds against 3 can never go below 0.1."""
    groups_a, groups_b = by_stratum(a, strata_a), by_stratum(b, strata_b)
    observed = abs(mean_difference(a, b))
    choices = []  # per stratum: the sum of the values each reassignment gives group a
    for stratum in sorted(set(groups_a) | set(groups_b), key=str):
        pooled = groups_a.get(stratum, []) + groups_b.get(stratum, [])
        k = len(groups_a.get(stratum, []))
        choices.append([sum(pooled[i] for i in pick)
                        for pick in itertools.combinations(range(len(pooled)), k)])
    total = sum(a) + sum(b)
    extreme = count = 0
    for sums in itertools.product(*choices):
        sum_a = sum(sums)
        difference = sum_a / len(a) - (total - sum_a) / len(b)
        count += 1
        extreme += abs(difference) >= observed - TIE * max(1.0, observed)
    return extreme / count


MAX_PAIRS = 20  # the paired test enumerates 2^n sign flips: a million at most


def paired_test(differences):
    """Exact two-sided p of the mean of paired differences (one per seed: the same seed's batches
    and shared initial tensors in both variants, train.py's matched_init): the share of the 2^n
    assignments of signs to the differences whose |mean| is at least the observed one's. A pair is
    its own stratum, so the kd arm's teachers need no more. The observed signs are one assignment,
    so p >= 2 / 2^n: 8 pairs can never go below 0.0078."""
    if len(differences) > MAX_PAIRS:
        raise ValueError(f"{len(differences)} pairs: the exact paired test enumerates 2^n sign "
                         f"flips, at most {MAX_PAIRS} pairs")
    observed = abs(sum(differences))
    extreme = count = 0
    for signs in itertools.product((1, -1), repeat=len(differences)):
        count += 1
        extreme += abs(sum(s * d for s,
                           d in zip(signs, differences))) >= observed - TIE * max(1.0, observed)
    return extreme / count


def paired_floor(level):
    """The fewest pairs at which the exact paired test can reach a p below `level` at all: 2 / 2^n <
    level."""
    n = 1
    while 2 / 2 ** n >= level:
        n += 1
    return n


def paired_interval(differences, samples=BOOTSTRAP_SAMPLES, seed=BOOTSTRAP_SEED):
    """The 95% percentile interval of the mean paired difference over `samples` resamples of the
    pairs (seeded)."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choice(differences) for _ in differences)
                   for _ in range(samples))
    return means[int(0.025 * samples)], means[int(0.975 * samples) - 1]


def pairs_needed(differences, family_size):
    """About how many pairs would decide a mean difference of the observed size at Holm's strictest
    level with power POWER: n = ((z_{1 - level/2} + z_power) s_d / d)^2, s_d the standard deviation
    of the differences, never below paired_floor(level). None where the mean difference is 0."""
    level = ALPHA / family_size
    z = statistics.NormalDist().inv_cdf(1 - level / 2) + statistics.NormalDist().inv_cdf(POWER)
    d = statistics.fmean(differences)
    if d == 0:
        return None
    return max(math.ceil((z * statistics.stdev(differences) / d) ** 2), paired_floor(level))


def hypergeometric(x, n_a, n_b, hits):
    """P(x of the `hits` seeds with the outcome fall in group a), n_a and n_b seeds in the
    groups."""
    return math.comb(n_a, x) * math.comb(n_b, hits - x) / math.comb(n_a + n_b, hits)


def fisher_exact(x_a, n_a, x_b, n_b):
    """Fisher's exact two-sided p for x_a of n_a seeds against x_b of n_b: the total probability,
    given the margins, of the tables no more probable than the observed one (R's fisher.test rule,
    with its 1e-7 relative tolerance)."""
    hits = x_a + x_b
    observed = hypergeometric(x_a, n_a, n_b, hits)
    return min(1.0, sum(p for x in range(max(0, hits - n_b), min(n_a, hits) + 1)
                        if (p := hypergeometric(x, n_a, n_b, hits)) <= observed * (1 + 1e-7)))


def holm(p_values):
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest p times (m - i +
    1), made non-decreasing, at most 1. A claim is decided where its adjusted p is below ALPHA."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def bootstrap_interval(a, b, strata_a=None, strata_b=None, samples=BOOTSTRAP_SAMPLES,
                       seed=BOOTSTRAP_SEED):
    """The 95% percentile interval of mean(a) - mean(b) over `samples` resamples, each group's
    values drawn with replacement within each stratum (random.Random(seed): the same interval every
    time)."""
    rng = random.Random(seed)
    parts_a, parts_b = list(by_stratum(a, strata_a).values()), list(by_stratum(b,
                                                                               strata_b).values())

    def resample(parts):
        return [rng.choice(part) for part in parts for _ in part]
    differences = sorted(mean_difference(resample(parts_a), resample(parts_b))
                         for _ in range(samples))
    return differences[int(0.025 * samples)], differences[int(0.975 * samples) - 1]


def exact_floor_seeds(level):
    """The fewest seeds per variant (n against n, one stratum) at which the exact permutation test
    can reach a p below `level` at all: 2 / C(2n, n) < level."""
    n = 1
    while 2 / math.comb(2 * n, n) >= level:
        n += 1
    return n


def seeds_needed(a, b, family_size, proportions=False):
    """About how many seeds per variant would decide a difference of the observed size, at the
    strictest level of Holm's correction over the family (ALPHA / family_size, two-sided) with power
    POWER: the normal approximation n = 2 ((z_{1 - level/2} + z_power) s / d)^2, s the pooled
    standard deviation of the seeds (proportions: n = (z + z)^2 (p_a q_a + p_b q_b) / d^2), and
    never below exact_floor_seeds(level). None where the difference is 0."""
    level = ALPHA / family_size
    z = statistics.NormalDist().inv_cdf(1 - level / 2) + statistics.NormalDist().inv_cdf(POWER)
    d = mean_difference(a, b)
    if d == 0:
        return None
    if proportions:
        p_a, p_b = statistics.fmean(a), statistics.fmean(b)
        n = z ** 2 * (p_a * (1 - p_a) + p_b * (1 - p_b)) / d ** 2
    else:
        pooled = ((len(a) - 1) * statistics.variance(a)
                  + (len(b) - 1) * statistics.variance(b)) / (len(a) + len(b) - 2)
        n = 2 * z ** 2 * pooled / d ** 2
    return max(math.ceil(n), exact_floor_seeds(level))


def verdict(direction, difference, p_adjusted, n_a, n_b, needed):
    """The verdict word of a claim `low < high` (direction '<') or `low > high` ('>') whose groups
    differ by difference = mean(low) - mean(high): with fewer than MIN_SEEDS seeds in a group none
    (numbers only); else 'supported' or 'contradicted' where the Holm-adjusted p is below ALPHA, as
    the sign goes, and 'not decided' with the seeds a difference of this size would need."""
    if min(n_a, n_b) < MIN_SEEDS:
        return f"numbers only (fewer than {MIN_SEEDS} seeds in a group)"
    if p_adjusted < ALPHA:
        agrees = difference < 0 if direction == '<' else difference > 0
        return f"{'supported' if agrees else 'contradicted'} (p = {p_adjusted:.3g})"
    size = 'no difference was observed' if needed is None else \
        f"about {needed} seeds per variant would decide a difference of this size"
    return f"not decided (p = {p_adjusted:.3g}; {size})"
