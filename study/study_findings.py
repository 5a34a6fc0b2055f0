"""
The sink study's findings at a glance (issue 63), generated from the committed results, for every
study alike: one table of what holds at this scale (a row per claim of the paper and per reading a
study added, a column per study: every docs/sink_study*/results.json, so a study that finishes is
one more column; each cell its verdict and Holm-adjusted p), where each effect comes from, and the
words that rules make from the records: what goes against the paper (with its pairs), a loss claim
that holds on one loss only, every variant's size, what an earlier study tested that a later one
does not carry, and the records whose first launch cannot be shown. Its two figures: where a row's
weight goes, per layer and variant; every claim's standardised difference. README.md's block
(study_blocks) and the top of each report (study_results.report_lines) are these;
tests/test_findings.py recomputes them from the records with code of its own.
"""
import datetime
import glob
import json
import math
import os
import re
import statistics

from study import significance as sig
from study.study_results import (AFFINE, CLAIM_SETS, GATED, MEASURE_NAMES, MEASURE_WORDS,
                                 MEASURES, PAPER_SCALE, PAYOFF_FLOOR, ROOT, SINK, SOFTMAX,
                                 STUDY_MEASURES, layers_words, matched_pairs, measured,
                                 rows_not_share, sink_layers, tested, variant_sizes)
from lmkit.probes import layer_mean

FIGURE_4 = ((AFFINE, '<', SINK), (SINK, '<', SOFTMAX))
LOSSES = ((AFFINE, '<', SOFTMAX), (AFFINE, '<', SINK))
# (label, measure, comparisons): the paper's claims and the readings the studies added, a row per
# comparison, in the order a reader asks them (docs/analysis.md, "The findings at a glance")
READINGS = (
    ("Figure 4, raw weight", 'weight', FIGURE_4),
    ("Figure 4, in softmax's sink layers (ours)", 'share_sink', FIGURE_4),
    ("Figure 4, first token or null (v1's)", 'first_or_null', FIGURE_4),
    ("Figure 3, row-total spread", 'row_spread', ((AFFINE, '>', SINK),)),
    ("Figure 6, entropy", 'entropy', ((AFFINE, '>', SINK), (AFFINE, '>', SOFTMAX))),
    ("Figures 7 and 10, KD loss", 'loss', LOSSES),
    ("held-out loss (ours)", 'val_loss', LOSSES),
    ("Table 5, spikes", 'spikes9', ((AFFINE, '<', SOFTMAX),)),
    ("the payoff, W8A8", 'w8a8', LOSSES),
    ("the payoff, W8A4", 'ratio_w8a4', LOSSES),
    ("gated against affine, KD loss", 'loss', ((GATED, '!=', AFFINE),)),
    ("gated against affine, held-out loss", 'val_loss', ((GATED, '!=', AFFINE),)),
)
HELD_OUT = ('val_loss', 'heldout')  # the held-out losses beside the KD training loss ('loss')
# each per-layer list a measure is the mean over layers of (where each effect comes from)
LAYER_LISTS = dict(weight=lambda r: r['first_token_weight'], share=lambda r: r['first_token_share'],
                   first_or_null=lambda r: r['first_or_null'], entropy=lambda r: r['entropy'],
                   row_spread=lambda r: r['end']['row_total_std'])


def study_name(results):
    return results.get('claim_set', 'v1')


def committed_studies(root=ROOT):
    """Every committed study's results (docs/sink_study*/results.json), in CLAIM_SETS' order (v1,
    v2, v3, v3_gpu, v4): a study whose results.json appears is one more column."""
    found = []
    for path in glob.glob(os.path.join(root, 'docs', 'sink_study*', 'results.json')):
        with open(path) as f:
            found.append(json.load(f))
    names = list(CLAIM_SETS)
    return sorted(found, key=lambda r: names.index(study_name(r)) if study_name(r) in names
                  else len(names))


def test_of(row):
    """What a claim tests, whatever its id, family or source: (measure, low, direction, high)."""
    return row['measure'], row['low'], row['direction'], row['high']


def bare(source):
    """A claim's source less whose reading it is: 'Figure 4 (the paper's)' -> 'Figure 4'."""
    return re.sub(r"\s*\((the paper's|our reading[^()]*|[^()]*'s reading|no claim of the paper)\)",
                  '', source)


def table_rows(columns):
    """The table's rows: READINGS, a row per comparison (the label on its first), then every primary
    claim of a column's study and arm that none of them tests, in the columns' order."""
    rows = [dict(label='' if i else label, measure=measure, low=low, direction=direction, high=high)
            for label, measure, tests in READINGS for i, (low, direction, high) in enumerate(tests)]
    seen = {test_of(r) for r in rows}
    extra = [c for results, arm in columns for c in results['claims']
             if c['arm'] == arm and c['family'] == 'primary' and test_of(c) not in seen]
    measures = {}  # a source's measures: its label names the measure where it has several
    for c in extra:
        measures.setdefault(c['source'], set()).add(c['measure'])
    for c in extra:
        if test_of(c) in seen:
            continue
        label = bare(c['source']) + (f": {MEASURE_WORDS.get(c['measure'], c['measure'])}"
                                     if len(measures[c['source']]) > 1 else '')
        seen.add(test_of(c))
        rows.append(dict(label='' if label in (r['label'] for r in rows) else label,
                         **dict(zip(('measure', 'low', 'direction', 'high'), test_of(c)))))
    return rows


def every_result(results, arm):
    """[(result, its family)] of the arm: the study's own claims, then the reading's tests
    ('exploratory': tested after the runs, study_reading)."""
    reading = results.get('reading') or {}
    return [(r, r['family']) for r in results['claims'] if r['arm'] == arm] + [
        (r, 'exploratory') for r in reading.get('other_claims', []) + reading.get('loss_claims', [])
        if r['arm'] == arm]


def finding(results, arm, row):
    """(the study's result for the row's test in an arm, its family), its own claim first, else the
    reading's test of it; (None, None) where neither."""
    return next(((r, family) for r, family in every_result(results, arm)
                 if test_of(r) == test_of(row)), (None, None))


def word(found):
    """A result's verdict word: supported, contradicted, not decided, 'gated lower', ..."""
    return found['verdict'].split(' (')[0]


def decided(found):
    return found is not None and found.get('p_holm') is not None


def cell(found, family):
    """A table cell: the verdict and its Holm-adjusted p; the word bold in the primary family,
    plain in the secondary, italic where exploratory; 'not tested' where the study has no test."""
    if found is None:
        return 'not tested'
    if not decided(found):
        return word(found)
    text = {'primary': '**{}**', 'exploratory': '_{}_'}.get(family, '{}').format(word(found))
    return f"{text} {found['p_holm']:.2g}"


def paired(results, arm):
    return any(str(c.get('test', '')).startswith('exact sign-flip') for c in results['claims']
               if c['arm'] == arm)


def seeds_of(results, arm):
    """The most seeds a side of the arm's claims holds (a claim on fewer: a measure some lack)."""
    return max((min(c['n']) for c in results['claims'] if c['arm'] == arm), default=0)


def column_head(results, arm, link=True):
    name = study_name(results)
    head = f"[{name}]({results['report_dir']}/report.md)" if link else name
    unit = 'pairs' if paired(results, arm) else 'seeds'
    return f"{head}{'' if arm == 'kd' else f' {arm}'}: {seeds_of(results, arm)} {unit}"


def findings_table(columns, where, links=True):
    """The table: the reading, what the paper says, a cell per (results, arm) column, and where the
    effect comes from in the study and arm `where` (a README's newest study, a report's own)."""
    rows = table_rows(columns)
    lines = ['| reading | the paper says | ' + ' | '.join(
        column_head(results, arm, links) for results, arm in columns) + ' | where it comes from |',
             '|---|---|' + '---|' * len(columns) + '---|']
    before = None
    for row in rows:
        says = ('no claim (two-sided)' if row['direction'] == '!='
                else f"{row['low']} {row['direction']} {row['high']}")
        cells = [cell(*finding(results, arm, row)) for results, arm in columns]
        phrase = where_phrase(*where, row)
        lines.append(f"| {row['label']} | {says} | {' | '.join(cells)} | "
                     f"{'″' if phrase == before else phrase} |")
        before = phrase
    return lines

# -----------------------------------------------------------------------------
# Where each effect comes from: one phrase per row, by the row's measure


def groups(results, arm, row):
    return [tested(results['runs'], arm, v) for v in (row['low'], row['high'])]


def side_mean(runs, get):
    values = [v for v in (measured(r, None, get) for r in runs) if v is not None]
    return statistics.fmean(values) if values else None


def layer_split(results, arm, row):
    """[(layers, their share of the difference summed over layers)] for softmax's sink layers and
    the rest (study_results.sink_layers), for a measure that is a mean over layers; None where the
    measure has no per-layer list, a side has no runs, or the sides do not differ."""
    get = LAYER_LISTS.get(row['measure'])
    a, b = groups(results, arm, row)
    if get is None or not a or not b or any(measured(r, None, get) is None for r in a + b):
        return None
    gap = [statistics.fmean(x) - statistics.fmean(y)
           for x, y in zip(zip(*map(get, a)), zip(*map(get, b)))]
    layers, _ = sink_layers(results['runs'], arm)
    parts = [layers, [k for k in range(1, len(gap) + 1) if k not in layers]]
    if not sum(gap):
        return None
    return [(part, sum(gap[k - 1] for k in part) / sum(gap)) for part in parts if part]


def layers_phrase(results, arm, row):
    split = layer_split(results, arm, row)
    if split is None:
        return None
    layers, fraction = max(split, key=lambda part: part[1])
    sinks, _ = sink_layers(results['runs'], arm)
    named = lambda part: layers_words(part) + (" (softmax's sink)" if part == sinks else '')
    if min(share for _, share in split) < 0:  # the parts go opposite ways: no part's percentage
        return f"{named(layers)}; {layers_words(min(split, key=lambda p: p[1])[0])} the other way"
    phrase = f"{fraction:.0%} in {named(layers)}"
    w = next((w for w in (results.get('reading') or {}).get('where_from', [])
              if (w['arm'], w['low'], w['high']) == (arm, row['low'], row['high'])), None)
    part = w and next((p for p in w['parts'] if p['layers'] == layers), None)
    if row['measure'] == 'weight' and part and rows_not_share(w, part):
        phrase += ', from row totals'
    return phrase


def payoff_phrase(results, arm, measure):
    """How far a quantized format moves the arm's runs' losses: within PAYOFF_FLOOR (nothing to
    remove) or its range."""
    ratios = [v for v in (measured(r, measure) for r in results['runs'] if r['arm'] == arm)
              if v is not None]
    if not ratios:
        return None
    name = MEASURE_WORDS[measure]
    moved = max(abs(v - 1) for v in ratios)
    if moved <= PAYOFF_FLOOR:
        return f"{name} moves no loss by {PAYOFF_FLOOR:.0%} (at most {moved:.2%})"
    return f"{name} costs each run {min(ratios) - 1:.1%} to {max(ratios) - 1:.1%}"


def relative(found):
    """The difference over the high side's mean, as a signed percentage."""
    return f"{found['difference'] / found['mean'][1]:+.2%} of {found['high']}'s"


def spikes_phrase(results, arm, row):
    a, b = groups(results, arm, row)
    after = [side_mean(runs, MEASURES['spikes9_after'][1]) for runs in (a, b)]
    counts = [side_mean(runs, MEASURES['spikes9'][1]) for runs in (a, b)]
    phrase = f"{counts[0]:.1f} against {counts[1]:.1f}"
    return phrase + (f"; after the warm-up {after[0]:.1f} against {after[1]:.1f}"
                     if None not in after else '')


def where_phrase(results, arm, row):
    """Where a row's effect comes from, in the study and arm given (its own result: '—' where it has
    none): the layers (a first-token or per-layer measure), the null mass (first token or null), the
    sink layers alone (their share), the relative size (losses), how far the format moves the loss
    (the payoff); two variants of unequal size (a two-sided row) name their difference."""
    found, _ = finding(results, arm, row)
    if not decided(found):
        return '—'
    a, b = groups(results, arm, row)
    measure = row['measure']
    if measure == 'first_or_null':
        nulls = [side_mean(runs, lambda r: layer_mean(r['null_mass'])) for runs in (a, b)]
        phrase = f"null mass: {row['low']} {nulls[0]:.2f}, {row['high']} {nulls[1]:.2f}"
    elif measure == 'share_sink':
        phrase = f"{layers_words(sink_layers(results['runs'], arm)[0])} alone"
    elif measure in ('loss', *HELD_OUT):
        phrase = relative(found)
    elif measure == 'spikes9':
        phrase = spikes_phrase(results, arm, row)
    elif measure == 'w8a8' or measure.startswith('ratio_'):
        phrase = payoff_phrase(results, arm, measure)
    else:
        phrase = layers_phrase(results, arm, row)
    phrase = phrase or f"{row['low']} {found['mean'][0]:.3g}, {row['high']} {found['mean'][1]:.3g}"
    size = size_difference(results, row['low'], row['high'])
    if row['direction'] == '!=' and size:
        phrase += f"; {size}"
    return phrase

# -----------------------------------------------------------------------------
# The variants' sizes


def size_difference(results, low, high, counts=None):
    """'gated +63,488 parameters (+7.6%)': the larger of two variants (a group variant@arm: its
    variant) and by how much; '' where they are of one size or the records hold no settings."""
    counts = variant_sizes(results) if counts is None else counts
    low, high = low.partition('@')[0], high.partition('@')[0]
    if low not in counts or high not in counts or counts[low] == counts[high]:
        return ''
    big, small = sorted((low, high), key=counts.get, reverse=True)
    extra = counts[big] - counts[small]
    return f"{big} +{extra:,} parameters ({100 * extra / counts[small]:+.2g}%)"


def sizes_words(results):
    """Each comparison of the study (its claims and its reading's) between variants of unequal size,
    with the difference (every variant's count: in_words' students); where the records hold no
    settings (v1's), that the sizes cannot be counted from them."""
    counts = variant_sizes(results)
    if not counts:
        return ["The records hold no model settings: the variants' sizes cannot be counted from "
                "them."]
    pairs = []
    for c, _ in results_in(results, 'kd') + results_in(results, 'ce'):
        pair = (c['low'].partition('@')[0], c['high'].partition('@')[0])
        if pair not in pairs and pair[::-1] not in pairs:
            pairs.append(pair)
    unequal = [f"{low} against {high}: {size_difference(results, low, high, counts)}"
               for low, high in pairs if size_difference(results, low, high, counts)]
    return [f"Its comparisons between variants of unequal size (model.py at their runs' "
            f"settings): {'; '.join(unequal)}."] if unequal else []


# -----------------------------------------------------------------------------
# The words that rules make: against the paper, one loss and not the other, what is not carried,
# first launches, what this scale cannot test


def against(found):
    """Whether a result's point estimate goes against its claim's direction, decided or not."""
    return (found['direction'] in '<>' and found.get('difference') is not None
            and (found['difference'] > 0 if found['direction'] == '<' else found['difference'] < 0))


def pairs_against(results, arm, found):
    """(pairs whose difference goes against the claim, pairs) of a result's matched pairs; None
    where its sides are not matched pairs (v1)."""
    measure = found['measure']
    get = (STUDY_MEASURES[measure](results['runs'], arm) if measure in STUDY_MEASURES
           else MEASURES[measure][1])
    a, b = ([r for r in runs if measured(r, measure, get) is not None]
            for runs in groups(results, arm, found))
    pairs = matched_pairs(a, b)
    if not pairs:
        return None
    wrong = [(get(x) - get(y)) * (1 if found['direction'] == '<' else -1) > 0 for x, y in pairs]
    return sum(wrong), len(wrong)


def against_words(results, arm, found, label=None, family=None):
    """One comparison against the paper's direction in words, with its pairs, difference, interval,
    verdict and family (label: a lead instead of its source, and the interval left out)."""
    side = 'above' if found['direction'] == '<' else 'below'
    counted = pairs_against(results, arm, found)
    where = (f"in {counted[0]} of {counted[1]} pairs" if counted else
             f"by its mean over {found['n'][0]} seeds against {found['n'][1]}")
    lo, hi = found['interval']
    p = f", p = {found['p_holm']:.2g}" if decided(found) else ''
    if label:
        return (f"{label} {found['low']} is {side} {found['high']} {where} "
                f"({found['difference']:+.2g}{p})")
    return (f"{bare(found['source'])}: {found['low']} is {side} {found['high']} {where} "
            f"(difference {found['difference']:+.2g}, 95% interval [{lo:.2g}, {hi:.2g}]; "
            f"{word(found)}{p}{f'; {family}' if family else ''})")


def results_in(results, arm):
    """Every result of the arm with a test (every_result but the control's and the unmeasured)."""
    return [(r, family) for r, family in every_result(results, arm)
            if r['p'] is not None and family != 'control']


def against_lines(results, arm):
    """A bullet for every result of the arm (primary, secondary, exploratory) whose point estimate
    goes against the paper's direction."""
    return [f"- {against_words(results, arm, r, family=family)}."
            for r, family in results_in(results, arm) if against(r)]


def holds(found):
    """Whether a result holds: its claim supported, or a two-sided comparison decided."""
    return decided(found) and found['p_holm'] < sig.ALPHA and word(found) != 'contradicted'


def loss_words(results, arm):
    """Where a comparison holds on the KD training loss and not on a held-out loss, or the other way
    round: a clause each, naming the losses it holds on and those it does not."""
    found = {test_of(r): r for r, _ in results_in(results, arm)}
    loss = lambda r: (f"the {MEASURE_WORDS[r['measure']]} ({word(r)}, p = {r['p_holm']:.2g}; "
                      f"{relative(r)})")
    clauses = []
    for (measure, low, direction, high), kd in found.items():
        same = [kd] + [found[key] for key in ((h, low, direction, high) for h in HELD_OUT)
                       if measure == 'loss' and key in found]
        on, off = [r for r in same if holds(r)], [r for r in same if not holds(r)]
        if len(same) > 1 and on and off:
            clauses.append(f"{low} {direction} {high} holds on {listing(map(loss, on))} but not on "
                           f"{listing(map(loss, off), 'or')}")
    return clauses


def tallied(rows):
    """'6 supported, 4 contradicted, 12 not decided': the verdict words of results, counted."""
    words = [word(r) for r in rows]
    order = ['supported', 'contradicted', 'not decided']
    return ', '.join(f"{words.count(w)} {w}" for w in sorted(
        set(words), key=lambda w: (order.index(w) if w in order else len(order), w)))


def arm_words(other, arm):
    """An arm of an earlier study in a phrase: its claims' verdicts (the control: its
    comparisons')."""
    rows = [c for c in other['claims'] if c['arm'] == arm]
    name = study_name(other)
    if arm != 'control':
        return f"{name}'s {arm} arm ({len(rows)} claims: {tallied(rows)})"
    ps = [r['p_holm'] for r in rows if r.get('p_holm') is not None]
    span = f", p = {min(ps):.2g}–{max(ps):.2g}" if ps else ''
    return f"{name}'s control ({len(rows)} comparisons: {tallied(rows)}{span})"


def carried_words(results, earlier):
    """What this study carries of each earlier one: how many of its claims, in the arms both
    trained, this study's set tests, and by name each claim it does not carry, each arm it did not
    train (the control too) and each variant."""
    own = {(c['arm'], test_of(c)) for c in results['claims']}
    arms = {r['arm'] for r in results['runs']}
    variants = {r['variant'] for r in results['runs']}
    out = []
    for other in earlier:
        shared = [c for c in other['claims'] if c['family'] != 'control' and c['arm'] in arms]
        missing = [c for c in shared if (c['arm'], test_of(c)) not in own]
        left = [f"{study_name(other)}'s {c['source']} ({row_claim(c)})" for c in missing]
        left += [arm_words(other, arm) for arm in dict.fromkeys(c['arm'] for c in other['claims'])
                 if arm not in arms]
        claimed = {side for c in other['claims'] for side in (c['low'], c['high'])}
        left += [f"{study_name(other)}'s variant {v}" + ('' if v in claimed else ' (no claim)')
                 for v in dict.fromkeys(r['variant'] for r in other['runs'] if r['arm'] in arms)
                 if v not in variants]
        out.append(f"{study_name(results)} carries {len(shared) - len(missing)} of "
                   f"{study_name(other)}'s {len(shared)} claims in the arms both trained"
                   + (f"; it does not carry {'; '.join(left)}" if left else
                      f", and every arm and variant {study_name(other)} trained") + '.')
    return out


def wall_seconds(r):
    return (datetime.datetime.fromisoformat(r['finished'])
            - datetime.datetime.fromisoformat(r['started'])).total_seconds()


def first_launch_words(results):
    """The records whose first launch their start cannot show: a record without first_started
    (before v4) holds its last launch's start, and one whose steps took longer than its wall time,
    started to finished, was resumed."""
    timed = [r for r in results['runs'] if r.get('started') and r.get('finished')]
    kept = sum(bool(r.get('first_started')) for r in timed)
    resumed = [r['name'] for r in timed if not r.get('first_started')
               and r['seconds'] > wall_seconds(r)]
    words = ([f"{kept} of {len(timed)} records keep their first launch's start "
              "(first_started)."] if kept else [])
    if resumed:
        words.append(f"{len(resumed)} records trained longer than their wall time from started to "
                     f"finished, so they were resumed, and their started is their last launch's: "
                     f"for {', '.join(resumed)} the record shows that the last launch came after "
                     "the seal, not the first.")
    return words


def cannot_test_words(results, arm='kd'):
    """What this scale cannot test: the paper's scale, a sink beyond a few layers, the W8A8
    payoff."""
    counts = variant_sizes(results)
    students = f"{counts[SOFTMAX]:,}-parameter students" if SOFTMAX in counts else 'students'
    parts = [f"the paper's scale ({students}, {results['recipe']['tokens'] / 1e6:.1f}M tokens a "
             f"run; {PAPER_SCALE})"]
    if tested(results['runs'], arm, SOFTMAX):
        layers, _ = sink_layers(results['runs'], arm)
        if len(layers) * 2 < results['layers']:
            parts.append(f"a sink in more than {len(layers)} of {results['layers']} layers")
    w8a8 = payoff_phrase(results, arm, 'w8a8')
    if w8a8 and 'moves no' in w8a8:
        parts.append(f"W8A8's payoff, as {w8a8}")
    return f"This scale cannot test {listing(parts, 'or')}."

# -----------------------------------------------------------------------------
# The sentences under a table: what holds, what goes against the paper, what this scale cannot test


def row_claim(row):
    return f"{row['low']} {row['direction']} {row['high']}"


def verdict_of(results, arm, row):
    found, _ = finding(results, arm, row)
    return word(found) if decided(found) else None


def listing(items, conjunction='and'):
    """'a, b and c'."""
    items = list(items)
    return (f"{', '.join(items[:-1])} {conjunction} {items[-1]}" if len(items) > 1
            else ''.join(items))


def holds_sentence(subject, earlier, rows):
    """The readings the subject column (results, arm) supports (its rows grouped by reading), and
    each earlier column that contradicted one of them."""
    results, arm = subject
    groups_of, label, opposite = {}, '', []
    for row in rows:
        label = row['label'] or label
        if row['direction'] == '!=' or verdict_of(results, arm, row) != 'supported':
            continue
        groups_of.setdefault(label, []).append(row_claim(row))
        opposite += [f"{study_name(other)} had contradicted {row_claim(row)} on {label}"
                     for other, other_arm in earlier
                     if verdict_of(other, other_arm, row) == 'contradicted']
    if not groups_of:
        return ''
    return (f"What holds in {study_name(results)}: "
            + '; '.join(f"{g}, {listing(claims)}" for g, claims in groups_of.items())
            + (f"; {listing(opposite)}" if opposite else '') + '.')


def against_sentence(subject, rows):
    """The subject column's rows whose point estimate goes against the paper: the contradicted by
    name, the undecided of the primary family with their pairs, and how many more its report
    names."""
    results, arm = subject
    found = [(row, f, family) for row in rows for f, family in [finding(results, arm, row)]
             if f and decided(f) and against(f)]
    if not found:
        return ''
    contradicted = {}
    for row, f, _ in found:
        if word(f) == 'contradicted':
            contradicted.setdefault(bare(f['source']), []).append(row_claim(row))
    undecided = [against_words(results, arm, f, f"on {MEASURE_WORDS.get(f['measure'])}")
                 for row, f, family in found if word(f) != 'contradicted' and family == 'primary']
    more = sum(word(f) != 'contradicted' and family != 'primary' for _, f, family in found)
    named = listing(f"{source} ({'; '.join(claims)})" for source, claims in contradicted.items())
    return ("Against the paper: " + '; '.join(
        ([f"{named} {'are' if sum(map(len, contradicted.values())) > 1 else 'is'} contradicted"]
         if contradicted else [])
        + ([f"pointing the other way, not decided: {'; '.join(undecided)}"] if undecided else [])
        + ([f"{more} more outside the primary family (its report)"] if more else [])) + '.')


def size_sentence(subject, rows):
    """The subject column's two-sided rows between variants of unequal size that it decided, and
    those between variants of one size, decided or not (affine against a gate of its size)."""
    results, arm = subject
    by_pair, same_size = {}, {}
    for row in rows:
        found, _ = finding(results, arm, row)
        if row['direction'] != '!=' or not decided(found):
            continue
        if not size_difference(results, row['low'], row['high']):
            same_size.setdefault((row['low'], row['high']), {}).setdefault(word(found), []).append(
                f"{the(row['measure'])} (p = {found['p_holm']:.2g})")
        elif found['p_holm'] < sig.ALPHA:
            lower = word(found).split()[0]
            other = row['high'] if lower == row['low'] else row['low']
            counted = pairs_against(results, arm, dict(found, direction='<' if lower == row['high']
                                                       else '>'))
            pairs = f" in {counted[0]} of {counted[1]} pairs" if counted else ''
            by_pair.setdefault((lower, other), []).append(
                f"{MEASURE_WORDS[row['measure']]}{pairs}")
    counts = variant_sizes(results)
    return ' '.join([f"{lower.capitalize()} is lower than {other} on the {' and the '.join(on)}, "
                     f"and larger: {size_difference(results, lower, other)}."
                     for (lower, other), on in by_pair.items()
                     if size_difference(results, lower, other).startswith(lower)] + [
        f"{low.capitalize()} against {high}, of one size ({counts[low]:,} parameters each): "
        + '; '.join(f"{verdict} on {listing(on)}" for verdict, on in verdicts.items()) + '.'
        for (low, high), verdicts in same_size.items() if low in counts])


def the(measure):
    """A measure's words as a sentence names it: 'the KD loss', 'W8A4'."""
    return MEASURE_WORDS[measure] if measure in MEASURE_NAMES else f"the {MEASURE_WORDS[measure]}"


def sentences(columns, subject):
    """At most five sentences under the table, each made by a rule from the subject column's
    records (results, arm): what holds (and which earlier column contradicted it), what goes
    against the paper, a loss claim that holds on one loss only, a win with more parameters, what
    this scale cannot test."""
    rows = table_rows(columns)
    results, arm = subject
    loss = loss_words(results, arm)
    out = [holds_sentence(subject, columns[:columns.index(subject)], rows),
           against_sentence(subject, rows),
           ('On the loss: ' + '; '.join(loss) + '.') if loss else '',
           size_sentence(subject, rows), cannot_test_words(results, arm)]
    return [s for s in out if s]

# -----------------------------------------------------------------------------
# The README's block and a report's top


LEGEND = ("A cell: the verdict and its Holm-adjusted p, **bold** in the primary family, plain in "
          "the secondary, _italic_ tested after the runs (exploratory).")


def figure_lines(results, arm, prefix=''):
    """The two figures of an arm (study_findings.figures), where they are committed."""
    folder = os.path.join(ROOT, results['report_dir'])
    return [f"![{text}]({prefix}{name}_{arm}.png)" for name, text in (
        ('rows', f"Where a row's weight goes, per layer and variant ({arm} arm)"),
        ('claims', f"Every claim's difference, standardised ({arm} arm)"))
            if os.path.exists(os.path.join(folder, f'{name}_{arm}.png'))]


def readme_lines(studies=None):
    """README.md's block: every committed study's kd arm side by side, the sentences on the newest,
    its figures and every report."""
    studies = committed_studies() if studies is None else studies
    columns = [(results, 'kd') for results in studies if paired(results, 'kd')
               or any(c['arm'] == 'kd' for c in results['claims'])]
    newest = columns[-1][0]
    counts = variant_sizes(newest)
    lines = [LEGEND + f" Each study's kd arm. {study_name(newest)}'s parameters: "
             + ', '.join(f"{v} {n:,}" for v, n in counts.items()) + '.' if counts else LEGEND]
    lines += ['', *findings_table(columns, columns[-1]), '']
    lines += [f"- {s}" for s in sentences(columns, columns[-1])]
    lines += ['', *figure_lines(newest, 'kd', newest['report_dir'] + '/'), '']
    return lines + ['Every claim with its numbers, and the reading: ' + ', '.join(
        f"[{study_name(r)}]({r['report_dir']}/report.md)" for r in studies) + '.']


def earlier_studies(results):
    """The committed studies before this one (CLAIM_SETS' order; a custom plan: all of them)."""
    names = list(CLAIM_SETS)
    name = study_name(results)
    return [r for r in committed_studies() if name not in names
            or study_name(r) in names and names.index(study_name(r)) < names.index(name)]


def report_top(results):
    """A report's opening: its table (a column per arm with claims, kd first), its sentences and its
    figures."""
    arms = [a for a in ('kd', 'ce') if any(c['arm'] == a for c in results['claims'])]
    columns = [(results, arm) for arm in arms]
    lines = ['## At a glance', '', LEGEND, '', *findings_table(columns, columns[0], links=False),
             '', *[f"- {s}" for s in sentences(columns, columns[0])], '']
    for arm in arms:
        lines += [*figure_lines(results, arm), '']
    return lines


def report_words(results, earlier=None):
    """The report's bullets on what the study is, after what it found: every variant's size, what it
    carries of the studies before it, the records whose first launch it cannot show."""
    earlier = earlier_studies(results) if earlier is None else earlier
    words = [*sizes_words(results), *carried_words(results, earlier),
             *first_launch_words(results)]
    return [f"- {w}" for w in words] + ['']


def against_section(results):
    """Per arm, every comparison whose point estimate goes against the paper's direction."""
    lines = []
    for arm in ('kd', 'ce'):
        if against_lines(results, arm):
            lines += [f"## Against the paper's direction ({arm} arm), decided or not", '',
                      *against_lines(results, arm), '']
    return lines


# -----------------------------------------------------------------------------
# The figures


COLOURS = dict(supported='tab:green', contradicted='tab:red')


def rows_figure(results, arm, plt):
    """Where a row's weight goes, per layer and variant (means over seeds): the first token, the
    rest of the keys, and the null (sink's null logit, affine's missing mass: 1 - the row's
    total)."""
    by = {}
    for r in results['runs']:
        if r['arm'] == arm and r['seed'] != 0 and r.get('row_sum') and r.get('null_mass'):
            by.setdefault(r['variant'], []).append(r)
    if not by:
        return None
    fig, axes = plt.subplots(1, len(by), figsize=(3.2 * len(by), 3.6), sharey=True, squeeze=False)
    for ax, (variant, runs) in zip(axes[0], by.items()):
        first, total, null = ([statistics.fmean(x) for x in zip(*(r[key] for r in runs))]
                              for key in ('first_token_weight', 'row_sum', 'null_mass'))
        layers = range(1, len(first) + 1)
        rest = [t - f for t, f in zip(total, first)]
        ax.bar(layers, first, color='tab:red', label='the first token')
        ax.bar(layers, rest, bottom=first, color='tab:blue', label='the other keys')
        ax.bar(layers, null, bottom=total, color='lightgrey',
               label="the null: 1 - the row's total (sink's logit, affine's missing mass)")
        ax.set(title=f"{variant} ({len(runs)} seeds)", xlabel='layer', xticks=list(layers))
    axes[0][0].set(ylabel="a row's weight, mean over queries")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc='lower center', ncol=3, fontsize=8)
    fig.suptitle(f"Where a row's weight goes ({arm} arm, means over seeds)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def standardised(found):
    """(the difference, its 95% interval) over the sides' pooled standard deviation, signed so that
    positive is the claim's direction (a two-sided comparison: low - high); None without a
    spread."""
    stds = [s for s in found['std'] if s is not None]
    scale = math.sqrt(sum(s * s for s in stds) / len(stds)) if len(stds) == 2 else 0
    if not scale or found.get('interval') is None:
        return None
    sign = -1 if found['direction'] == '<' else 1
    ends = sorted(sign * x / scale for x in found['interval'])
    return sign * found['difference'] / scale, ends


def colour(found):
    verdict = word(found)
    if found['direction'] == '!=':
        return 'tab:blue' if verdict.endswith('lower') else 'grey'
    return COLOURS.get(verdict, 'grey')


def claims_figure(results, arm, plt):
    """Every claim's difference with its 95% interval, standardised (standardised), coloured by
    verdict, the primary family, the secondary and the exploratory apart; a claim without a spread
    on either side (every seed the same) is named in its label, undrawn."""
    panels = {}
    for found, family in results_in(results, arm):
        panels.setdefault(family, []).append(found)
    if not panels:
        return None
    heights = [len(v) + 2 for v in panels.values()]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 0.22 * sum(heights) + 1), sharex=True,
                             gridspec_kw=dict(height_ratios=heights), squeeze=False)
    for ax, (family, found) in zip(axes[:, 0], panels.items()):
        for y, f in enumerate(found):
            point = standardised(f)
            if point:
                ax.errorbar(point[0], y, xerr=[[point[0] - point[1][0]], [point[1][1] - point[0]]],
                            fmt='o', color=colour(f), markersize=4, capsize=2)
        labels = [f"{bare(f['source'])}: {row_claim(f)}" for f in found]
        ax.set_yticks(range(len(found)), [  # a label two claims share names each one's measure
            label + (f", {MEASURE_WORDS.get(f['measure'], f['measure'])}"
                     if labels.count(label) > 1 else '')
            + ('' if standardised(f) else ' (no spread)') for label, f in zip(labels, found)],
            fontsize=7)
        ax.axvline(0, color='black', linewidth=0.8)
        ax.invert_yaxis()
        ax.set_title(f"{family} ({len(found)})", fontsize=9, loc='left')
    axes[-1, 0].set_xlabel("the difference and its 95% interval over the sides' pooled standard "
                           "deviation\n(> 0: as claimed; two-sided: low - high)", fontsize=8)
    handles = [plt.Line2D([], [], color=c, marker='o', linestyle='', label=text) for c, text in (
        ('tab:green', 'supported'), ('tab:red', 'contradicted'),
        ('tab:blue', 'two-sided, decided'), ('grey', 'not decided'))]
    fig.legend(handles=handles, loc='upper right', fontsize=8, ncol=4)
    fig.suptitle(f"Every claim's difference, standardised ({arm} arm)", x=0.3)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    return fig


def figures(results, out_dir):
    """rows_<arm>.png and claims_<arm>.png for every arm with records (claims: with results)."""
    from lmkit.stats import pyplot
    plt = pyplot()
    for arm in dict.fromkeys(r['arm'] for r in results['runs']):
        for name, draw in (('rows', rows_figure), ('claims', claims_figure)):
            fig = draw(results, arm, plt) if arm not in ('teacher', 'recipe') else None
            if fig is not None:
                fig.savefig(os.path.join(out_dir, f'{name}_{arm}.png'), dpi=100)
                plt.close(fig)
