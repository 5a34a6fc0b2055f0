"""The findings at a glance (issue 63, study/study_findings.py): README.md's table, its sentences
and figures, and each report's opening, recomputed here from the committed records with code of its
own: every cell (the verdict of the claim, or of the reading's test, and its Holm-adjusted p),
where each effect comes from, the pairs that go against the paper, a loss claim that holds on one
loss only, the variants' sizes by the architecture's arithmetic, what a later study does not carry,
the records whose first launch cannot be shown; and a study that finishes is one more column."""
import copy
import datetime
import json
import os
import re
import subprocess

import numpy as np
import pytest

from test_sink_study import ROOT, block, committed, every_sign_flip, group, value

STUDIES = ('sink_study', 'sink_study_v2', 'sink_study_v3', 'sink_study_v4')  # the columns, in order
FIGURE_4 = [('affine', '<', 'sink'), ('sink', '<', 'softmax')]
LOSSES = [('affine', '<', 'softmax'), ('affine', '<', 'sink')]
# the rows: (the reading, its measure, its comparisons)
ROWS = [("Figure 4, raw weight", 'weight', FIGURE_4),
        ("Figure 4, in softmax's sink layers (ours)", 'share_sink', FIGURE_4),
        ("Figure 4, first token or null (v1's)", 'first_or_null', FIGURE_4),
        ("Figure 3, row-total spread", 'row_spread', [('affine', '>', 'sink')]),
        ("Figure 6, entropy", 'entropy', [('affine', '>', 'sink'), ('affine', '>', 'softmax')]),
        ("Figures 7 and 10, KD loss", 'loss', LOSSES),
        ("held-out loss (ours)", 'val_loss', LOSSES),
        ("Table 5, spikes", 'spikes9', [('affine', '<', 'softmax')]),
        ("the payoff, W8A8", 'w8a8', LOSSES),
        ("the payoff, W8A4", 'ratio_w8a4', LOSSES),
        ("gated against affine, KD loss", 'loss', [('gated', '!=', 'affine')]),
        ("gated against affine, held-out loss", 'val_loss', [('gated', '!=', 'affine')])]
# the rows v4's primary claims add (issue 60), after the issue's
SAME_SIZE = [('affine', '!=', 'headwise_gated')]
V4_ROWS = [("affine against the head-wise gate of its size: KD loss", 'loss', SAME_SIZE),
           ("affine against the head-wise gate of its size: held-out loss on the large set",
            'heldout', SAME_SIZE),
           ("affine against the head-wise gate of its size: share in softmax's sink layers",
            'share_sink', SAME_SIZE),
           ("affine against the head-wise gate of its size: W8A4", 'ratio_w8a4', SAME_SIZE),
           ("Figures 7 and 10, held-out loss on 16x v3's tokens", 'heldout', LOSSES),
           ("Figure 4 under v1's decay rule (decay on alpha_proj)", 'weight',
            [('affine@decay', '<', 'sink')])]
PER_LAYER = dict(weight='first_token_weight', entropy='entropy')
MARK = dict(primary='**{}**', secondary='{}', exploratory='_{}_')


@pytest.fixture(scope='module')
def studies():
    return {study: committed(study) for study in STUDIES}


def readme_block():
    return block('README.md', '<!-- the findings: study_findings.readme_lines() -->',
                 '<!-- end of the findings -->')


def table(text):
    """The Markdown table of a text, as rows of cells (the header first, the rule left out)."""
    rows = [line for line in text.splitlines() if line.startswith('| ')]
    return [[cell.strip() for cell in row.strip('|').split('|')] for row in rows]


def result_for(results, arm, test):
    """(the result that tests (measure, low, direction, high) in the arm, its family): the study's
    claim, else the reading's exploratory test, else (None, None)."""
    own = [(c, c['family']) for c in results['claims'] if c['arm'] == arm]
    reading = results['reading']
    later = [(c, 'exploratory') for c in reading['other_claims'] + reading['loss_claims']
             if c['arm'] == arm]
    return next(((c, f) for c, f in own + later
                 if (c['measure'], c['low'], c['direction'], c['high']) == test), (None, None))


def sink_layers(records, arm='kd'):
    softmax = list(group(records, arm, 'softmax').values())
    rates = np.mean([r['end']['gu']['sink_rate_per_layer'] for r in softmax], axis=0)
    return [k + 1 for k, rate in enumerate(rates) if rate >= 1 / 16]


def sides(records, measure, low, high, arm='kd'):
    """{seed: value} of each side, from the records (the measures: test_sink_study.value)."""
    layers = sink_layers(records, arm)
    return [{s: v for s, r in group(records, arm, variant).items()
             if (v := value(r, measure, layers)) is not None} for variant in (low, high)]


def expected_cell(results, records, arm, test):
    """A cell from the records: the verdict word from the sign of the sides' means and the Holm-
    adjusted p below 0.05 (two-sided: the lower side), marked by the family."""
    found, family = result_for(results, arm, test)
    if found is None:
        return 'not tested'
    measure, low, direction, high = test
    try:
        a, b = sides(records, measure, low, high, arm)
    except KeyError:  # a measure made after the records
        a = b = {}
    if not a or not b:
        assert found['verdict'] == 'not measured'
        return 'not measured'
    lower = low if np.mean(list(a.values())) < np.mean(list(b.values())) else high
    p = found['p_holm']
    if direction == '!=':
        verdict = f"{lower} lower" if p < 0.05 else 'no detectable difference'
    elif p < 0.05:
        verdict = 'supported' if (lower == low) == (direction == '<') else 'contradicted'
    else:
        verdict = 'not decided'
    return f"{MARK[family].format(verdict)} {p:.2g}"


def parameters(settings, variant):
    """A student's parameters by the architecture's arithmetic (tied embeddings; q, k, v and o
    projections; a SwiGLU MLP; two RMSNorms a layer and a final one) and each variant's own: sink
    a logit per head, affine alpha_proj (n_embd x n_head), gated g_proj (n_embd x n_embd), the
    head-wise gate its g_proj (n_embd x n_head)."""
    e, layers, heads = settings['n_embd'], settings['n_layer'], settings['n_head']
    kv = settings['n_kv_head'] * e // heads
    base = (settings['vocab_size'] * e + e
            + layers * (2 * e * e + 2 * e * kv + 3 * e * settings['intermediate_size'] + 2 * e))
    own = dict(softmax=0, sink=heads, affine=e * heads, gated=e * e, headwise_gated=e * heads)
    return base + layers * own[variant.partition('@')[0]]


def paired(a, b):
    return np.array([a[s] - b[s] for s in sorted(a)])


def layers_words(layers):
    return (f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}–{layers[-1]}")


def expected_where(results, records, row):
    """Where a row's effect comes from (the newest study's kd arm), recomputed: the part of the
    layers (softmax's sink layers, the rest) holding most of a per-layer difference, the raw
    weight's noted where the share there does not differ and the rows' totals do, the same way;
    the null mass; the sink layers; the relative loss; the spikes; the payoff's moves; the
    sizes."""
    measure, low, direction, high = row
    kd = lambda v: list(group(records, 'kd', v).values())
    if measure == 'first_or_null':
        null = lambda v: np.mean([np.mean(r['null_mass']) for r in kd(v)])
        return f"null mass: {low} {null(low):.2f}, {high} {null(high):.2f}"
    if measure in PER_LAYER or measure == 'row_spread':
        get = ((lambda r: r['end']['row_total_std']) if measure == 'row_spread'
               else (lambda r: r[PER_LAYER[measure]]))
        gap = np.mean([get(r) for r in kd(low)], 0) - np.mean([get(r) for r in kd(high)], 0)
        sinks = sink_layers(records)
        parts = [p for p in (sinks, [k for k in range(1, len(gap) + 1) if k not in sinks]) if p]
        fractions = [gap[[k - 1 for k in p]].sum() / gap.sum() for p in parts]
        part = parts[int(np.argmax(fractions))]
        named = layers_words(part) + (" (softmax's sink)" if part == sinks else '')
        if min(fractions) < 0:  # the parts go opposite ways: which goes with the difference
            return f"{named}; {layers_words(parts[int(np.argmin(fractions))])} the other way"
        phrase = f"{max(fractions):.0%} in {named}"
        if measure == 'weight':
            share = lambda r: np.mean([r['first_token_share'][k - 1] for k in part])
            a, b = ({r['seed']: share(r) for r in kd(v)} for v in (low, high))
            rows = lambda v: np.mean([np.mean([r['row_sum'][k - 1] for k in part]) for r in kd(v)])
            if (every_sign_flip(paired(a, b)) >= 0.05 and max(fractions) >= 0.5
                    and (rows(low) - rows(high)) * gap[[k - 1 for k in part]].sum() > 0):
                phrase += ', from row totals'
        return phrase
    if measure == 'share_sink':
        return f"{layers_words(sink_layers(records))} alone"
    a, b = (np.mean(list(x.values())) for x in sides(records, measure, low, high))
    if measure in ('loss', 'val_loss', 'heldout'):
        phrase = f"{(a - b) / b:+.2%} of {high}'s"
        if direction == '!=' and parameters(kd(low)[0]['settings'], low) != parameters(
                kd(high)[0]['settings'], high):
            counts = {v: parameters(kd(v)[0]['settings'], v) for v in (low, high)}
            big, small = sorted(counts, key=counts.get, reverse=True)
            extra = counts[big] - counts[small]
            phrase += f"; {big} +{extra:,} parameters ({100 * extra / counts[small]:+.2g}%)"
        return phrase
    if measure == 'spikes9':
        after = [np.mean([r['spikes_after_warmup']['9'] for r in kd(v)]) for v in (low, high)]
        return f"{a:.1f} against {b:.1f}; after the warm-up {after[0]:.1f} against {after[1]:.1f}"
    ratios = [value(r, measure) for r in records if r['arm'] == 'kd']
    name = dict(w8a8='W8A8', ratio_w8a4='W8A4')[measure]
    if max(abs(x - 1) for x in ratios) <= 0.01:
        return f"{name} moves no loss by 1% (at most {max(abs(x - 1) for x in ratios):.2%})"
    return f"{name} costs each run {min(ratios) - 1:.1%} to {max(ratios) - 1:.1%}"


def test_the_readme_leads_with_the_findings_of_every_study(studies):
    """README.md's block is study_findings.readme_lines() of the committed results, and its table
    is the records': a column per study (v1's 8 seeds, v2's, v3's and v4's 12 pairs), a row per
    reading the issue names and per primary claim v4 added, each cell recomputed from the records,
    each row's source of the effect recomputed from v4's; the newest study's two figures are
    committed and shown, and every report is linked."""
    from study import study_findings
    text = readme_block()
    assert text == '\n'.join(study_findings.readme_lines())
    rows = table(text)
    assert rows[0] == ['reading', 'the paper says', '[v1](docs/sink_study/report.md): 8 seeds',
                       '[v2](docs/sink_study_v2/report.md): 12 pairs',
                       '[v3](docs/sink_study_v3/report.md): 12 pairs',
                       '[v4](docs/sink_study_v4/report.md): 12 pairs', 'where it comes from']
    expected, before = [], None
    for label, measure, tests in ROWS + V4_ROWS:
        for i, (low, direction, high) in enumerate(tests):
            test = (measure, low, direction, high)
            cells = [expected_cell(*studies[s], 'kd', test) for s in STUDIES]
            where = expected_where(*studies['sink_study_v4'], test)
            expected.append(['' if i else label, 'no claim (two-sided)' if direction == '!='
                             else f"{low} {direction} {high}", *cells,
                             '″' if where == before else where])
            before = where
    assert rows[1:] == expected
    for name in ('rows_kd.png', 'claims_kd.png'):
        assert os.path.getsize(os.path.join(ROOT, 'docs', 'sink_study_v4', name)) > 10_000
        assert f"](docs/sink_study_v4/{name})" in text
    assert all(f"]({f'docs/{s}'}/report.md)" in text.splitlines()[-1] for s in STUDIES)
    with open(os.path.join(ROOT, 'README.md')) as f:
        readme = f.read()
    section = readme.split('## What holds at this scale')[1].split('\n## ')[0]
    assert len(section.splitlines()) <= 60 and readme.index('## Quick start') < readme.index(
        '## What holds at this scale') < readme.index('## The variants')


def pairs_against(a, b, direction):
    """(pairs whose difference goes against the claim, pairs)."""
    d = paired(a, b) * (1 if direction == '<' else -1)
    return int((d > 0).sum()), len(d)


def sentences_of(lines):
    return [line[2:] for line in lines if line.startswith('- ')]


def test_the_sentences_on_v3_are_the_records(studies):
    """With v3 the newest column (the README's block before v4's last run): at most five sentences
    under the table, each one's numbers recomputed from v3's records: the readings it supports (and
    v1's contradiction of Figure 4), the contradicted and the primary comparisons whose pairs go the
    other way (W8A4: affine above softmax in 10 of 12 pairs), the loss claim that holds on the KD
    loss and not on the held-out loss, gated's win with its extra parameters, and what this scale
    cannot test."""
    from study import study_findings
    results, records = studies['sink_study_v3']
    sentences = sentences_of(study_findings.readme_lines([studies[s][0] for s in STUDIES[:3]]))
    assert len(sentences) == 5
    holds, against, loss, size, scale = sentences
    assert holds.startswith('What holds in v3: Figure 4, raw weight, affine < sink and sink < '
                            'softmax;') and holds.endswith(
        'v1 had contradicted affine < sink on Figure 4, raw weight.')
    assert against.startswith("Against the paper: Figure 4, first-token-or-null (affine < sink; "
                              "sink < softmax) and Figure 3 (affine > sink) are contradicted")
    for high in ('softmax', 'sink'):
        a, b = sides(records, 'ratio_w8a4', 'affine', high)
        k, n = pairs_against(a, b, '<')
        found, _ = result_for(results, 'kd', ('ratio_w8a4', 'affine', '<', high))
        assert (f"on W8A4 affine is above {high} in {k} of {n} pairs "
                f"({np.mean(paired(a, b)):+.2g}, p = {found['p_holm']:.2g})" in against)
        assert found['p_holm'] >= 0.05 and 'pointing the other way, not decided: on W8A4' in against
    assert (k, n) == (8, 12) and 'in 10 of 12 pairs' in against  # the count, softmax's
    rel = lambda measure: (lambda a, b: f"{np.mean(paired(a, b)) / np.mean(list(b.values())):+.2%}"
                           )(*sides(records, measure, 'affine', 'sink'))
    p = lambda m: result_for(results, 'kd', (m, 'affine', '<', 'sink'))[0]['p_holm']
    assert loss == (f"On the loss: affine < sink holds on the KD loss (supported, p = "
                    f"{p('loss'):.2g}; {rel('loss')} of sink's) but not on the held-out loss (not "
                    f"decided, p = {p('val_loss'):.2g}; {rel('val_loss')} of sink's).")
    assert size == gated_sentence(records)
    assert scale == scale_sentence(results, records)


def gated_sentence(records):
    """'Gated is lower than affine on ... pairs, and larger: ...', from the records."""
    settings = records[0]['settings']
    gated, affine = (parameters(settings, v) for v in ('gated', 'affine'))
    counts = [pairs_against(*sides(records, m, 'gated', 'affine'), '>')
              for m in ('loss', 'val_loss')]
    return (f"Gated is lower than affine on the KD loss in {counts[0][0]} of {counts[0][1]} pairs "
            f"and the held-out loss in {counts[1][0]} of {counts[1][1]} pairs, and larger: gated "
            f"+{gated - affine:,} parameters (+{100 * (gated - affine) / affine:.2g}%).")


def scale_sentence(results, records):
    """What this scale cannot test, from the records: the students' size and tokens, the sink's
    layers, how far W8A8 moves a loss."""
    moved = max(abs(value(r, 'w8a8') - 1) for r in records if r['arm'] == 'kd')
    students = parameters(records[0]['settings'], 'softmax')
    return (f"This scale cannot test the paper's scale ({students:,}-parameter students, "
            f"{results['recipe']['tokens'] / 1e6:.1f}M tokens a run; the paper's Figure 4 "
            "student: 1B parameters, 20B tokens), a sink in more than "
            f"{len(sink_layers(records))} of 4 layers or W8A8's payoff, as W8A8 moves no "
            f"loss by 1% (at most {moved:.2%}).")


def test_the_readmes_sentences_are_v4s_records(studies):
    """The README's five sentences, on v4, the newest column, each recomputed from its records: the
    readings it supports; the contradicted, and each primary comparison whose pairs go the other
    way undecided (spikes, W8A4 against sink, Figure 4 under v1's decay rule); affine < sink on the
    KD loss and on neither held-out loss; gated's win with its extra parameters, and affine against
    the head-wise gate of its size, no difference detected on any of the four measures; the
    scale."""
    results, records = studies['sink_study_v4']
    holds, against, loss, size, scale = sentences_of(readme_block().splitlines())
    cell = lambda test: expected_cell(results, records, 'kd', test)
    supported = {}
    for label, measure, tests in ROWS + V4_ROWS:
        for low, direction, high in tests:
            if direction != '!=' and 'supported' in cell((measure, low, direction, high)):
                supported.setdefault(label, []).append(f"{low} {direction} {high}")
    assert holds == ("What holds in v4: " + '; '.join(
        f"{label}, {' and '.join(claims)}" for label, claims in supported.items())
        + "; v1 had contradicted affine < sink on Figure 4, raw weight.")
    assert against.startswith(
        "Against the paper: Figure 4, first-token-or-null (affine < sink; sink < softmax), Figure "
        "3 (affine > sink) and the payoff: W8A4 (affine < softmax) are contradicted; pointing the "
        "other way, not decided: ") and against.endswith(
        "; 1 more outside the primary family (its report).")
    for words, measure, low, high in (('spikes', 'spikes9', 'affine', 'softmax'),
                                      ('W8A4', 'ratio_w8a4', 'affine', 'sink'),
                                      ('raw weight', 'weight', 'affine@decay', 'sink')):
        a, b = sides(records, measure, low, high)
        k, n = pairs_against(a, b, '<')
        found, _ = result_for(results, 'kd', (measure, low, '<', high))
        assert (f"on {words} {low} is above {high} in {k} of {n} pairs "
                f"({np.mean(paired(a, b)):+.2g}, p = {found['p_holm']:.2g})" in against)
        assert found['p_holm'] >= 0.05 and found['family'] == 'primary'
    rel = lambda m: (lambda a, b: f"{np.mean(paired(a, b)) / np.mean(list(b.values())):+.2%}")(
        *sides(records, m, 'affine', 'sink'))
    p = lambda m: result_for(results, 'kd', (m, 'affine', '<', 'sink'))[0]['p_holm']
    assert loss == (f"On the loss: affine < sink holds on the KD loss (supported, p = "
                    f"{p('loss'):.2g}; {rel('loss')} of sink's) but not on the held-out loss (not "
                    f"decided, p = {p('val_loss'):.2g}; {rel('val_loss')} of sink's) or the "
                    f"held-out loss on the large set (not decided, p = {p('heldout'):.2g}; "
                    f"{rel('heldout')} of sink's).")
    settings = records[0]['settings']
    affine, headwise = (parameters(settings, v) for v in ('affine', 'headwise_gated'))
    same_p = lambda m: result_for(results, 'kd', (m, 'affine', '!=', 'headwise_gated'))[0]
    same = [(words, same_p(m)['p_holm']) for words, m in (
        ('the KD loss', 'loss'), ('the held-out loss on the large set', 'heldout'),
        ("the share in softmax's sink layers", 'share_sink'), ('W8A4', 'ratio_w8a4'))]
    assert min(p for _, p in same) >= 0.05 and affine == headwise
    same = [f"{words} (p = {p:.2g})" for words, p in same]
    assert size == (f"{gated_sentence(records)} Affine against headwise_gated, of one size "
                    f"({affine:,} parameters each): no detectable difference on "
                    f"{', '.join(same[:-1])} and {same[-1]}.")
    assert scale == scale_sentence(results, records)


def report(study):
    with open(os.path.join(ROOT, 'docs', study, 'report.md')) as f:
        return f.read()


@pytest.mark.parametrize('study', STUDIES)
def test_each_report_opens_with_its_table_and_figures(studies, study):
    """Each report opens with its own table (a column per arm with claims: v1's kd and ce), every
    cell recomputed from its records, then its sentences and its figures (committed), before what
    it found; its sizes are the architecture's arithmetic (v1's records hold no settings)."""
    results, records = studies[study]
    text = report(study)
    top = text.split('## What the study found')[0]
    arms = ['kd', 'ce'] if study == 'sink_study' else ['kd']
    rows = table(top)
    tests = [(measure, *t) for _, measure, comparisons in ROWS + (
        V4_ROWS if study == 'sink_study_v4' else []) for t in comparisons]
    assert len(rows) == 1 + len(tests)
    for row, test in zip(rows[1:], tests):
        assert row[2:2 + len(arms)] == [expected_cell(results, records, arm, test)
                                        for arm in arms]
    for arm in arms:
        for name in (f'rows_{arm}.png', f'claims_{arm}.png'):
            assert f"]({name})" in top
            assert os.path.getsize(os.path.join(ROOT, 'docs', study, name)) > 10_000
    if study == 'sink_study':
        assert "- The records hold no model settings: the variants' sizes cannot be" in text
        return
    settings = records[0]['settings']
    variants = ('softmax', 'sink', 'gated', 'affine') + (
        ('headwise_gated',) if study == 'sink_study_v4' else ())
    assert ("- The students: " + ', '.join(f"{v} {parameters(settings, v):,}" for v in variants)
            + " parameters, 4 layers" in text)
    big = lambda a, b: parameters(settings, a) - parameters(settings, b)
    assert (f"affine against sink: affine +{big('affine', 'sink'):,} parameters (+0.25%); sink "
            f"against softmax: sink +{big('sink', 'softmax')} parameters (+0.0019%)" in text)
    assert f"gated against affine: gated +{big('gated', 'affine'):,} parameters (+7.6%)" in text


@pytest.mark.parametrize('study', STUDIES)
def test_every_comparison_against_the_paper_is_said_with_its_pairs(studies, study):
    """Per arm, the report's section against the paper's direction holds a bullet for every result
    (the study's claims and the reading's tests) whose sides' means go against its direction,
    decided or not, recomputed from the records, with the pairs that do (v1, unpaired: its
    seeds)."""
    results, records = studies[study]
    text = report(study)
    for arm in ('kd', 'ce') if study == 'sink_study' else ('kd',):
        section = text.split(f"## Against the paper's direction ({arm} arm), decided or not\n")[1]
        bullets = section.split('\n## ')[0].strip().splitlines()
        rows = [c for c in results['claims'] + results['reading']['other_claims']
                + results['reading']['loss_claims'] if c['arm'] == arm and c['family'] !=
                'control' and c['direction'] in '<>' and c['p'] is not None]
        expected = []
        for c in rows:
            a, b = sides(records, c['measure'], c['low'], c['high'], arm)
            d = np.mean(list(a.values())) - np.mean(list(b.values()))
            if (d > 0) == (c['direction'] == '<') and d != 0:
                side = 'above' if c['direction'] == '<' else 'below'
                where = ("in {} of {} pairs".format(*pairs_against(a, b, c['direction']))
                         if study != 'sink_study' else f"by its mean over {len(a)} seeds "
                                                       f"against {len(b)}")
                expected.append(f"{c['low']} is {side} {c['high']} {where} (difference {d:+.2g}")
        assert len(bullets) == len(expected) and all(
            e in bullet for e, bullet in zip(expected, bullets)), (bullets, expected)


def started(record, key):
    return datetime.datetime.fromisoformat(record[key])


@pytest.mark.parametrize('study, resumed', [('sink_study_v2', 2), ('sink_study_v3', 10)])
def test_the_report_names_the_records_whose_first_launch_it_cannot_show(studies, study,
                                                                       resumed):
    """A record made before first_started (v2, v3) holds its last launch's start; one whose steps
    took longer than its wall time from started to finished was resumed, and the report names each
    (v3: the ten the issue counted)."""
    _, records = studies[study]
    names = [r['name'] for r in sorted(records, key=lambda r: r['name'])
             if 'first_started' not in r
             and r['seconds'] > (started(r, 'finished') - started(r, 'started')).total_seconds()]
    assert len(names) == resumed
    line = next(line for line in report(study).splitlines()
                if line.startswith(f"- {resumed} records trained longer than their wall time"))
    assert sorted(re.findall(r'kd_\w+_s\d+', line)) == names


def test_v4s_records_keep_their_first_launch(studies):
    """Since v4 a record keeps its first launch's start (a resumed run's started is its last
    launch's), and v4's report says so of every record."""
    _, records = studies['sink_study_v4']
    assert all(started(r, 'first_started') <= started(r, 'started') < started(r, 'finished')
               for r in records)
    assert (f"- {len(records)} of {len(records)} records keep their first launch's start "
            "(first_started)." in report('sink_study_v4'))


def test_how_v4_ran_is_its_records(studies):
    """docs/analysis.md's account of how v4's CPU plan ran: its first start, last finish, the
    records resumed and the hours, recomputed from the records, each at the seal's commit, clean."""
    results, records = studies['sink_study_v4']
    text = ' '.join(block('docs/analysis.md', "**How v4's CPU plan ran.**",
                          "recomputes every one of v4's").split())
    with open(os.path.join(ROOT, 'docs', 'sink_study_v4', 'seal.json')) as f:
        seal = json.load(f)['commit']
    assert all(r['seal'] == seal and r['dirty'] is False for r in records)
    first = min(records, key=lambda r: started(r, 'first_started'))['first_started']
    last = max(records, key=lambda r: started(r, 'finished'))['finished']
    resumed = sum(r['first_started'] != r['started'] for r in records)
    steps = sum(r['seconds'] for r in records) / 3600
    wall = sum((started(r, 'finished') - started(r, 'started')).total_seconds()
               for r in records) / 3600 / 2
    assert (f"All {len(records)} runs finished at the sealed commit" in text
            and f"the first started {first} and the last finished {last}," in text
            and f"{resumed} were resumed from their checkpoints" in text
            and f"Their steps took {steps:.1f} hours of one core in all, {steps / 2:.1f} hours of "
                f"the two cores with two runs side by side (their records' starts to finishes, "
                f"evaluations included: {wall:.1f}): within the issue's 20." in text)
    assert f"v4's {len(results['claims'])} verdicts" in block(
        'docs/analysis.md', "**How v4's CPU plan ran.**", '### Your own variant in the study')


def test_v4s_report_gives_the_teachers_test_beside_each_primary_claim(studies):
    """v4's table over the teachers, recomputed here: for each primary claim, each teacher's mean
    paired difference of its two students, and the exact sign-flip p of those six means (every
    2^6 assignment of signs), beside the claim's p over the 12 pairs and its Holm-adjusted p."""
    results, records = studies['sink_study_v4']
    section = report('sink_study_v4').split('## Over the teachers (information, not a verdict)')[1]
    rows = table(section.split('\n## ')[0])
    primary = [c for c in results['claims'] if c['family'] == 'primary']
    assert len(rows) == 1 + len(primary) == 21
    for row, claim in zip(rows[1:], primary):
        a, b = sides(records, claim['measure'], claim['low'], claim['high'])
        teachers = {}
        for seed in a:
            teacher = group(records, 'kd', claim['low'])[seed]['teacher']
            teachers.setdefault(teacher, []).append(a[seed] - b[seed])
        assert len(teachers) == 6 and all(len(d) == 2 for d in teachers.values())
        p = every_sign_flip([np.mean(d) for d in teachers.values()])
        assert row[1:] == [f"{every_sign_flip(paired(a, b)):.2g}", f"{claim['p_holm']:.2g}",
                           f"{p:.2g}"], claim['id']
        assert row[0].startswith(f"{claim['source']}: {claim['low']} {claim['direction']} "
                                 f"{claim['high']} on ")


def test_v4s_report_says_what_the_seal_said_its_decay_verdict_would_mean(studies):
    """The decay arm's claim: its verdict, recomputed (Holm over the primary family is
    test_sink_study's), and the meaning the seal gave that verdict before the runs, word for word
    as docs/analysis.md said it at the seal's commit."""
    results, records = studies['sink_study_v4']
    claim = next(c for c in results['claims'] if c['id'] == 'decay_fig4_affine_sink')
    below = np.mean(paired(*sides(records, 'weight', 'affine@decay', 'sink'))) < 0
    verdict = ('not decided' if claim['p_holm'] >= 0.05 else
               'supported' if below else 'contradicted')
    with open(os.path.join(ROOT, 'docs', 'sink_study_v4', 'seal.json')) as f:
        seal = json.load(f)['commit']
    sealed = subprocess.run(['git', 'show', f'{seal}:docs/analysis.md'], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    bullet = next(b for b in sealed.split("**What the decay arm's outcome would mean**")[1]
                  .split('\n- ')[1:4] if b.startswith(f'*{verdict}*'))
    meaning = ' '.join(bullet.split('\n\n')[0].split())
    meaning = meaning.replace(f'*{verdict}*', verdict).rstrip(';.')
    line = next(x for x in report('sink_study_v4').splitlines()
                if x.startswith("- Figure 4 under v1's decay rule"))
    assert line == (f"- {claim['source']}, affine@decay < sink: {verdict} (p = "
                    f"{claim['p_holm']:.2g}). What the seal said beforehand this outcome would "
                    f"mean (docs/analysis.md): \"{meaning}.\"")


def test_what_a_later_study_does_not_carry_is_named(studies):
    """v3 carries every kd claim of v1 and v2, and names v1's ce arm, its control (with its moved
    comparisons' p) and its extra variants, which it does not; v2 names the v1 claims its sealed set
    left out."""
    (v1, _), (v2, _), (v3, _) = (studies[s] for s in STUDIES[:3])
    tests = lambda results, arm: {(c['measure'], c['low'], c['direction'], c['high'])
                                  for c in results['claims'] if c['arm'] == arm}
    assert tests(v1, 'kd') <= tests(v3, 'kd') and tests(v2, 'kd') <= tests(v3, 'kd')
    control = [c['p_holm'] for c in v1['claims'] if c['arm'] == 'control']
    text = report('sink_study_v3')
    assert (f"v3 carries {len(tests(v1, 'kd'))} of v1's {len(tests(v1, 'kd'))} claims in the arms "
            f"both trained; it does not carry v1's ce arm ({len(tests(v1, 'ce'))} claims: " in text)
    assert (f"v1's control ({len(control)} comparisons: {len(control)} moved, p = "
            f"{min(control):.2g}–{max(control):.2g}); v1's variant affine_gated (no claim); v1's "
            "variant softmax1 (no claim)." in text)
    assert ("v3 carries 34 of v2's 34 claims in the arms both trained, and every arm and variant "
            "v2 trained." in text)
    left = tests(v1, 'kd') - tests(v2, 'kd')
    assert f"v2 carries {22 - len(left)} of v1's 22 claims" in report('sink_study_v2')
    assert len(left) == 6
    for earlier, claims in (('v1', 22), ('v2', 34), ('v3', 56)):  # v4 carries every kd claim
        assert f"v4 carries {claims} of {earlier}'s {claims} claims" in report('sink_study_v4')
    assert ("v4 carries 56 of v3's 56 claims in the arms both trained, and every arm and variant "
            "v3 trained." in report('sink_study_v4'))


def words(text):
    return len([w for w in text.split() if re.search(r'[A-Za-z0-9]', w)])


@pytest.mark.parametrize('path', ['README.md', *(f'docs/{s}/report.md' for s in STUDIES)])
def test_no_paragraph_runs_over_120_words(path):
    """A paragraph (a bullet is one) of a report, or of the README's section on the study, is at
    most 120 words."""
    with open(os.path.join(ROOT, path)) as f:
        text = re.sub(r'```.*?```', '', f.read(), flags=re.S)
    if path == 'README.md':
        text = text.split('## What holds at this scale')[1].split('\n## ')[0]
    long = [(words(p), p[:80]) for block in re.split(r'\n\s*\n', text)
            for p in re.split(r'\n(?=- |\d+\. )', block)
            if not p.lstrip().startswith('|') and words(p) > 120]
    assert not long


def test_a_study_that_finishes_is_one_more_column(studies):
    """A later study's results (here v3's as a v4 would hold them: the claim set v4, a primary
    claim on the decay arm that no row tests) add a column and that claim's row, and the sentences
    speak of it; no code names v4."""
    from study import study_findings
    v4 = copy.deepcopy(studies['sink_study_v3'][0])
    v4.update(claim_set='v4', report_dir='docs/sink_study_v4')
    claim = next(c for c in v4['claims'] if c['id'] == 'fig4_affine_sink')
    v4['claims'].append(dict(claim, id='decay_fig4_affine_sink', low='affine@decay',
                             source="Figure 4 under v1's decay rule (the paper's)"))
    lines = study_findings.readme_lines([studies[s][0] for s in STUDIES[:3]] + [v4])
    rows = table('\n'.join(lines))
    assert rows[0][5] == '[v4](docs/sink_study_v4/report.md): 12 pairs'
    assert rows[-1][:2] == ["Figure 4 under v1's decay rule", 'affine@decay < sink']
    assert rows[-1][2:5] == ['not tested'] * 3 and rows[-1][5].startswith('**supported** ')
    assert any(line.startswith('- What holds in v4: ') for line in lines)
    with open(os.path.join(ROOT, 'study', 'study_findings.py')) as f:
        assert "'v4'" not in f.read()
    assert json.loads(json.dumps(v4))  # (as results.json holds it)
