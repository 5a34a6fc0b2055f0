"""
The sink study's results: the claims fixed before its runs (CLAIMS, each on a measure of MEASURES),
their tests (study/significance.py), and every word the report and docs/analysis.md's pilot table
say about them, generated from the runs' records (study/sink_study.py writes the records;
study/study_findings.py the report's opening and the README's findings; study/study_blocks.py writes
the blocks).
"""
import functools
import json
import os
import statistics

from study import significance as sig
from model import PAPER_VARIANTS
from lmkit.probes import SINK_THRESHOLD, layer_mean

SOFTMAX, SINK, GATED, AFFINE, AFFINE_GATED = PAPER_VARIANTS  # the paper's five, in its order
CORE = [SOFTMAX, SINK, GATED, AFFINE]  # the variants of the claims
# Qiu et al.'s head-wise gate on softmax: one sigmoid per head, affine's alpha_proj's size (v4)
HEADWISE = 'headwise_gated'
# v4's decay arm: kd runs under v1's rule, decay on the variant's own projections (alpha_proj,
# g_proj). A claim names its runs as variant@arm (AFFINE_DECAY); a bare name is the family's arm.
DECAY = 'decay'
AFFINE_DECAY = f'{AFFINE}@{DECAY}'
# v1's extra variants, affine_gated and ours (softmax1): fewer seeds, numbers
EXTRA = [AFFINE_GATED, 'softmax1']
RECIPE_SEED = 0  # the seed the recipe was searched on (softmax, ce): reported, never in a test
# a real pretrained softmax model's first-token weight, for scale: as the quick start's real-model
# stage measured it
SMOLLM2 = dict(first_token_mean=0.36, first_token_max=0.65, source=(
    "python quickstart.py's real-model stage: SmolLM2-135M-Instruct (analyze.py attention on the "
    "built-in corpus in its tokens, 4 x 256 tokens; docs/analysis.md)"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
# a layer holds softmax's sink where its Gu et al. Sink_1, mean over the softmax seeds, is at least
# 1/16 (v2's rule for a seed; v3's sink layers and the reading's); the payoff sits at its floor
# where W8A8 moves no run's loss by more than 1% (the reading's)
SINK_LAYER_MIN, PAYOFF_FLOOR = 1 / 16, 0.01
MAX_LAYER_CLAIMS = 8  # per-layer measures (weight_l1, ...) up to the GPU plan's depth


KD_ARMS = ('kd', 'control', DECAY)  # the arms whose runs distil from a teacher


def minutes(seconds):
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
        f"{int(seconds // 60)}m{int(seconds % 60):02d}s"

# -----------------------------------------------------------------------------
# The claims, fixed before the runs (docs/analysis.md), and their tests (study/significance.py)

# measure name -> (what it is, its value in a record)
MEASURES = {
    'weight': ("the first token's raw weight, mean over layers (Figure 4's own measure)",
               lambda r: layer_mean(r['first_token_weight'])),
    'share': ("the first token's share of each row's total, mean over layers",
              lambda r: layer_mean(r['first_token_share'])),
    'first_or_null': ("the first token's weight plus the null mass (the paper's Figure 9 reading "
                      "of sink), mean over layers", lambda r: layer_mean(r['first_or_null'])),
    'entropy': ("attention entropy (of the weights' magnitudes normalised over the visible keys), "
                "mean over all layers",
                lambda r: layer_mean(r['entropy'])),
    'entropy_deep': ("the same over the deeper half of the layers",
                     lambda r: layer_mean(r['entropy'][len(r['entropy']) // 2:])),
    'loss': ("kd arm: the final KD loss (mean of the last 50 steps); ce arm: the CE validation "
             "loss of the last "
             "evaluation", lambda r: r['final_kd_loss'] if r['arm'] in KD_ARMS
             else r['val_loss']),
    'spikes9': ("gradient-norm spikes over steps 0-500, median + 9 MAD (Table "
                "5)", lambda r: r['spikes']['9']),
    'row_spread': ("the standard deviation of the per-query row totals over the windows' queries "
                   "(Figure 3's spread), mean over "
                   "layers", lambda r: layer_mean(r['end']['row_total_std'])),
    'sink_grown': ("1 where Gu et al.'s Sink_1^0.3 in their setting (100 x 64, the first token "
                   "among the tokens) is above 0, else "
                   "0", lambda r: float(r['end']['gu']['sink_rate'] > 0)),
    'w8a8': ("the W8A8 loss over the full-precision loss", lambda r: r['end']['w8a8']['ratio']),
    'knockout0': ("the loss with the first token evicted (k = 0, window a quarter of the context) "
                  "over full attention's", lambda r: r['end']['knockout']['ratio_first_0']),
    'val_loss': ("the CE validation loss of the last evaluation", lambda r: r['val_loss']),
    'heldout': ("the CE loss on HELDOUT_WINDOWS validation windows at the end (end.heldout: 16x "
                "the evaluations' tokens)", lambda r: r['end']['heldout']['loss']),
    # v2's secondary readings (docs/analysis.md)
    'weight_deep': ("the first token's raw weight, mean over the deeper half of the layers",
                    lambda r: layer_mean(
    r['first_token_weight'][len(r['first_token_weight']) // 2:])),
    **{f'weight_l{k}': ("the first token's raw weight in layer "
                        f"{k}", lambda r, k=k: r['first_token_weight'][k - 1])
       for k in range(1, MAX_LAYER_CLAIMS + 1)},
    'gu_rate': ("Gu et al.'s Sink_1^0.3 in their setting (100 x 64), on the tokens (rows "
                "renormalised where they do not sum to "
                "one)", lambda r: r['end']['gu']['sink_rate']),
    'gu_rate_raw': ("the same on the raw rows (never "
                    "renormalised)", lambda r: r['end']['gu']['sink_rate_raw']),
    'sink_grown16': ("1 where Gu et al.'s Sink_1^0.3 in their setting is at least 1/16 (fixed "
                     "before v2's runs), else "
                     "0", lambda r: float(r['end']['gu']['sink_rate'] >= 1 / 16)),
    **{f'ratio_{w}': (f"the {w.upper()} loss over the full-precision loss (end.payoff)",
                      lambda r, w=w: r['end']['payoff'][f'ratio_{w}'])
       for w in ('w8a6', 'w8a4', 'w4a8')},
    **{f'ffn_{kind}': (f"the FFN output's {words} (Bondarenko et al.), its largest layer "
                       "(end.payoff)",
                       lambda r, kind=kind: max(r['end']['payoff'][f'ffn_{kind}']))
       for kind, words in (('kurtosis', 'kurtosis'), ('max_abs', 'largest absolute value'))},
    'share_sink': ("the first token's share of each row's total, mean over the layers where "
                   "softmax grows its sink "
                   "(those whose Gu et al. Sink_1, mean over the arm's softmax seeds, is at least "
                   "1/16: computed from "
                   "the softmax runs alone)", lambda r: None),  # STUDY_MEASURES reads it
    'spikes9_after': ("gradient-norm spikes over steps warm-up-500, median + 9 MAD over that "
                      "window",
                      # None: a warm-up to step 500
                      lambda r: (r.get('spikes_after_warmup') or {}).get('9')),
}
FISHER = ('sink_grown', 'sink_grown16')  # 0/1 per seed: Fisher's exact test


def sink_layers(runs, arm):
    """(the layers, 1-based, where softmax grows its sink; softmax's Sink_1 per layer): those whose
    Gu et al. Sink_1 (end.gu.sink_rate_per_layer), mean over the arm's softmax seeds, is at least
    SINK_LAYER_MIN. Computed from the softmax runs alone, so it favours no variant (v3's rule, fixed
    in its seal)."""
    softmax = tested(runs, arm, SOFTMAX)
    rates = [statistics.fmean(x)
             for x in zip(*(r['end']['gu']['sink_rate_per_layer'] for r in softmax))]
    return [k for k, rate in enumerate(rates, 1) if rate >= SINK_LAYER_MIN], rates


def share_in(layers):
    """A record's first-token share, mean over the given layers (1-based); None where there are
    none."""
    return lambda r: statistics.fmean(r['first_token_share'][k - 1]
                                      for k in layers) if layers else None


# measures of a record that depend on the study's other runs: (runs, arm) -> a record's value
STUDY_MEASURES = dict(share_sink=lambda runs, arm: share_in(sink_layers(runs, arm)[0]))

# (id, family, source, measure, low, direction, high): the claim is `low direction high` in each arm
# it names
CLAIMS = [
    ('fig4_affine_sink', 'primary', 'Figure 4', 'weight', AFFINE, '<', SINK),
    ('fig4_sink_softmax', 'primary', 'Figure 4', 'weight', SINK, '<', SOFTMAX),
    ('fig6_affine_sink', 'primary', 'Figure 6', 'entropy', AFFINE, '>', SINK),
    ('fig6_affine_softmax', 'primary', 'Figure 6', 'entropy', AFFINE, '>', SOFTMAX),
    ('fig7_affine_softmax', 'primary', 'Figures 7 and 10', 'loss', AFFINE, '<', SOFTMAX),
    ('fig7_affine_sink', 'primary', 'Figures 7 and 10', 'loss', AFFINE, '<', SINK),
    ('table5_affine_softmax', 'primary', 'Table 5 (k = 9)', 'spikes9', AFFINE, '<', SOFTMAX),
    ('fig4_share_affine_sink', 'secondary', 'Figure 4, by share', 'share', AFFINE, '<', SINK),
    ('fig4_share_sink_softmax', 'secondary', 'Figure 4, by share', 'share', SINK, '<', SOFTMAX),
    ('fig4_null_affine_sink', 'secondary', 'Figure 4, first-token-or-null', 'first_or_null', AFFINE,
     '<', SINK),
    ('fig4_null_sink_softmax', 'secondary', 'Figure 4, first-token-or-null', 'first_or_null', SINK,
     '<', SOFTMAX),
    ('fig6_deep_affine_sink', 'secondary', 'Figure 6, deeper half', 'entropy_deep', AFFINE, '>',
     SINK),
    ('fig6_deep_affine_softmax', 'secondary', 'Figure 6, deeper half', 'entropy_deep', AFFINE, '>',
     SOFTMAX),
    ('fig3_spread_affine_sink', 'secondary', 'Figure 3', 'row_spread', AFFINE, '>', SINK),
    ('qiu_gate_share', 'secondary', 'Qiu et al. (the gate)', 'share', GATED, '<', SOFTMAX),
    ('gu_affine', 'secondary', 'Gu et al. (seeds with a sink)', 'sink_grown', AFFINE, '<', SOFTMAX),
    ('gu_sink', 'secondary', 'Gu et al. (seeds with a sink)', 'sink_grown', SINK, '<', SOFTMAX),
    ('gu_gated', 'secondary', 'Gu et al. (seeds with a sink)', 'sink_grown', GATED, '<', SOFTMAX),
    ('w8a8_affine_softmax', 'secondary', 'the payoff: W8A8', 'w8a8', AFFINE, '<', SOFTMAX),
    ('w8a8_affine_sink', 'secondary', 'the payoff: W8A8', 'w8a8', AFFINE, '<', SINK),
    ('knockout_affine_softmax', 'secondary', 'the payoff: knockout', 'knockout0', AFFINE, '<',
     SOFTMAX),
    ('knockout_affine_sink', 'secondary', 'the payoff: knockout', 'knockout0', AFFINE, '<', SINK),
]
# v2 (issue 44; sealed before its runs, docs/analysis.md): the paper's comparisons in the kd arm,
# v1's primary family, on matched pairs; the secondary readings, each named for whose reading it is
# (a reading the paper does not make is never a paper claim)
CLAIMS_V2 = [c for c in CLAIMS if c[1] == 'primary'] + [
    ('deep_affine_sink', 'secondary', 'Figure 4, deeper half (our reading)', 'weight_deep', AFFINE,
     '<', SINK),
    ('deep_sink_softmax', 'secondary', 'Figure 4, deeper half (our reading)', 'weight_deep', SINK,
     '<', SOFTMAX),
    ('fig6_deep_affine_sink', 'secondary', 'Figure 6, deeper half (our reading)', 'entropy_deep',
     AFFINE, '>', SINK),
    ('fig6_deep_affine_softmax', 'secondary', 'Figure 6, deeper half (our reading)', 'entropy_deep',
     AFFINE, '>', SOFTMAX),
    *[(f'layer{k}_{low}_{high}', 'secondary', f'Figure 4, layer {k} (our reading)', f'weight_l{k}',
       low, '<', high) for k in range(1, 5) for low, high in ((AFFINE, SINK), (SINK, SOFTMAX))],
    ('fig4_share_affine_sink', 'secondary', 'Figure 4, by share (our reading)', 'share', AFFINE,
     '<', SINK),
    ('fig4_share_sink_softmax', 'secondary', 'Figure 4, by share (our reading)', 'share', SINK, '<',
     SOFTMAX),
    ('gu_rate_affine', 'secondary', 'Gu et al. (Sink_1)', 'gu_rate', AFFINE, '<', SOFTMAX),
    ('gu_rate_sink', 'secondary', 'Gu et al. (Sink_1)', 'gu_rate', SINK, '<', SOFTMAX),
    ('gu_raw_affine', 'secondary', 'Gu et al. (Sink_1, raw rows)', 'gu_rate_raw', AFFINE, '<',
     SOFTMAX),
    ('gu_raw_sink', 'secondary', 'Gu et al. (Sink_1, raw rows)', 'gu_rate_raw', SINK, '<', SOFTMAX),
    ('gu16_affine', 'secondary', 'Gu et al. (seeds with Sink_1 >= 1/16)', 'sink_grown16', AFFINE,
     '<', SOFTMAX),
    ('gu16_sink', 'secondary', 'Gu et al. (seeds with Sink_1 >= 1/16)', 'sink_grown16', SINK, '<',
     SOFTMAX),
    ('gu16_gated', 'secondary', 'Gu et al. (seeds with Sink_1 >= 1/16)', 'sink_grown16', GATED, '<',
     SOFTMAX),
    ('table5_after_affine_softmax', 'secondary', 'Table 5 (k = 9) after the warm-up (our reading)',
     'spikes9_after', AFFINE, '<', SOFTMAX),
    *[c for c in CLAIMS if c[0] in ('qiu_gate_share', 'w8a8_affine_softmax', 'w8a8_affine_sink',
                                    'knockout_affine_softmax', 'knockout_affine_sink')],
]


# v3's payoff: the candidates, nearest W8A8 first, and the rule that chose one on the softmax pilot
# (docs/analysis.md, "v3"), fixed before the pilot's last run: the first whose ratio is above 1 +
# PAYOFF_FLOOR in every pilot seed
PAYOFF_CANDIDATES = ('ratio_w8a6', 'ratio_w4a8', 'ratio_w8a4')
MEASURE_NAMES = dict(ratio_w8a6='W8A6', ratio_w4a8='W4A8', ratio_w8a4='W8A4',
                     ffn_kurtosis='FFN-output kurtosis',
                     ffn_max_abs='FFN-output largest absolute value')
# a measure in a few words (a row added for a study's primary claim: its source and these)
MEASURE_WORDS = dict(weight='raw weight', share='share',
                     share_sink="share in softmax's sink layers",
                     first_or_null='first token or null', entropy='entropy', loss='KD loss',
                     val_loss='held-out loss', heldout='held-out loss on the large set',
                     spikes9='spikes', row_spread='row-total spread', w8a8='W8A8',
                     **MEASURE_NAMES)
# payoff_choice on the pilot (docs/sink_study_v3/pilot/), before the seal: W8A4, above 1.01 in its
# three seeds (1.080-1.091)
PAYOFF_V3 = 'ratio_w8a4'


def payoff_choice(pilot_runs):
    """(the payoff measure v3's primary family tests, or None; each candidate's ratios over the
    pilot's softmax seeds): the first of PAYOFF_CANDIDATES that leaves its floor in every seed."""
    softmax = [r for r in pilot_runs if r['variant'] == SOFTMAX and r['arm'] == 'kd']
    ratios = {m: [MEASURES[m][1](r) for r in softmax] for m in PAYOFF_CANDIDATES}
    chosen = next((m for m, xs in ratios.items() if xs and min(xs) > 1 + PAYOFF_FLOOR), None)
    return chosen, ratios


def claims_v3(n_layer, payoff):
    """v3 (issue 50; sealed before its runs, docs/analysis.md): every claim v1 or v2 tested, none
    dropped, each labelled by whose reading it is, on a model of n_layer layers. Its primary family
    is v2's (the paper's own comparisons), two readings of ours that v2's records showed matter (the
    held-out loss beside the KD training loss; the first-token share in the layers where softmax
    grows its sink, STUDY_MEASURES' share_sink), and the payoff measure its pilot chose at its scale
    (None: every payoff claim secondary)."""
    paper = [(cid, family, f"{source} (the "
                           "paper's)", *rest) for cid, family, source, *rest in CLAIMS_V2
             if family == 'primary']
    primary = paper + [
        ('fig7_val_affine_softmax', 'primary', 'Figures 7 and 10, held-out loss (our reading)',
         'val_loss', AFFINE, '<', SOFTMAX),
        ('fig7_val_affine_sink', 'primary', 'Figures 7 and 10, held-out loss (our reading)',
         'val_loss', AFFINE, '<', SINK),
        ('sinklayers_affine_sink', 'primary',
         "Figure 4, by share in softmax's sink layers (our reading)", 'share_sink', AFFINE, '<',
         SINK),
        ('sinklayers_sink_softmax', 'primary',
         "Figure 4, by share in softmax's sink layers (our reading)", 'share_sink', SINK, '<',
         SOFTMAX)]
    v1_only = {'fig4_null_affine_sink': "Figure 4, first-token-or-null (v1's reading)",
               'fig4_null_sink_softmax': "Figure 4, first-token-or-null (v1's reading)",
               'fig3_spread_affine_sink': "Figure 3 (the paper's)",
               'gu_affine': "Gu et al. (seeds with Sink_1 > 0, v1's rule)",
               'gu_sink': "Gu et al. (seeds with Sink_1 > 0, v1's rule)",
               'gu_gated': "Gu et al. (seeds with Sink_1 > 0, v1's rule)"}
    secondary = [c for c in CLAIMS_V2 if c[1] == 'secondary'
                 and not c[3].startswith('weight_l')] + [
        (f'layer{k}_{low}_{high}', 'secondary', f'Figure 4, layer {k} (our reading)',
         f'weight_l{k}', low, '<', high)
        for k in range(1, n_layer + 1) for low, high in ((AFFINE, SINK), (SINK, SOFTMAX))] + [
        (cid, 'secondary', v1_only[cid], *rest)
        for cid, _, _, *rest in CLAIMS if cid in v1_only] + [
        ('gated_affine_loss', 'secondary',
         'gated against affine (our reading: no claim of the paper)', 'loss', GATED, '!=', AFFINE),
        ('gated_affine_val', 'secondary',
         'gated against affine, held-out loss (our reading: no claim of the paper)', 'val_loss',
         GATED, '!=', AFFINE)]
    payoff = [(f'{m}_{AFFINE}_{high}', 'primary' if m == payoff else 'secondary',
               f"the payoff: {MEASURE_NAMES[m]} (Bondarenko et al.'s "
               "reading)", m, AFFINE, '<', high)
              for m in (*PAYOFF_CANDIDATES, 'ffn_kurtosis', 'ffn_max_abs')
              for high in (SOFTMAX, SINK)]
    return primary + [c for c in payoff if c[1] == 'primary'] + secondary + [c for c in payoff
                                                                             if c[1] != 'primary']


CLAIMS_V3 = claims_v3(4, PAYOFF_V3)  # the CPU plan's students: 4 layers, the payoff its pilot chose
# the GPU plan's: 8, no pilot at that scale, so every payoff claim secondary the study's --claims:
# the claims, the arms
CLAIMS_V3_GPU = claims_v3(8, None)
# the field's measures a comparison with no claim of the paper reads: both losses, Figure 4's
# weight and its share in softmax's sink layers, Figure 6's entropy, the payoff at W8A4
GENERIC_MEASURES = ('loss', 'heldout', 'weight', 'share_sink', 'entropy', 'ratio_w8a4')
CUSTOM = 'custom'  # --claims=custom: generic_claims between the plan's variants


def generic_claims(variants):
    """Two-sided comparisons (no direction claimed) on GENERIC_MEASURES: each later variant against
    the first (primary), and each pair of the later ones (secondary); share_sink only where softmax
    is trained (its sink layers come from softmax's runs). A custom plan's claims (docs/analysis.md,
    "Your own variant in the study")."""
    base, others = variants[0], list(variants[1:])
    measures = [m for m in GENERIC_MEASURES if m != 'share_sink' or SOFTMAX in variants]
    pairs = [(v, base) for v in others] + [(a, b) for i, a in enumerate(others)
                                           for b in others[i + 1:]]
    return [(f'{m}_{low}_{high}', 'primary' if high == base else 'secondary',
             f'{low} against {high} (no claim of the paper)', m, low, '!=', high)
            for low, high in pairs for m in measures]


def claims_v4():
    """v4 (issue 60; sealed before its runs, docs/analysis.md, "v4"): is affine more than a gate of
    its own size? Every v3 claim (its variants are all trained), primary and secondary as in v3;
    added to the primary family: affine against the head-wise gate (Qiu et al.; the same parameter
    count) on both losses, the share in softmax's sink layers and W8A4, two-sided; the held-out
    loss on 16x v3's tokens; and Figure 4 in the decay arm (v1's rule). The secondary family adds
    the head-wise gate's other comparisons and the decay arm's other readings."""
    v3_primary = [c for c in CLAIMS_V3 if c[1] == 'primary']
    v3_secondary = [c for c in CLAIMS_V3 if c[1] == 'secondary']
    same_size = 'affine against the head-wise gate of its size (no claim of the paper)'
    v1_rule = "under v1's decay rule (decay on alpha_proj)"
    primary = v3_primary + [
        (f'{m}_{AFFINE}_{HEADWISE}', 'primary', same_size, m, AFFINE, '!=', HEADWISE)
        for m in ('loss', 'heldout', 'share_sink', 'ratio_w8a4')] + [
        (f'heldout_{AFFINE}_{high}', 'primary',
         "Figures 7 and 10, held-out loss on 16x v3's tokens (our reading)", 'heldout', AFFINE,
         '<', high) for high in (SOFTMAX, SINK)] + [
        ('decay_fig4_affine_sink', 'primary', f"Figure 4 {v1_rule} (the paper's)", 'weight',
         AFFINE_DECAY, '<', SINK)]
    headwise = [(f'{m}_{HEADWISE}_{high}', 'secondary',
                 f'the head-wise gate against {high} (no claim of the paper)', m, HEADWISE, '!=',
                 high) for high in (SOFTMAX, GATED) for m in GENERIC_MEASURES] + [
        (f'{m}_{AFFINE}_{HEADWISE}', 'secondary', same_size, m, AFFINE, '!=', HEADWISE)
        for m in ('weight', 'entropy')] + [
        ('qiu_headwise_share', 'secondary', 'Qiu et al. (the head-wise gate)', 'share', HEADWISE,
         '<', SOFTMAX),
        ('gated_affine_heldout', 'secondary',
         'gated against affine, held-out loss on 16x the tokens (our reading: no claim of the '
         'paper)', 'heldout', GATED, '!=', AFFINE)]
    decay = [(f'decay_{cid}', 'secondary', f"{source} {v1_rule}", measure, AFFINE_DECAY, '<', SINK)
             for cid, source, measure in (
                 ('fig4_share_affine_sink', 'Figure 4, by share (our reading)', 'share'),
                 ('sinklayers_affine_sink',
                  "Figure 4, by share in softmax's sink layers (our reading)", 'share_sink'),
                 ('fig4_null_affine_sink', "Figure 4, first-token-or-null (v1's reading)",
                  'first_or_null'))] + [
        (f'decay_moves_{m}', 'secondary', "v1's decay rule against v3's (affine)", m,
         AFFINE_DECAY, '!=', AFFINE) for m in ('weight', 'share', 'loss', 'heldout')]
    return primary + v3_secondary + headwise + decay


CLAIMS_V4 = claims_v4()
# what each verdict of a claim would mean, as the seal said before its runs (docs/analysis.md, v4:
# "What the decay arm's outcome would mean"); the report quotes the one its verdict picks
SEALED_MEANINGS = dict(decay_fig4_affine_sink={
    'supported': "(and Figure 4's affine < sink supported in the kd arm): the decay rule does not "
                 "decide the verdict at this scale; v1's contradiction came from something else v1 "
                 "differed in (its teachers of the students' own shape and seeds, no matched "
                 "pairs, its decay phase)",
    'contradicted': "the rule decides it: affine's lower first-token weight holds only where its "
                    "`alpha_proj` is not decayed, and Figure 4's comparison at this scale is a "
                    "property of the recipe as much as of the method",
    'not decided': "v1's rule moves affine toward sink without reversing the comparison "
                   "detectably; the verdict under v3's rule then stands alone and the report says "
                   "so"})
CLAIM_SETS = dict(v1=(CLAIMS, ('kd', 'ce')), v2=(CLAIMS_V2, ('kd',)), v3=(CLAIMS_V3, ('kd',)),
                  v3_gpu=(CLAIMS_V3_GPU, ('kd',)), v4=(CLAIMS_V4, ('kd',)))
# the claim sets sealed before their runs: tested by a sealed study, reported once
SEALED_SETS = ('v2', 'v3', 'v3_gpu', 'v4')
# the sets whose paired comparisons also get a test over their teachers' mean differences
TEACHER_LEVEL_SETS = ('v4', CUSTOM)


def claim_list(claim_set, variants=()):
    """A set's claims: CLAIM_SETS' own, or a custom plan's (generic_claims of its variants)."""
    return generic_claims(variants) if claim_set == CUSTOM else CLAIM_SETS[claim_set][0]


def claims_of(results):
    """The claims a study's results.json tested (its claim set, and a custom plan's variants)."""
    return claim_list(results.get('claim_set', 'v1'), results.get('variants', ()))
CLAIM_ARMS = ('kd', 'ce')  # each claim is tested in both, kd (the paper's setting) first
# did turning decay off on alpha_proj, g_proj move these?
CONTROL_MEASURES = ('weight', 'share', 'loss')
# Figure 4's comparison, each way the study reads it
FIGURE_4_MEASURES = dict(weight='first-token weight', share='first-token share',
                         first_or_null='first-token-or-null')


def tested(records, arm, variant):
    """The records of (arm, variant) that enter tests: never the recipe's seed. A group named
    variant@arm takes that arm's runs (v4's decay arm against the kd arm's)."""
    variant, _, other_arm = variant.partition('@')
    arm = other_arm or arm
    return [r for r in records if r['arm'] == arm and r['variant'] == variant
            and r['seed'] != RECIPE_SEED]


def matched_pairs(a, b):
    """[(run of a, run of b)] by seed where every run started from train.py's matched_init (one
    seed: the same batches and the same initial values of every shared tensor) and both groups hold
    the same seeds once each; else None."""
    seeds_a, seeds_b = [r['seed'] for r in a], [r['seed'] for r in b]
    if not all(r.get('settings', {}).get('matched_init') for r in a + b) or not a or \
            sorted(seeds_a) != sorted(seeds_b) or len(set(seeds_a)) != len(seeds_a):
        return None
    by_seed = {r['seed']: r for r in b}
    return [(r, by_seed[r['seed']]) for r in a]


def compare_paired(pairs, get, family_size):
    """compare() for matched pairs: the exact sign-flip test on the per-seed differences, their
    bootstrap interval and the pairs a difference of this size would need."""
    differences = [get(x) - get(y) for x, y in pairs]
    (mean_a, std_a), (mean_b, std_b) = (sig.mean_std([get(run) for run in side])
                                        for side in zip(*pairs))
    return dict(n=[len(pairs)] * 2, mean=[mean_a, mean_b], std=[std_a, std_b],
                seeds=[[x['seed'] for x, _ in pairs]] * 2, difference=statistics.fmean(differences),
                test='exact sign-flip, paired by seed', p=sig.paired_test(differences),
                interval=list(sig.paired_interval(differences)),
                needed=sig.pairs_needed(differences, family_size) if len(pairs) > 1 else None)


def measured(record, measure, get=None):
    """A record's value of a measure, or None where the record has no such value (a measure added
    after the record was made, such as v2's raw-row Sink_1 in a v1 record, or a layer the model does
    not have)."""
    try:
        return (get or MEASURES[measure][1])(record)
    except (KeyError, TypeError, IndexError):
        return None


def compare(a, b, measure, direction, family_size, fisher=False, get=None):
    """One comparison of groups a and b (records) on a measure: means, stds, the test's raw p, the
    95% interval of the difference (bootstrap, within teachers in the kd arm) and the seeds a
    difference of this size would need; matched pairs (matched_pairs) are compared by seed
    (compare_paired). A run without the measure (None: Table 5 after a warm-up that reaches step
    500) is left out of the comparison."""
    # (a measure of the whole study, STUDY_MEASURES, comes as get)
    get = get or MEASURES[measure][1]
    a, b = ([r for r in runs if measured(r, measure, get) is not None] for runs in (a, b))
    pairs = None if fisher else matched_pairs(a, b)
    if pairs:
        return compare_paired(pairs, get, family_size)
    values = lambda runs: [get(r) for r in runs]
    va, vb = values(a), values(b)
    strata = lambda runs: [r['teacher'] for r in runs] if any(r['teacher'] for r in runs) else None
    (mean_a, std_a), (mean_b, std_b) = sig.mean_std(va), sig.mean_std(vb)
    out = dict(n=[len(a), len(b)], mean=[mean_a, mean_b], std=[std_a, std_b],
               seeds=[[r['seed'] for r in a], [r['seed'] for r in b]])
    if not va or not vb:
        return out | dict(p=None)
    out['difference'] = out['mean'][0] - out['mean'][1]
    if fisher:
        out['test'] = "Fisher's exact"
        out['p'] = sig.fisher_exact(int(sum(va)), len(va), int(sum(vb)), len(vb))
    else:
        out['test'] = 'exact permutation' + (' within teachers' if strata(a) else '')
        out['p'] = sig.permutation_test(va, vb, strata(a), strata(b))
    out['interval'] = list(sig.bootstrap_interval(va, vb, strata(a), strata(b)))
    out['needed'] = sig.seeds_needed(va, vb, family_size,
                                     proportions=fisher) if len(va) > 1 and len(vb) > 1 else None
    return out


def teacher_level_p(a, b, get):
    """The exact sign-flip p over the teachers: each teacher's mean paired difference of its
    students (None where the runs are not matched pairs under at least two teachers). With 6
    teachers it can reach 2 / 2^6 = 0.031 (v4), with v3's 4 no lower than 0.125."""
    pairs = matched_pairs(a, b)
    if not pairs or any(x['teacher'] is None for x, _ in pairs):
        return None
    by_teacher = {}
    for x, y in pairs:
        by_teacher.setdefault(x['teacher'], []).append(get(x) - get(y))
    means = [statistics.fmean(d) for _, d in sorted(by_teacher.items())]
    return sig.paired_test(means) if len(means) > 1 else None


def test_family(records, arm, family, claims, teacher_level=False):
    """The claims (CLAIMS' tuples) of one family in one arm, each compared (compare), with Holm's
    correction over those that have at least MIN_SEEDS seeds on both sides and each verdict word
    from its adjusted p; teacher_level: each paired comparison's teacher_level_p beside it."""
    size = sum(min(len(tested(records, arm, c[4])),
                   len(tested(records, arm, c[6]))) >= sig.MIN_SEEDS
               for c in claims) or 1
    results = []
    for cid, _, source, measure, low, direction, high in claims:
        a, b = tested(records, arm, low), tested(records, arm, high)
        get = STUDY_MEASURES[measure](records, arm) if measure in STUDY_MEASURES else None
        result = compare(a, b, measure, direction, size, fisher=measure in FISHER, get=get)
        if teacher_level and measure not in FISHER:
            get = get or MEASURES[measure][1]
            a, b = ([r for r in runs if measured(r, measure, get) is not None] for runs in (a, b))
            result['p_teacher'] = teacher_level_p(a, b, get)
        results.append(dict(id=cid, arm=arm, family=family, source=source, measure=measure, low=low,
                            direction=direction, high=high, **result))
    holm_set = [r for r in results if r['p'] is not None and min(r['n']) >= sig.MIN_SEEDS]
    for r, adjusted in zip(holm_set, sig.holm([r['p'] for r in holm_set])):
        r['p_holm'] = adjusted
    for r in results:
        r['verdict'] = verdict_word(r) if r['p'] is not None else 'not measured'
    return results


def verdict_word(r):
    """A tested comparison's verdict: sig.verdict for a claim (< or >); for a two-sided comparison
    (!=, a difference no one claimed a direction for) which side is lower where the adjusted p is
    below ALPHA."""
    p = r.get('p_holm', 1.0)
    if r['direction'] != '!=' or min(r['n']) < sig.MIN_SEEDS:
        return sig.verdict(direction=r['direction'], difference=r['difference'], p_adjusted=p,
                           n_a=r['n'][0], n_b=r['n'][1], needed=r['needed'])
    if p < sig.ALPHA:
        return f"{r['low'] if r['difference'] < 0 else r['high']} lower (p = {p:.3g})"
    return f"no detectable difference (p = {p:.3g})"


def test_claims(records, claim_set='v1', variants=()):
    """Every claim of the set (claim_list: a custom plan's are its variants') in each of its arms,
    with Holm's correction within each (arm, family) over the comparisons that have at least
    MIN_SEEDS seeds on both sides; and the control arm against kd. A list of result dicts."""
    out = []
    claims = claim_list(claim_set, variants)
    arms = ('kd',) if claim_set == CUSTOM else CLAIM_SETS[claim_set][1]
    for arm in arms:
        for family in ('primary', 'secondary'):
            out += test_family(records, arm, family, [c for c in claims if c[1] == family],
                               teacher_level=claim_set in TEACHER_LEVEL_SETS)
    controls = [(v, m) for v in (AFFINE, GATED) for m in CONTROL_MEASURES
                if tested(records, 'control', v) and tested(records, 'kd', v)]
    results = []
    for variant, measure in controls:
        result = compare(tested(records, 'control', variant), tested(records, 'kd', variant),
                         measure, '!=', len(controls))
        results.append(dict(id=f'control_{variant}_{measure}', arm='control', family='control',
                            source='the recipe (weight decay on alpha_proj, '
                                   'g_proj)', measure=measure,
                            low=f'{variant} without decay', direction='!=',
                            high=f'{variant} with decay', **result))
    holm_set = [r for r in results if min(r['n']) >= sig.MIN_SEEDS]
    for r, adjusted in zip(holm_set, sig.holm([r['p'] for r in holm_set])):
        r['p_holm'] = adjusted
    for r in results:
        p = r.get('p_holm')
        r['verdict'] = (f"numbers only (fewer than {sig.MIN_SEEDS} seeds in a "
                        "group)" if p is None else
                        f"moved (p = {p:.3g})" if p < sig.ALPHA
                        else f"did not move detectably (p = {p:.3g})")
    return out + results

# -----------------------------------------------------------------------------
# results.json and the report: all generated from the records


def uniform_first_token(context):
    """The first token's weight under uniform causal attention, averaged over the queries after it:
    query i (0-based) spreads 1 / (i + 1) over i + 1 keys."""
    return sum(1 / (i + 1) for i in range(1, context)) / (context - 1)


def fmt(ms, digits=3):
    mean, std = ms
    if mean is None:
        return '—'
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else '')


def g(x):
    return '—' if x is None else f"{x:.4g}"


ARM_TITLES = dict(kd="KD arm: students distilled from softmax teachers",
                  ce="CE arm: trained from scratch with cross-entropy (outside the paper's "
                     "setting)",
                  control="Control: kd with weight decay off on alpha_proj and g_proj",
                  decay="Decay arm: kd under v1's rule, weight decay on alpha_proj and g_proj too",
                  recipe="The recipe's seed (ce softmax, seed 0): reported, never tested",
                  teacher="The kd teachers (softmax, cross-entropy, their own shape): reported, "
                          "never tested")


def teachers_in_words(results):
    """What the kd arm's teachers are, from their records: peers of the students' own recipe (v1's),
    or not."""
    teachers = [r for r in results['runs'] if r['name'] in results['teachers']]
    if teachers and all(r['recipe'] == results['recipe'] for r in teachers):
        return ("of the students' own shape and tokens, where the paper's teachers are about 3x "
                "larger")
    students = [r for r in results['runs'] if r['arm'] == 'kd' and 'settings' in r]
    if teachers and students and all('settings' in r for r in teachers):
        ratios = sorted({parameters(r['settings']) / parameters(students[0]['settings'])
                         for r in teachers})
        return (f"{' and '.join(f'{x:.2f}x' for x in ratios)} the students' parameters (the "
                "paper's: about 3x)")
    return "of another shape than the students"


def parameters(settings):
    """A run's parameters from its settings (model.py's GPT on the meta device: nothing
    allocated), once per model's settings: a report asks for each variant's many times."""
    from model import FIELD_NAMES
    return model_parameters(json.dumps({k: settings[k] for k in FIELD_NAMES}, sort_keys=True))


@functools.lru_cache(maxsize=None)
def model_parameters(fields):
    import torch
    from model import GPT, ModelConfig
    with torch.device('meta'):
        return sum(p.numel() for p in GPT(ModelConfig(**json.loads(fields))).parameters())


def arm_title(results, arm):
    return f"{ARM_TITLES[arm]} {teachers_in_words(results)}" if arm == 'kd' else ARM_TITLES[arm]


def claim_line(r):
    if r['p'] is None:
        return (f"- {r['source']}: {r['low']} {r['direction']} {r['high']} on {r['measure']}: "
                f"{r['verdict']}.")
    (ma, mb), (sa, sb) = r['mean'], r['std']
    ci = r['interval']
    holm = f", Holm-adjusted {g(r['p_holm'])}" if 'p_holm' in r else ''
    return (f"- {r['source']}: {r['low']} {r['direction']} {r['high']} on {r['measure']}: "
            f"**{r['verdict']}** — {r['low']} {g(ma)} ± {g(sa)} ({r['n'][0]} seeds) vs {r['high']} "
            f"{g(mb)} ± {g(sb)} ({r['n'][1]} seeds); difference {g(r['difference'])}, 95% interval "
            f"[{g(ci[0])}, {g(ci[1])}]; {r['test']} p = {g(r['p'])}{holm}.")


def verdict_lines(results, arms=('kd', 'ce', 'control'),
                  families=('primary', 'secondary', 'control')):
    lines = []
    for arm in arms:
        rows = [r for r in results['claims'] if r['arm'] == arm and r['family'] in families]
        if not rows or not any(r['arm'] == arm for r in results['runs']):
            continue
        lines += ['', f"**{arm_title(results, arm)}**", '']
        for family in families:
            chosen = [r for r in rows if r['family'] == family]
            if chosen and family != 'control':
                lines += [f"{family.capitalize()} claims (Holm over the "
                          f"{len([r for r in chosen if 'p_holm' in r])} tested):"]
            lines += [claim_line(r) for r in chosen]
    return lines


def counts_in_words(results, arm):
    rows = [r for r in results['claims'] if r['arm'] == arm and r['family'] == 'primary']
    count, named = tally(rows)
    ours = sum("(the paper's)" not in r['source'] for r in rows)
    whose = (f"the paper's {len(rows)} primary claims" if not ours or ours == len(rows) else
             f"the {len(rows)} primary claims ({len(rows) - ours} the paper's, {ours} other "
             "readings)")
    return (f"of {whose}, {count('supported')} supported ({named('supported')}), "
            f"{count('contradicted')} contradicted ({named('contradicted')}), "
            f"{count('not decided')} not decided and "
            f"{count('numbers only') + count('not measured')} without a verdict (fewer than "
            f"{sig.MIN_SEEDS} seeds)")


def tally(rows):
    """(how many verdicts start with a word, the claims that do by name) of result rows."""
    words = [r['verdict'].split(' (')[0] for r in rows]
    named = lambda word: ', '.join(f"{r['source']} ({r['low']} {r['direction']} "
                                   f"{r['high']})" for r in rows
                                   if r['verdict'].startswith(word)) or 'none'
    return words.count, named


def secondary_counts(results, arm):
    """The sentences in_words adds after the primary counts: the verdicts of the study's own
    secondary claims, the contradicted by name, so no count of supported claims stands without them,
    then a sentence per source of the two-sided ones, their verdicts by measure; [] where there are
    none."""
    rows = [r for r in results['claims'] if r['arm'] == arm and r['family'] == 'secondary']
    if not rows:
        return []
    count, named = tally([r for r in rows if r['direction'] != '!='])
    by_source = {}
    for r in rows:
        if r['direction'] == '!=':
            verdicts = by_source.setdefault(r['source'], {})
            verdicts.setdefault(r['verdict'].split(' (')[0], []).append(
                MEASURE_WORDS.get(r['measure'], r['measure']))
    two_sided = sum(len(m) for verdicts in by_source.values() for m in verdicts.values())
    return [f"Besides them, of its {len(rows)} secondary claims (Holm within that family), "
            f"{count('supported')} supported, {count('contradicted')} contradicted "
            f"({named('contradicted')}), {count('not decided')} not decided, "
            f"{count('numbers only') + count('not measured')} without a verdict"
            + (f", and {two_sided} two-sided, by what they compare:" if two_sided else '.')] + [
        f"Two-sided, {source}: " + '; '.join(f"{verdict} on {', '.join(measures)}"
                                            for verdict, measures in verdicts.items()) + '.'
        for source, verdicts in by_source.items()]


def other_counts(results, arm):
    """The sentences in_words adds beside the primary counts, one per other set: the verdicts of
    every claim another registered set tested that this study's set left out
    (study_reading.other_claims), so no count of supported claims stands without them; [] where
    there are none (or no reading)."""
    out = []
    for label, rows in by_label(reading_rows(results, 'other_claims', arm)).items():
        count, named = tally(rows)
        out += [
            f"Of the {len(rows)} claims {label.rsplit(';', 1)[0]} (the same tests on these "
            f"records, exploratory), {count('supported')} supported, "
            f"{count('contradicted')} contradicted ({named('contradicted')}), "
            f"{count('not decided')} not decided and {count('not measured')} not measured (no "
            "such value in these records).",
            f"Those supported: {named('supported')}." if count('supported') else '']
    return out


def reading_rows(results, key, arm):
    return [r for r in (results.get('reading') or {}).get(key, []) if r['arm'] == arm]


def by_label(rows):
    out = {}
    for r in rows:
        out.setdefault(r['label'], []).append(r)
    return out


def sink_counts(results, arm, measure='sink_grown'):
    by = {}
    for r in results['runs']:
        if r['arm'] == arm and r['seed'] != RECIPE_SEED:
            by.setdefault(r['variant'], []).append(MEASURES[measure][1](r))
    return ', '.join(f"{v} {int(sum(x))} of {len(x)}" for v, x in by.items())


def control_sentences(results):
    """The control's outcome: per variant and measure, whether it moved with alpha_proj and g_proj
    left out of weight decay (its test, against the kd arm), with both means; then, as numbers only
    (no test of it was fixed before the runs), affine's first-token weight without that decay beside
    the kd sink's, whose logits the recipe never decays (vectors: train.configure_optimizers)."""
    rows = [r for r in results['claims'] if r['arm'] == 'control']
    if not rows:
        return []
    by = {}
    for r in rows:
        # "moved (p = 0.01; 0.008 without, 0.016 with)"
        by.setdefault(r['low'].split()[0], []).append(
            f"{r['measure']} {r['verdict'].rstrip(')')}; {g(r['mean'][0])} without, "
            f"{g(r['mean'][1])} with)")
    sentences = ["The control (kd, weight decay off on alpha_proj and g_proj, against the kd arm's "
                 "runs with it): " + '; '.join(f"{variant}'s {', '.join(items)}"
                                               for variant, items in by.items()) + '.']
    affine, sink = tested(results['runs'], 'control', AFFINE), tested(results['runs'], 'kd', SINK)
    if affine and sink:  # every measure of Figure 4's comparison, not the one that reads one way
        both = lambda key: (f"{FIGURE_4_MEASURES[key]} "
                            f"{fmt(sig.mean_std([MEASURES[key][1](r) for r in affine]), 4)} "
                            f"against {fmt(sig.mean_std([MEASURES[key][1](r) for r in sink]), 4)}")
        sentences.append("Figure 4's affine < sink was tested with that decay on alpha_proj; "
                         f"without it, affine ({len(affine)} seeds) against the kd sink "
                         f"({len(sink)} seeds; the recipe never decays sink's logits) had "
                         f"{', '.join(both(k) for k in FIGURE_4_MEASURES)}: numbers only, as no "
                         "test of this comparison was fixed before the runs.")
    return sentences


PAPER_WEIGHT_DECAY = 0.1  # Section 5.1
# a layer "has a sink" where Gu et al.'s Sink_1 of that layer is at least this (v2's rule)
SINK_LAYER_RATE = 0.25



def layer_means(runs, get):
    return [statistics.fmean(values) for values in zip(*(get(r) for r in runs))]


def confounds(results):
    """(the sentence that leads them, [each confound]) of the study's design that its records show
    (issue 44; v1 has all four, which v2 removes): decay on the variants' own matrices but not on
    sink's logits, a sink in fewer than half of the layers, teachers that are the students' peers
    and share their seeds, and "seeds with a sink" counting Sink_1 > 0."""
    runs = [r for r in results['runs'] if r['arm'] == 'kd' and r['seed'] != RECIPE_SEED]
    found = []
    decayed = [r for r in runs if r['variant'] in (AFFINE, GATED)
               and not {'alpha_proj', 'g_proj'} & set(r['no_decay'])]
    if results['recipe']['weight_decay'] > 0 and decayed:
        found.append(f"the recipe's weight decay ({results['recipe']['weight_decay']:g}; the "
                     f"paper's: {PAPER_WEIGHT_DECAY:g}) acts on affine's alpha_proj and gated's "
                     "g_proj, which are matrices, and never on sink's logits, which are vectors")
    softmax = [r for r in runs if r['variant'] == SOFTMAX]
    if softmax:
        rates = layer_means(softmax, lambda r: r['end']['gu']['sink_rate_per_layer'])
        if sum(rate >= SINK_LAYER_RATE for rate in rates) * 2 < len(rates):
            weights = layer_means(softmax, lambda r: r['first_token_weight'])
            found.append(f"the sink lives in {sum(rate >= SINK_LAYER_RATE for rate in rates)} of "
                         f"{len(rates)} layers: kd softmax's first-token weight per layer is "
                         f"{', '.join(f'{w:.3f}' for w in weights)} (uniform attention: "
                         f"{results['uniform_first_token']:.3f}) and Gu et al.'s Sink₁ per layer "
                         f"{', '.join(f'{x:.2f}' for x in rates)}, and Figure 4's measures average "
                         "the layers")
    teacher_seeds = {int(t.rsplit('_s', 1)[1]) for t in results['teachers']}
    shared = sorted(teacher_seeds & {r['seed'] for r in runs})
    if teachers_in_words(results).startswith('of the') or shared:
        found.append(f"the teachers are {', '.join(results['teachers'])}, "
                     f"{teachers_in_words(results)}"
                     + (f", and kd seeds {', '.join(map(str, shared))} are their own seeds: those "
                        "softmax students start from their teacher's initial weights and see its "
                        "batches" if shared else ''))
    spread = lambda variant: [r['end']['gu']['sink_rate'] for r in runs if r['variant'] == variant]
    if runs and any(c['measure'] == 'sink_grown' for c in results['claims']):
        recipe = results['recipe']
        pairs = runs[0]['end']['gu']['samples'] * recipe['n_layer'] * recipe['n_head']
        found.append("\"seeds with a sink\" counts Gu et al.'s Sink₁ > 0, one (layer, head) over "
                     f"0.3 in one of {pairs:,} (sample, layer, head) triples being enough: the kd "
                     "seeds' Sink₁ runs from "
                     + ', '.join(f"{g(min(spread(v)))} to {g(max(spread(v)))} "
                                 f"({v})" for v in (SOFTMAX, AFFINE)
                                 if spread(v)))
    why = ("v2's recipe search found no setting within its budget that grows a sink in more "
           "layers: docs/sink_study_v2/search.md" if results.get('claim_set', 'v1') != 'v1'
           else "v2, issue 44, removes them")
    return (f"This design has {len(found)} confound{'s' * (len(found) > 1)} its records show "
            f"({why}):"), found


# Section 5.1 and Appendix B.1
PAPER_SCALE = "the paper's Figure 4 student: 1B parameters, 20B tokens"


def in_words(results):
    """What the study found, a sentence each (the report's bullets): per arm the primary claims'
    counts, the secondary's, each other set's, whether softmax grew its sink and the seeds with
    one; the control; the students' sizes and scale."""
    # v2's words and later studies' (v1's report predates them)
    v2 = results.get('claim_set', 'v1') != 'v1'
    lines = []
    for arm in ('kd', 'ce'):
        if any(r['arm'] == arm for r in results['runs']):
            kd = (f" (distilled from softmax teachers {teachers_in_words(results)})"
                  if arm == 'kd' else '')
            grown = ("Seeds with Gu et al.'s Sink₁ ≥ 1/16 (v2's rule, fixed before its runs), per "
                     f"variant: {sink_counts(results, arm, 'sink_grown16')}" if v2 else
                     "Seeds with Gu et al.'s Sink₁ > 0 (one head over 0.3 in one of 100 samples is "
                     f"enough), per variant: {sink_counts(results, arm)}")
            lines += [f"In the {arm.upper()} arm{kd}, {counts_in_words(results, arm)}.",
                      *secondary_counts(results, arm), *other_counts(results, arm),
                      sink_sentence(results, arm), f"{grown}."]
    lines += control_sentences(results)
    counts = variant_sizes(results)
    if v2 and counts:
        lines.append(f"The students: {', '.join(f'{v} {n:,}' for v, n in counts.items())} "
                     f"parameters, {results['layers']} layers, "
                     f"{results['recipe']['tokens'] / 1e6:.1f}M tokens a run ({PAPER_SCALE}): a "
                     "test of the mechanism, not of the paper's scale.")
    else:
        lines.append(f"One small model ({results['layers']} layers) at "
                     f"{results['recipe']['tokens'] / 1e6:.1f}M tokens a run: a test of the "
                     "mechanism, not of the paper's scale.")
    return [line for line in lines if line]


def variant_sizes(results):
    """{variant: parameters} of the studied variants, from their runs' settings (model.py on the
    meta device); {} where the records hold no settings (v1's)."""
    out = {}
    for r in results['runs']:
        if r['arm'] not in ('teacher', 'recipe') and 'settings' in r and r['variant'] not in out:
            out[r['variant']] = parameters(r['settings'])
    return out


def table_lines(results, arm):
    by = {}
    for r in results['runs']:
        if r['arm'] == arm:
            by.setdefault(r['variant'], []).append(r)
    lines = ['| variant | seeds | loss | first-token weight | share | first-or-null | '
             'value-weighted | Sink₁ (windows) | Sink₁ > 0 (100 x 64) | entropy | row-total spread '
             '| W8A8 ratio | knockout k=0 ratio | spikes k=9 |',
             '|---|' + '---|' * 13]
    for variant, runs in by.items():
        stat = lambda get, digits=3: fmt(sig.mean_std([get(r) for r in runs]), digits)
        m = lambda key: stat(MEASURES[key][1])
        lines.append(f"| {variant} | {', '.join(str(r['seed']) for r in runs)} | {m('loss')} | "
                     f"{m('weight')} | {m('share')} | {m('first_or_null')} | "
                     f"{stat(lambda r: layer_mean(r['value_weighted_first']))} | "
                     f"{stat(lambda r: r['sink_rate'], 2)} | "
                     f"{int(sum(MEASURES['sink_grown'][1](r) for r in runs))} of {len(runs)} | "
                     f"{m('entropy')} | {m('row_spread')} | {m('w8a8')} | {m('knockout0')} | "
                     f"{stat(lambda r: r['spikes']['9'], 1)} |")
    return lines


def alpha_lines(results, arm):
    """Affine's alpha (Eq. 7) on the windows, per variant that has one: its mean, its spread across
    queries and the shares clipped at 0 and 1 (probes.alpha_summary), means over layers, mean ± std
    over seeds; a spread near 0 would mean a scale that ignores its input (what weight decay on
    alpha_proj could cause: the control arm)."""
    by = {}
    for r in results['runs']:
        if r['arm'] == arm and 'alpha_std' in r:
            by.setdefault(r['variant'], []).append(r)
    if not by:
        return []
    m = lambda runs, key: fmt(sig.mean_std([layer_mean(r[key]) for r in runs]))
    return ['| variant | alpha mean | alpha spread across queries | at 0 | at 1 '
            '|', '|---|---|---|---|---|'] + [
        f"| {v} | {m(runs, 'alpha_window_mean')} | {m(runs, 'alpha_std')} | "
        f"{m(runs, 'alpha_at_0')} | {m(runs, 'alpha_at_1')} |" for v, runs in by.items()] + ['']


def claims_table(claim_set='v1', variants=()):
    """The claims as fixed before the runs, one row each (the report and docs/analysis.md show
    it)."""
    lines = ['| id | family | source | claim | measure | test |', '|---|---|---|---|---|---|']
    unpaired = ('exact permutation (kd: within teachers)' if claim_set == 'v1'
                else 'exact sign-flip, paired by seed')
    for cid, family, source, measure, low, direction, high in claim_list(claim_set, variants):
        test = "Fisher's exact" if measure in FISHER else unpaired
        lines.append(f"| {cid} | {family} | {source} | {low} {direction} {high} | "
                     f"{MEASURES[measure][0]} | {test} |")
    return lines


def report_lines(results):
    """The report: its command; at a glance, its table, sentences and figures
    (study_findings.report_top); what it found, a bullet each; what goes against the paper; then
    every claim with its numbers, the reading, each arm's measures and the claims as fixed."""
    # study_findings reads this module's claims and words: imported when a report is written, so
    # that neither module needs the other first
    from study import study_findings
    r0 = results
    lead, found = confounds(results)
    lines = ['# The sink study', '',
             f"Command: `{r0['command']}`. Machine: {r0['machine']}. Runs: {len(r0['runs'])} "
             f"records; {per_run_times(r0)}.", '', *study_findings.report_top(results),
             '## What the study found', '', *(f"- {s}" for s in in_words(results)),
             *sealed_meaning_lines(results), *study_findings.report_words(results),
             *([lead, *(f"- ({i}) {text}{';' if i < len(found) else '.'}"
                        for i, text in enumerate(found, 1)), ''] if found else []),
             *study_findings.against_section(results), *teacher_level_lines(results),
             '## Every claim, with its numbers', '',
             f"Corpus: {describe_corpus(r0['corpus'])}. Every {r0['context']}-token window starts "
             f"with token {r0['bos_id']} (<|endoftext|>). Recipe: {r0['recipe_text']}. Uniform "
             f"attention would put {r0['uniform_first_token']:.4f} on the first token.", '',
             tests_sentence(results), *verdict_lines(results), '',
             "For scale, a real pretrained model, SmolLM2-135M-Instruct, puts "
             f"{SMOLLM2['first_token_mean']} of its attention on the first token on average over "
             f"its 30 layers, {SMOLLM2['first_token_max']} in its largest layer "
             f"({SMOLLM2['source']}).", '', *reading_lines(results)]
    for arm in ('kd', 'ce', 'control', DECAY, 'recipe', 'teacher'):
        if any(r['arm'] == arm for r in results['runs']):
            lines += ["## "
                      f"{arm_title(results, arm)}", '', *table_lines(results, arm), '',
                      *alpha_lines(results, arm)]
            if os.path.exists(os.path.join(ROOT, results['report_dir'], f'fig4_{arm}.png')):
                lines += [f"![Figure 4, {arm}](fig4_{arm}.png)", '',
                          f"![curves, {arm}](curves_{arm}.png)", '']
    lines += ["## The claims, as "
              f"{'fixed before the runs' if sealed(results) else 'registered (not sealed)'}", '',
              *claims_table(results.get('claim_set', 'v1'), results.get('variants', ())), '',
              'Columns of the tables: means ± std over seeds of the last evaluation (per layer, '
              'averaged over layers) on the same fixed validation windows; the end-of-run measures '
              '(Sink₁ in Gu et al.\'s setting, W8A8, the knockout, the row-total spread) on the '
              'run\'s checkpoint. docs/analysis.md defines each.']
    if results['excluded']:
        lines += ['', f"Records left out (another recipe): {', '.join(results['excluded'])}."]
    if results['missing']:
        lines += ['', f"Planned runs without a record yet ({len(results['missing'])}; the same "
                      f"command trains them): {', '.join(results['missing'])}."]
    return lines


def sealed_meaning_lines(results):
    """A bullet for each claim whose outcomes the seal gave a meaning (SEALED_MEANINGS): its
    verdict, and what the seal said beforehand that verdict would mean."""
    lines = []
    for c in results['claims']:
        word = c['verdict'].split(' (')[0]
        meaning = SEALED_MEANINGS.get(c['id'], {}).get(word)
        if meaning and c.get('p_holm') is not None:
            said = f"{word}{' ' if meaning.startswith('(') else ': '}{meaning}"
            lines.append(f"- {c['source']}, {c['low']} {c['direction']} {c['high']}: {word} "
                         f"(p = {c['p_holm']:.2g}). What the seal said beforehand this outcome "
                         f"would mean (docs/analysis.md): \"{said}.\"")
    return lines


def teacher_level_lines(results):
    """The primary family's paired claims tested again over the teachers (teacher_level_p), a row
    each: information beside the verdict, not a verdict; [] where no claim has that test."""
    rows = [c for c in results['claims']
            if c['family'] == 'primary' and c.get('p_teacher') is not None]
    if not rows:
        return []
    n = len(results['teachers'])
    return ["## Over the teachers (information, not a verdict)", '',
            f"Each primary claim's test again, with the {n} teachers as the units: the exact "
            "sign-flip test on each teacher's mean paired difference of its students "
            f"(study_results.teacher_level_p), whose least p is 2/2^{n} = {2 / 2 ** n:.2g}; the "
            "secondary family's are each claim's p_teacher in results.json.", '',
            '| claim | p over the pairs | Holm-adjusted | p over the teachers |',
            '|---|---|---|---|'] + [
        f"| {c['source']}: {c['low']} {c['direction']} {c['high']} on "
        f"{MEASURE_WORDS.get(c['measure'], c['measure'])} | {c['p']:.2g} | {c['p_holm']:.2g} | "
        f"{c['p_teacher']:.2g} |" for c in rows] + ['']


def sealed(results):
    """Whether every record names a seal (study/seal_study.py): only then can the tests be shown to
    predate them."""
    return bool(results['runs']) and all(r.get('seal') for r in results['runs'])


def when_fixed(results):
    """When the claims and tests were fixed, as far as the records can show it (v1's were not
    sealed, and its records hold no start time)."""
    return ("fixed before the runs" if sealed(results) else
            "registered in docs/analysis.md, not sealed: the records hold no start time, so "
            "whether the tests were fixed before the runs cannot be shown")


def tests_sentence(results):
    """How the claims were tested (significance.py): v2's matched pairs by sign flips, v1's groups
    by permutations."""
    tests = ("the per-seed differences of matched pairs (seed s of every variant: the same batches "
             "and the same initial values of every shared tensor) by the exact two-sided sign-flip "
             "test, seeds with Sink₁ ≥ 1/16 by Fisher's exact "
             "test" if results.get('claim_set', 'v1') != 'v1' else
             "per-seed values by an exact two-sided permutation test (kd: permuted within a "
             "teacher), seeds with a sink by Fisher's exact test")
    return (f"Tests ({when_fixed(results)}; study/significance.py): {tests}, Holm's correction "
            f"within each arm's family at {sig.ALPHA}; intervals are 95% percentile bootstraps "
            f"({sig.BOOTSTRAP_SAMPLES:,} resamples, seeded); a group with fewer than "
            f"{sig.MIN_SEEDS} seeds gives numbers only. \"Seeds needed\": the normal approximation "
            f"at Holm's strictest level with power {sig.POWER}, never below the exact test's "
            "floor.")


def per_run_times(results):
    seconds = {}
    for r in results['runs']:
        seconds.setdefault(r['arm'], []).append(r['seconds'])
    return '; '.join(f"a {arm} run's steps {minutes(statistics.fmean(s))} on "
                     "average" for arm, s in seconds.items())


def sink_sentence(results, arm):
    """Whether the recipe grew the sink the claims are about: softmax's seeds with Gu et al.'s
    Sink_1 > 0 (v1's rule) or >= 1/16 (v2's)."""
    v2 = results.get('claim_set', 'v1') != 'v1'
    grown = [MEASURES['sink_grown16' if v2 else 'sink_grown'][1](r) for r in results['runs']
             if r['arm'] == arm and r['variant'] == SOFTMAX and r['seed'] != RECIPE_SEED]
    if not grown:
        return f"No {arm} softmax run has a record yet."
    sentence = (f"Softmax had Gu et al.'s Sink₁ {'≥ 1/16' if v2 else '> 0'} (100 x 64) in "
                f"{int(sum(grown))} of {len(grown)} {arm} seeds")
    if sum(grown) < 2 / 3 * len(grown):
        return sentence + (": fewer than two in three, so the recipe did not reliably grow the "
                           "sink the claims are about, and a first-token claim here compares "
                           "variants that may all lack one.")
    return sentence + '.'


def pilot_lines(results):
    """docs/analysis.md's pilot table: per arm and primary claim, the pilot's means and spread, the
    raw p, and the seeds per variant a difference of that size would need
    (significance.seeds_needed: the power calculation); with the time of a run and of its end-of-run
    measures."""
    lines = [' '.join(sink_sentence(results, arm) for arm in ('kd', 'ce'))
             + f" Runs: {per_run_times(results)}; the end-of-run measures took "
             f"{statistics.fmean(r['end_seconds'] for r in results['runs']):.1f} s a run on "
             "average.", '',
             '| arm | claim | low: mean ± std | high: mean ± std | difference | p (exact) | seeds '
             'needed |',
             '|---|---|---|---|---|---|---|']
    for r in results['claims']:
        if r['family'] == 'primary' and r['p'] is not None:
            lines.append(f"| {r['arm']} | {r['source']}: {r['low']} {r['direction']} {r['high']} "
                         f"({r['measure']}) | {g(r['mean'][0])} ± {g(r['std'][0])} | "
                         f"{g(r['mean'][1])} ± {g(r['std'][1])} | {g(r['difference'])} | "
                         f"{g(r['p'])} | {r['needed'] or 'no difference'} |")
    return lines


def describe_corpus(corpus):
    if corpus['source'] != 'stdlib':
        return f"prepare_data.py --source={corpus['source']} ({corpus['data_dir']})"
    return (f"Python {corpus['python']}'s standard library, {corpus['files']:,} .py files, "
            f"{corpus['bytes']:,} bytes, sha256 {corpus['sha256'][:16]}… (another Python version "
            "has other files: the numbers move slightly)")


def figures(results, out_dir):
    """Per arm: fig4_<arm>.png, the per-layer first-token weight and share, mean ± std over seeds,
    per variant; curves_<arm>.png, the first-token weight (mean over layers) and Gu's Sink_1 on the
    windows against tokens; and study_findings.figures' (rows_<arm>.png, claims_<arm>.png)."""
    from lmkit.stats import pyplot
    from study import study_findings  # (as in report_lines)
    study_findings.figures(results, out_dir)
    plt = pyplot()
    for arm in ('kd', 'ce', 'control', DECAY, 'recipe'):
        by = {}
        for r in results['runs']:
            if r['arm'] == arm:
                by.setdefault(r['variant'], []).append(r)
        if not by:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key, title in ((axes[0], 'first_token_weight', 'weight on the first token (raw)'),
                               (axes[1], 'first_token_share', "first token's share of the row")):
            for variant, runs in by.items():
                layers = list(zip(*[r[key] for r in runs]))
                ax.errorbar(range(1, len(layers) + 1), [statistics.fmean(v) for v in layers],
                            yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in layers],
                            marker='o', capsize=3, label=variant)
            ax.axhline(results['uniform_first_token'], color='grey', linestyle=':',
                       label='uniform attention')
            ax.set(title=f"Figure 4 ({arm}): {title}", xlabel='layer', ylabel=key.replace('_', ' '))
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f'fig4_{arm}.png'), dpi=110)
        plt.close(fig)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for variant, runs in by.items():
            for i, run in enumerate(runs):
                tokens = [p['tokens'] / 1e6 for p in run['curve']]
                style = dict(color=f"C{list(by).index(variant)}", label=variant if i == 0 else None,
                             linewidth=1)
                axes[0].plot(tokens,
                             [statistics.fmean(p['first_token_weight']) for p in run['curve']],
                             **style)
                axes[1].plot(tokens, [p['sink_rate'] for p in run['curve']], **style)
        axes[0].set(title=f"first-token weight, mean over layers ({arm})",
                    xlabel='training tokens (M)', ylabel='weight')
        axes[1].set(title=f"Gu et al.'s Sink_1^{SINK_THRESHOLD} on the windows "
                          f"({arm})", xlabel='training tokens (M)',
                    ylabel='share of (window, layer, head)')
        for ax in axes:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f'curves_{arm}.png'), dpi=110)
        plt.close(fig)

# -----------------------------------------------------------------------------
# The reading: what the records say beyond the registered claims (study/study_reading.py), in words


def pairs_words(r):
    k_n = r.get('below')
    return f"; {r['low']} lower in {k_n[0]} of {k_n[1]} pairs" if k_n else ''


def unmeasured(rows):
    """One sentence for the claims whose measure these records do not hold (a measure added after
    them)."""
    ids = [r['id'] for r in rows if r['p'] is None]
    return (f"Not measured (no such value in these records): {', '.join(ids)}." if ids else '')


def with_pairs(r):
    return claim_line(r).removesuffix('.') + pairs_words(r) + '.'


def layers_words(layers):
    if not layers:
        return 'no layer'
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}–{layers[-1]}"
    return f"layers {', '.join(map(str, layers))}"


def span(values):
    return f"{min(values):.2f}–{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def part_words(w, part, uniform):
    """What one part of the layers (softmax's sink layers, or the rest) holds of a first-token
    difference."""
    low, high, layers = w['low'], w['high'], part['layers']
    at = lambda name, side: [w[name][side][k - 1] for k in layers]
    # its part of the mean over layers
    contribution = sum(w['gap'][k - 1] for k in layers) / len(w['gap'])
    share = f" ({part['gap_fraction']:.0%})" if part['gap_fraction'] is not None else ''
    words = (f"{layers_words(layers)} contribute{'s' * (len(layers) == 1)} "
             f"{contribution:+.4f}{share}")
    softmax = [w['softmax_weight'][k - 1] for k in layers]
    if layers and part['layers'] != w['sink_layers'] and all(x < uniform for x in softmax):
        words += (", where softmax's own first-token weight "
                  f"({', '.join(f'{x:.3f}' for x in softmax)}) is below uniform attention's "
                  f"{uniform:.3f}")
    p = f", p = {g(part['share_p'])}" if part['share_p'] is not None else ''
    below = f", {low} lower in {part['share_below'][0]} of {part['share_below'][1]} pairs" \
        if part['share_below'] else ''
    words += (f"; there, by share, {low} {part['share'][0]:.3f} against {high} "
              f"{part['share'][1]:.3f} (exploratory{p}{below}), with row totals {low} "
              f"{span(at('row_total', 0))} against {high} {span(at('row_total', 1))} and null mass "
              f"{span(at('null_mass', 0))} against {span(at('null_mass', 1))}")
    if rows_not_share(w, part):
        words += (": the raw difference there is not in the share of the row, but in how much the "
                  "rows hold")
    return words


def rows_not_share(w, part):
    """Whether a part of the layers holds a first-token difference in how much the rows hold, not
    in the share: the share does not differ there (p >= ALPHA), the part holds at least half of the
    difference, and the rows' totals differ the same way."""
    at = lambda side: statistics.fmean(w['row_total'][side][k - 1] for k in part['layers'])
    contribution = sum(w['gap'][k - 1] for k in part['layers'])
    return (part['share_p'] is not None and part['share_p'] >= sig.ALPHA
            and (part['gap_fraction'] or 0) >= 0.5 and (at(0) - at(1)) * contribution > 0)


def where_lines(w, uniform):
    """Where one first-token comparison's raw-weight difference comes from: a line, then a bullet
    per part of the layers."""
    rates = ', '.join(f'{x:.2f}' for x in w['softmax_sink_rate'] or [])
    total = statistics.fmean(w['gap'])
    return [f"{w['low']} − {w['high']} ({w['arm']} arm), first-token weight {total:+.4f} (mean "
            f"over layers; softmax's Gu et al. Sink₁ per layer {rates}, at least 1/16 in "
            f"{layers_words(w['sink_layers'])}):"] + [
        f"- {part_words(w, part, uniform)}." for part in w['parts'] if part['layers']]


def where_table(w):
    lines = [f"| layer | softmax's Sink₁ | weight {w['low']} / {w['high']} | share | row total | "
             "null mass |",
             '|---|---|---|---|---|---|']
    for k in range(len(w['gap'])):
        pair = lambda name: (f"{w[name][0][k]:.4f} / {w[name][1][k]:.4f}"
                             if w[name][0] and w[name][1] else '—')
        rate = f"{w['softmax_sink_rate'][k]:.2f}" if w['softmax_sink_rate'] else '—'
        lines.append(f"| {k + 1} | {rate} | {pair('weight')} | {pair('share')} | "
                     f"{pair('row_total')} | {pair('null_mass')} |")
    return lines


def payoff_words(p):
    """The payoff measures' ranges in one arm, and whether this scale can test the payoff: at W8A8,
    or only at a narrower format the primary family tests (v3's W8A4); a line, then a bullet per
    measure and the verdict."""
    ranges = lambda key, digits: ', '.join(
        f"{v} {x[key][0]:.{digits}f}–{x[key][1]:.{digits}f}" for v, x in p['variants'].items()
        if x.get(key))
    narrower = p.get('narrower') or {}  # (results.json written before it lack it)
    floor = (f"W8A8 moves no run's loss by more than {PAYOFF_FLOOR:.0%} (at most "
             f"{p['largest_w8a8_change']:.2%})")
    left = [m for m, (_, most) in narrower.items() if most > PAYOFF_FLOOR]
    if not p['at_floor']:
        verdict = f"W8A8 moves some run's loss by {p['largest_w8a8_change']:.2%}"
    elif left:
        moves = ', '.join(f"{MEASURE_NAMES[m]} by {narrower[m][0]:.1%}–{narrower[m][1]:.1%}"
                          for m in left)
        verdict = (f"{floor}, {moves}: at this scale the payoff can show only at "
                   f"{' and '.join(MEASURE_NAMES[m] for m in left)}, which its primary claims test")
    else:
        verdict = (f"{floor}: at this scale no variant has a quantization cost to remove, so this "
                   "study cannot test the payoff")
    return [f"The payoff's measures ({p['arm']} arm, per variant over its seeds):",
            f"- the W8A8 loss ratio {ranges('w8a8', 4)};",
            *(f"- the {MEASURE_NAMES[m]} loss ratio {ranges(m, 4)};" for m in narrower),
            f"- the attention output's kurtosis, largest layer, {ranges('kurtosis', 1)};",
            f"- the residual stream's max |x|, largest layer, {ranges('residual_max', 1)}.",
            f"- {verdict}."]


def teacher_words(t):
    """The teachers' own sink and held-out loss beside the kd softmax students': a line, a bullet
    per teacher, and one for the students."""
    if not t:
        return []
    per_layer = lambda xs: ', '.join(f'{x:.3f}' for x in xs)
    s = t['students']
    top = max(max(x['first_token_weight']) for x in t['teachers'])
    grew = (f": every student's largest layer ({span(s['largest'])}) puts more on the first token "
            f"than {'either' if len(t['teachers']) == 2 else 'any'} teacher's largest "
            f"({top:.3f}), so the students' sink is not their "
            "teachers'"
            if min(s['largest']) > top
            else f": the students' largest layers put {span(s['largest'])} on it, the teachers' at "
                 f"most {top:.3f}")
    return (["The teachers' own first-token weight per layer:"]
            + [f"- {x['name']} {per_layer(x['first_token_weight'])} (held-out loss "
               f"{x['val_loss']:.3f});" for x in t['teachers']]
            + [f"- The kd softmax students ({s['seeds']} seeds): "
               f"{per_layer(s['first_token_weight'])} (held-out loss {s['val_loss']:.3f}){grew}."])


READING_INTRO = ("Nothing here was fixed before the runs: study/study_reading.py computes it from "
                 "the records, for every study alike, so that no count of verdicts stands on a "
                 "subset of what the records show.")


def reading_lines(results):
    """The report's section on the reading (results.json's 'reading'); [] where the results hold
    none."""
    reading = results.get('reading')
    if not reading:
        return []
    lines = ['## What the records say beyond the registered claims '
             '(exploratory)', '', READING_INTRO, '']
    for arm in ('kd', 'ce'):
        for label, rows in by_label(reading_rows(results, 'other_claims', arm)).items():
            tested = [r for r in rows if r['p'] is not None]
            lines += [f"Claims {label.rsplit(';', 1)[0]} ({arm} arm; the same tests on these "
                      "records, Holm over these "
                      f"{len(tested)}):"] + [with_pairs(r) for r in tested] + [unmeasured(rows), '']
        rows = reading_rows(results, 'loss_claims', arm)
        if rows:
            lines += [f"The held-out loss beside the loss claims ({arm} arm; Holm over these "
                      f"{len(rows)}):"] + [
                with_pairs(r) for r in rows] + ['']
    for w in reading['where_from']:
        lines += [*where_lines(w, results['uniform_first_token']), '', *where_table(w), '']
    for p in reading['payoff']:
        lines += [*payoff_words(p), '']
    return lines + ([*teacher_words(reading['teachers']), ''] if reading['teachers'] else [])


def payoff_pilot_lines(results):
    """docs/analysis.md's block on v3's payoff pilot (docs/sink_study_v3/pilot/results.json): per
    softmax seed each candidate's loss ratio, W8A8's, the FFN output's kurtosis and largest absolute
    value (largest layer), and the measure payoff_choice picks, or that none leaves its floor."""
    runs = [r for r in results['runs'] if r['variant'] == SOFTMAX and r['arm'] == 'kd']
    chosen, _ = payoff_choice(runs)
    names = ['W8A8', *(MEASURE_NAMES[m] for m in PAYOFF_CANDIDATES), 'FFN kurtosis', 'FFN max-abs']
    lines = ['| softmax seed | ' + ' | '.join(names) + ' |', '|---|' + '---|' * len(names)]
    for r in runs:
        values = [r['end']['w8a8']['ratio'], *(MEASURES[m][1](r) for m in PAYOFF_CANDIDATES)]
        lines.append(f"| {r['seed']} | " + ' | '.join(f'{x:.4f}' for x in values) + ' | '
                     + ' '
                       '| '.join(f"{MEASURES[m][1](r):.2f}"
                                 for m in ('ffn_kurtosis', 'ffn_max_abs')) + ' |')
    verdict = (f"The rule chooses {MEASURE_NAMES[chosen]}: its ratio is above {1 + PAYOFF_FLOOR:g} "
               "in every pilot seed"
               if chosen else f"No candidate's ratio is above {1 + PAYOFF_FLOOR:g} in every pilot "
                              "seed: the payoff stays out of v3's primary family, and every "
                              "candidate is a secondary claim")
    return lines + ['', f"{verdict} ({len(runs)} seeds; teacher {', '.join(results['teachers'])})."]
