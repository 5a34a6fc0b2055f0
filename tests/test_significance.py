"""study/significance.py, each test against a second implementation written here another way: the
permutation test by brute-force enumeration of every labelling of the seeds, Fisher's by counting
seed assignments one by one, Holm's by its definition as a sequence of rejections, and textbook
values."""
import itertools
import math
import statistics

import pytest

from study import significance as sig


def brute_force_permutation(a, b, strata_a=None, strata_b=None):
    """Every labelling of the pooled seeds as a / b (2^n of them), kept where each stratum has its
    observed group sizes, counted where |mean(a) - mean(b)| is at least the observed (to 1e-9)."""
    values = list(a) + list(b)
    strata = list(strata_a or [0] * len(a)) + list(strata_b or [0] * len(b))
    sizes = {s: sum(1 for t in (strata_a or [0] * len(a)) if t == s) for s in set(strata)}
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    hits = total = 0
    for labels in itertools.product((True, False), repeat=len(values)):
        if any(sum(1 for lab, t in zip(labels, strata) if lab and t == s) != k for s,
               k in sizes.items()):
            continue
        group_a = [v for v, lab in zip(values, labels) if lab]
        group_b = [v for v, lab in zip(values, labels) if not lab]
        total += 1
        hits += abs(statistics.fmean(group_a) - statistics.fmean(group_b)) >= observed - 1e-9
    return hits / total


def counted_fisher(x_a, n_a, x_b, n_b):
    """Fisher's two-sided p by direct counting: every way of choosing which n_a of the n_a + n_b
    seeds form group a (the seeds with the outcome fixed), each equally likely; p is the share of
    choices whose table is no more likely than the observed one, likelihood being the count of
    choices giving that table."""
    seeds = [1] * (x_a + x_b) + [0] * (n_a + n_b - x_a - x_b)
    tables = {}
    for pick in itertools.combinations(range(len(seeds)), n_a):
        x = sum(seeds[i] for i in pick)
        tables[x] = tables.get(x, 0) + 1
    total = sum(tables.values())
    return sum(c for c in tables.values() if c <= tables[x_a]) / total


@pytest.mark.parametrize('a, b, strata_a, strata_b', [
    ([0.1, 0.3, 0.2], [0.5, 0.4, 0.9], None, None),
    ([1.0, 2.0, 2.0, 5.0], [2.0, 3.0, 1.0], None, None),  # ties and unequal sizes
    # the kd arm: within teachers
    ([0.11, 0.12, 0.3, 0.25], [0.2, 0.21, 0.4, 0.5], [1, 1, 2, 2], [1, 1, 2, 2]),
    ([3.0, 1.0, 4.0, 1.0, 5.0], [9.0, 2.0, 6.0], [1, 2, 1, 2, 1], [1, 2, 2]),
])
def test_permutation_test_against_every_labelling(a, b, strata_a, strata_b):
    assert sig.permutation_test(a, b, strata_a, strata_b) == pytest.approx(
        brute_force_permutation(a, b, strata_a, strata_b), abs=1e-12)


def test_permutation_test_floor_and_strata():
    """3 against 3 with every a below every b: the two extreme labellings of 20, p = 0.1 (never
    lower); permuting within two teachers of 2 + 2 seeds each leaves 6 x 6 labellings, and the same
    separation gives 2 / 36."""
    assert sig.permutation_test([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert sig.permutation_test([1, 2, 10, 11], [3, 4, 12, 13], [1, 1, 2, 2],
                                [1, 1, 2, 2]) == pytest.approx(2 / 36)


@pytest.mark.parametrize('x_a, n_a, x_b, '
                         'n_b',
                         [(3, 4, 1, 4), (0, 8, 8, 8), (2, 6, 3, 5), (0, 3, 0, 3), (5, 8, 1, 3)])
def test_fisher_against_counting(x_a, n_a, x_b, n_b):
    assert sig.fisher_exact(x_a, n_a, x_b, n_b) == pytest.approx(counted_fisher(x_a, n_a, x_b, n_b),
                                                                 abs=1e-12)


def test_fisher_textbook_value():
    """Fisher's lady tasting tea, 3 of 4 right against 1 of 4: two-sided p = 34/70."""
    assert sig.fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70)


def test_holm_by_its_definition():
    """Holm rejects, smallest p first, while p_(i) <= alpha / (m - i + 1); the adjusted p-values
    reject exactly those at every alpha."""
    p = [0.01, 0.04, 0.03, 0.005, 0.2]
    adjusted = sig.holm(p)
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.2])
    for alpha in (0.01, 0.026, 0.05, 0.1, 0.3):
        rejected, order = set(), sorted(range(len(p)), key=p.__getitem__)
        for rank, i in enumerate(order):
            if p[i] > alpha / (len(p) - rank):
                break
            rejected.add(i)
        assert rejected == {i for i, q in enumerate(adjusted) if q <= alpha}


def test_bootstrap_interval_is_seeded_and_covers_the_difference():
    a, b = [0.1, 0.2, 0.15, 0.3], [0.5, 0.45, 0.6]
    low, high = sig.bootstrap_interval(a, b)
    assert (low, high) == sig.bootstrap_interval(a, b)
    assert low < statistics.fmean(a) - statistics.fmean(b) < high < 0
    assert sig.bootstrap_interval([1, 1, 1], [1, 1, 1]) == (0.0, 0.0)


def test_seeds_needed_and_the_words():
    """The normal approximation by hand, the exact test's floor, and each verdict word."""
    a, b = [1.0, 2.0, 3.0], [3.0, 4.0, 5.0]  # d = -2, pooled variance 1
    z = statistics.NormalDist().inv_cdf(1 - 0.05 / 2 / 2) + statistics.NormalDist().inv_cdf(0.8)
    assert sig.seeds_needed(a, b, family_size=2) == max(math.ceil(2 * z ** 2 / 4), 5)
    # 2/924 < 0.0071 < 2/252
    assert sig.exact_floor_seeds(0.05 / 7) == 6 and sig.exact_floor_seeds(0.05) == 4
    assert sig.seeds_needed([1.0, 1.0], [1.0, 1.0], 1) is None
    assert sig.verdict('<', -0.2, 0.01, 3, 3, 5) == 'supported (p = 0.01)'
    assert sig.verdict('<', 0.2, 0.01, 3, 3, 5) == 'contradicted (p = 0.01)'
    assert sig.verdict('>', 0.2, 0.3, 8, 8, 12).startswith('not decided (p = 0.3; about 12 seeds')
    assert sig.verdict('>', 0.2, 0.001, 2, 8, 12).startswith('numbers only')


def test_mean_std_leaves_out_what_was_not_measured():
    # (1 + 3) / 2 = 2; sample variance ((1-2)² + (3-2)²) / (2 - 1) = 2
    assert sig.mean_std([1.0, None, 3.0]) == (2.0, math.sqrt(2))
    assert sig.mean_std([5.0]) == (5.0, None)  # one value: no spread
    assert sig.mean_std([None]) == (None, None)


def test_paired_test_by_hand_and_against_every_sign_vector():
    """The sign-flip test on paired differences: by hand for [1, 2, 3] (of the 8 sign vectors only
    +++ and --- reach |sum| 6, so p = 2/8), for [1, -1] (every vector reaches 0: p = 1), and against
    a count over a grid of numpy sign vectors for 12 pairs (its floor, 2 / 4096, is below Holm's
    strictest level for 7 claims, 0.05 / 7, which 8 pairs' 2 / 256 is not)."""
    import numpy as np
    assert sig.paired_test([1.0, 2.0, 3.0]) == 0.25 and sig.paired_test([1.0, -1.0]) == 1.0
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 1.0, 12)
    grid = np.array(list(itertools.product((1, -1), repeat=12)))
    sums = np.abs(grid @ d)
    assert sig.paired_test(list(d)) == pytest.approx(np.mean(sums >= abs(d.sum()) - 1e-12))
    assert sig.paired_test([0.1 * (i + 1) for i in range(12)]) == 2 / 4096 < 0.05 / 7 < 2 / 256
    assert sig.paired_floor(0.05 / 7) == 9 and sig.paired_floor(0.05) == 6
    with pytest.raises(ValueError, match='at most 20 pairs'):
        sig.paired_test([1.0] * 21)


def test_pairs_needed_and_the_paired_interval():
    """pairs_needed: n = ((z_{1 - level/2} + z_0.8) s_d / d)^2 at Holm's strictest level, never
    below the exact test's floor. At level 0.05 / 7, z = 2.69 + 0.84 = 3.53. Differences 1, 3, 1, 3
    (mean 2, s_d 1.155): n = (3.53 x 1.155 / 2)^2 = 4.2, below the floor of 9 pairs; 1, -0.6, 1,
    -0.6 (mean 0.2, s_d 0.924): n = 266.1 -> 267. The paired interval is seeded and holds the mean
    difference."""
    assert sig.pairs_needed([1.0, 3.0, 1.0, 3.0], 7) == 9
    assert sig.pairs_needed([1.0, -0.6, 1.0, -0.6], 7) == 267
    assert sig.pairs_needed([1.0, -1.0], 7) is None
    low, high = sig.paired_interval([1.0, 3.0, 1.0, 3.0])
    assert low <= 2.0 <= high and (low, high) == sig.paired_interval([1.0, 3.0, 1.0, 3.0])
