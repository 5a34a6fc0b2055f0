"""A study's reading: what its records say beyond the claims its own set registered (issue 50),
the same for every study, from results.json's runs; all exploratory, and labelled so. reading()
returns it (results.json's 'reading'), study/study_results.py writes its words (docs/analysis.md).

    other_claims   every claim another registered set tested that this study's set left out
    loss_claims    the held-out loss beside each loss claim; gated against affine on both losses
    where_from     where each first-token comparison's difference comes from, layer by layer
    payoff_range   the payoff measures' ranges per variant: can this scale test the payoff at all?
    teachers       the teachers' first-token weight and held-out loss beside the softmax students'
"""
import statistics

from study import significance as sig
from study.study_results import (AFFINE, CLAIM_SETS, GATED, MAX_LAYER_CLAIMS, MEASURES,
                                 PAYOFF_CANDIDATES, PAYOFF_FLOOR, SEALED_SETS, SOFTMAX,
                                 STUDY_MEASURES, claims_of, compare, matched_pairs, measured,
                                 share_in, sink_layers, tested, test_family)

FIRST_TOKEN_MEASURES = ('weight', 'share', 'first_or_null', 'weight_deep', 'share_sink',
                        *(f'weight_l{k}' for k in range(1, MAX_LAYER_CLAIMS + 1)))
# the per-layer lists where_from reads, with their names in the words
LAYER_FIELDS = dict(weight='first_token_weight', share='first_token_share', row_total='row_sum',
                    null_mass='null_mass')


def signature(claim):
    """What a claim tests (measure, low, direction, high), whatever its id or family."""
    return claim[3:]


def claim_set_of(results):
    return results.get('claim_set', 'v1')


def arms_of(results):
    return [arm for arm in ('kd', 'ce') if any(r['arm'] == arm for r in results['runs'])]


def pairs_below(results, arm, row):
    """[k, n]: in how many of n matched pairs the low side's value is below the high side's (None:
    unpaired)."""
    pairs = matched_pairs(*([r for r in tested(results['runs'], arm, v)
                             if measured(r, row['measure']) is not None]
                            for v in (row['low'], row['high'])))
    if not pairs:
        return None
    return [sum(measured(x, row['measure']) < measured(y, row['measure']) for x, y in pairs),
            len(pairs)]


def exploratory(results, arm, family, claims, label):
    """claims (CLAIMS' tuples) tested on this study's records as study_results tests its own
    (test_family: the same tests, Holm within this family), each labelled and with its pairs'
    count."""
    rows = test_family(results['runs'], arm, family, claims)
    return [dict(row, label=label, below=pairs_below(results, arm, row)) for row in rows]


def beyond_model(claim, n_layer):
    """Whether a claim reads a layer the study's model does not have (a per-layer claim of a deeper
    plan)."""
    measure = claim[3]
    return measure.startswith('weight_l') and int(measure[len('weight_l'):]) > n_layer


def answerable(claim, results):
    """Whether the study trained both sides of a claim (a later set's claim on a variant or an arm
    this study lacks is not one its records answer; one on a measure they lack is, as not
    measured)."""
    return all(tested(results['runs'], arm, group)
               for group in (claim[4], claim[6]) for arm in arms_of(results)[:1])


def measurable(claim, results):
    """Whether any record holds the claim's measure (a measure of the whole study always)."""
    return claim[3] in STUDY_MEASURES or any(measured(r, claim[3]) is not None
                                             for r in results['runs'])


def other_claims(results):
    """Every claim of another registered set (study_results.CLAIM_SETS) whose test neither this
    study's set nor loss_claims holds and that its records answer (answerable), tested on this
    study's records in the arms both sets cover, each under the first set that registered it: one
    exploratory family per (set, arm)."""
    own = claim_set_of(results)
    seen = {signature(c) for c in claims_of(results) + loss_tests(results)}
    names = list(CLAIM_SETS) + ([own] if own not in CLAIM_SETS else [])  # a custom set: last
    out = []
    for other, (claims, arms) in CLAIM_SETS.items():
        extra = []
        for c in claims:
            if (other != own and signature(c) not in seen and answerable(c, results)
                    and not beyond_model(c, results['layers'])):
                seen.add(signature(c))
                extra.append(c)
        if not any(measurable(c, results) for c in extra):  # a set of measures made after them
            continue
        sealed = 'sealed ' if own in SEALED_SETS else ''
        label = (f"registered in {other}, left out of {own}'s {sealed}set; exploratory"
                 if names.index(other) < names.index(own)
                 else f"registered in {other}, after {own}'s runs; exploratory")
        for arm in (a for a in arms_of(results) if a in arms):
            out += exploratory(results, arm, 'other', extra, label)
    return out


def loss_tests(results, arm='kd'):
    """The held-out loss beside each loss claim of the study's set (the kd arm's loss is the KD
    training loss; the ce arm's is the held-out one already), and gated against affine (no claim of
    the paper: two-sided) on both."""
    claims = [('gated_affine_loss', 'loss', 'gated against affine (no claim of the paper)', 'loss',
               GATED, '!=', AFFINE)]
    if arm == 'ce':
        return claims
    return [(f"{c[0]}_val", 'loss', f"{c[2]}, held-out loss", 'val_loss', *c[4:])
            for c in claims_of(results) if c[3] == 'loss'] + claims + [
        ('gated_affine_val', 'loss', 'gated against affine, held-out loss (no claim of the paper)',
         'val_loss', GATED, '!=', AFFINE)]


def loss_claims(results):
    """loss_tests in each arm, less those the study's own set tests (v3's): one exploratory family
    per arm."""
    own = {signature(c) for c in claims_of(results)}
    out = []
    for arm in arms_of(results):
        tests = [c for c in loss_tests(results, arm) if signature(c) not in own]
        out += exploratory(results, arm, 'loss', tests, 'exploratory') if tests else []
    return out


def layer_values(runs, field):
    """Per layer, the mean over the runs of a per-layer list (None where a run lacks it)."""
    lists = [r.get(field) for r in runs]
    if not lists or any(x is None for x in lists):
        return None
    return [statistics.fmean(values) for values in zip(*lists)]


def part_test(a, b, get):
    """(p, [k, n] pairs where a is below b, or None unpaired) of a against b on get, by
    study_results.compare's test (matched pairs by sign flips, else permutations within
    teachers)."""
    if min(len(a), len(b)) < sig.MIN_SEEDS:
        return None, None
    pairs = matched_pairs(a, b)
    below = [sum(get(x) < get(y) for x, y in pairs), len(pairs)] if pairs else None
    return compare(a, b, 'share', '<', 1, get=get)['p'], below


def first_token_pairs(results):
    """The (low, high) pairs the study's first-token claims compare, in their order."""
    pairs = []
    for c in claims_of(results):
        if c[3] in FIRST_TOKEN_MEASURES and (c[4], c[6]) not in pairs:
            pairs.append((c[4], c[6]))
    return pairs


def where_from(results):
    """Per arm and first-token comparison (low, high): per layer, each side's raw weight, share, row
    total and null mass (means over seeds); softmax's Sink_1 per layer and the layers that hold its
    sink (sink_layers); the share of the raw-weight difference (summed over layers) from those
    layers and from the rest; and, in each part, the share comparison by the paired sign-flip test
    (exploratory)."""
    out = []
    for arm in arms_of(results):
        layers, rates = sink_layers(results['runs'], arm)
        softmax_weight = layer_values(tested(results['runs'], arm, SOFTMAX), 'first_token_weight')
        for low, high in first_token_pairs(results):
            a, b = tested(results['runs'], arm, low), tested(results['runs'], arm, high)
            if not a or not b:
                continue
            sides = {name: [layer_values(runs, field) for runs in (a, b)] for name,
                     field in LAYER_FIELDS.items()}
            n_layer = len(sides['weight'][0])
            rest = [k for k in range(1, n_layer + 1) if k not in layers]
            gap = [x - y for x, y in zip(*sides['weight'])]
            parts = []
            for part in (layers, rest):
                p, below = part_test(a, b, share_in(part)) if part else (None, None)
                parts.append(dict(layers=part,
                                  gap_fraction=(sum(gap[k - 1] for k in part) / sum(gap)
                                                if part and sum(gap) else None),
                                  share=[statistics.fmean(share_in(part)(r) for r in runs)
                                         for runs in (a, b)]
                                  if part else None, share_p=p, share_below=below))
            out.append(dict(arm=arm, low=low, high=high, seeds=[len(a), len(b)], sink_layers=layers,
                            softmax_sink_rate=rates, softmax_weight=softmax_weight, gap=gap,
                            parts=parts, **sides))
    return out


def value_range(values):
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if values else None


def payoff_range(results):
    """Per arm and variant, over its seeds: the W8A8 loss ratio, the attention output's kurtosis and
    the residual stream's max |x| (each run's largest layer; Bondarenko et al.'s measures,
    docs/analysis.md), and the loss ratio of each narrower format the study's primary family tests
    (v3's W8A4); whether W8A8 moves any run's loss by more than PAYOFF_FLOOR, and how far each
    narrower format moves it (where none leaves the floor, the payoff cannot be tested here)."""
    narrower = [m for m in PAYOFF_CANDIDATES
                if any(c['measure'] == m and c['family'] == 'primary' for c in results['claims'])]
    out = []
    for arm in arms_of(results):
        rows = {}
        for r in results['runs']:
            if r['arm'] == arm:
                rows.setdefault(r['variant'], []).append(r)
        ranges = {v: dict(
            w8a8=value_range(r['end']['w8a8']['ratio'] for r in runs),
            kurtosis=value_range(max(r['attention_kurtosis']) for r in runs
                                 if r.get('attention_kurtosis')),
            residual_max=value_range(max(r['residual_max_abs']) for r in runs
                                     if r.get('residual_max_abs')),
            **{m: value_range(MEASURES[m][1](r) for r in runs) for m in narrower})
            for v, runs in rows.items()}
        moved = max(abs(r['end']['w8a8']['ratio'] - 1) for runs in rows.values() for r in runs)
        out.append(dict(arm=arm, variants=ranges, largest_w8a8_change=moved,
                        at_floor=moved <= PAYOFF_FLOOR,
                        narrower={m: [min(x[m][0] for x in ranges.values()) - 1,
                                      max(x[m][1] for x in ranges.values()) - 1]
                                  for m in narrower}))
    return out


def teachers(results):
    """The teachers' own first-token weight per layer and held-out loss, beside the kd softmax
    students' (means over seeds): whether the students' sink is their teachers' or grew in them."""
    runs = {r['name']: r for r in results['runs']}
    own = [runs[name] for name in results['teachers'] if name in runs]
    students = tested(results['runs'], 'kd', SOFTMAX)
    if not own or not students:
        return None
    return dict(teachers=[dict(name=r['name'], first_token_weight=r['first_token_weight'],
                               val_loss=r['val_loss'])
                          for r in own],
                students=dict(seeds=len(students),
                              first_token_weight=layer_values(students, 'first_token_weight'),
                              val_loss=statistics.fmean(r['val_loss'] for r in students),
                              largest=[max(r['first_token_weight']) for r in students]))


def reading(results):
    """Everything above for a study's results (results.json's runs, claims and claim_set): its
    'reading'."""
    return dict(other_claims=other_claims(results), loss_claims=loss_claims(results),
                where_from=where_from(results),
                payoff=payoff_range(results), teachers=teachers(results))
