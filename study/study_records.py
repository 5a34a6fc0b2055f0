"""
The sink study's records: one JSON file per finished run, report_dir/runs/<name>.json, and the one
place that reads them. Every record is validated before it is used (validate: each field's type and
range, finite numbers only, the file's name from its contents); a file in runs/ that is not a valid
record stops the study with one line naming it. Which records a study may reuse is decided here too
(reuse_problems). docs/analysis.md, "The records", is the schema in prose.
"""
import dataclasses
import hashlib
import json
import math
import os
import re

from lmkit.errors import RunError
from model import ATTENTIONS
from study.study_results import DECAY, KD_ARMS, RECIPE_SEED, SOFTMAX

SCHEMA_VERSION = 2
# teacher: a kd teacher of its own shape (v2's); v1's are ce runs; decay: v4's kd runs under v1's
# decay rule
ARMS = ('recipe', 'ce', 'kd', 'control', DECAY, 'teacher')
NO_DECAY = ['alpha_proj', 'g_proj']  # the control arm's matrices without weight decay
SPIKE_KS = (6, 9)  # Table 5's k of median + k MAD
# end.payoff (sink_study.end_measures; records before it lack it): the losses and ratios at coarser
# widths than W8A8, (weight bits, input bits), whose ratio sat at its floor at this scale; and
# Bondarenko et al.'s outliers per layer
PAYOFF_BITS = ((8, 6), (8, 4), (4, 8))
PAYOFF_OUTLIERS = tuple(f'{module}_{kind}{part}' for module,
                        kinds in (('ffn', ('max_abs', 'kurtosis')),
                                  ('attention', ('max_abs', 'kurtosis')),
                                  ('residual', ('max_abs',)))
                        for kind in kinds for part in ('', '_after_first'))
RECIPE_KEYS = ('n_layer', 'n_head', 'n_kv_head', 'n_embd', 'block_size', 'global_batch_size',
               'learning_rate', 'min_lr',
               'warmup_iters', 'decay_frac', 'weight_decay', 'beta1', 'beta2', 'grad_clip',
               'max_iters', 'first_token', 'attention_windows', 'kd_alpha', 'kd_temperature')
# train.py keys a record's settings may differ in from the study's: set per run by design, or only
# how a run executes
PER_RUN_KEYS = ('seed', 'attention', 'out_dir', 'teacher', 'no_decay')
EXECUTION_KEYS = ('compile', 'device', 'log_interval', 'init_from', 'overwrite', 'keep_previous',
                  'peak_flops',
                  'wandb_log', 'wandb_project', 'wandb_run_name', 'dry_run', 'dry_run_world_size',
                  'dry_run_gpu_gib')

TOLERANCE = 1e-6  # float rounding at a range's ends (a null mass of -0.0, a row total of 1.0000001)
REAL = (-math.inf, math.inf)
NONNEGATIVE = (0.0, math.inf)
FRACTION = (0.0, 1.0)
# an attention weight: affine's alpha_i p_ij + beta_i, alpha and alpha_ma in [0, 1], |beta_i| <= 1 /
# N (model.py)
WEIGHT = (-1.0, 2.0)
KURTOSIS = (-2.0, math.inf)  # excess kurtosis is at least -2
# every measure a record may hold: (shape, range); layer: one number per layer, head: per layer, one
# per head
MEASURES = dict(
    val_loss=('scalar', NONNEGATIVE), val_ppl=('scalar', (1.0, math.inf)),
                attn_logit_mean=('scalar', REAL),
    attn_logit_abs_mean=('scalar', NONNEGATIVE), sink_rate=('scalar', FRACTION),
    sink_rate_mean_head=('scalar', FRACTION), sink_rate_null_slot=('scalar', FRACTION),
    sink_rate_raw=('scalar', FRACTION),
    first_token_weight=('layer', WEIGHT), first_token_per_head=('head', WEIGHT),
                per_head=('head', WEIGHT),
    # unbounded where a row total is 0
    first_token_share=('layer', REAL), first_token_share_per_head=('head', REAL),
    null_mass=('layer', FRACTION), null_mass_per_head=('head', FRACTION),
                sink_mass=('layer', FRACTION),
    first_or_null=('layer', WEIGHT), first_or_null_per_head=('head', WEIGHT),
    sink_rate_per_layer=('layer', FRACTION), sink_rate_null_slot_per_layer=('layer', FRACTION),
    sink_rate_raw_per_layer=('layer', FRACTION),
    negative_rows=('layer', FRACTION), value_weighted_first=('layer', FRACTION),
    value_weighted_first_per_head=('head', FRACTION), entropy=('layer', NONNEGATIVE),
                row_sum=('layer', FRACTION),
    alpha_window_mean=('layer', FRACTION), alpha_mean=('layer', FRACTION),
                alpha_ma=('layer', FRACTION),
    alpha_std=('layer', NONNEGATIVE), alpha_at_0=('layer', FRACTION),
                alpha_at_1=('layer', FRACTION),
    attention_max_abs=('layer', NONNEGATIVE), attention_max_abs_after_first=('layer', NONNEGATIVE),
    attention_kurtosis=('layer', KURTOSIS), attention_kurtosis_after_first=('layer', KURTOSIS),
    residual_max_abs=('layer', NONNEGATIVE), residual_max_abs_after_first=('layer', NONNEGATIVE),
    sinks=('layer', REAL),
)
REQUIRED_MEASURES = ('val_loss', 'first_token_weight', 'per_head', 'first_token_share', 'entropy',
                     'row_sum', 'sink_rate', 'sink_rate_per_layer', 'null_mass', 'first_or_null')
OPTIONAL = ('settings', 'corpus', 'commit', 'dirty', 'started', 'first_started', 'finished',
            'digest',
            'spikes_after_warmup',
            # not in records before them; seal: a sealed study's records alone
            'spikes_after_warmup_window', 'seal')
# report_dir/seal.json: a sealed study's seal (read_seal; study/seal_study.py writes it)
SEAL_FILE = 'seal.json'
COMMIT = re.compile(r'[0-9a-f]{40}')


def record_name(arm, variant, seed):
    """A record's name (and its file's, .json added): the recipe's seed is a ce run by name."""
    return f"{'ce' if arm == 'recipe' else arm}_{variant}_s{seed}"


def digest(record):
    """sha256 of the record less its digest, as canonical JSON: an edit after the study wrote it is
    seen."""
    body = json.dumps({k: v for k, v in record.items() if k != 'digest'}, sort_keys=True,
                      separators=(',', ':'), ensure_ascii=False, allow_nan=False)
    return 'sha256:' + hashlib.sha256(body.encode()).hexdigest()


class Invalid(ValueError):
    """What is wrong with a record (validate); read_records adds the file."""


def number(value, where, bounds=REAL, integer=False):
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise Invalid(f"{where} is {json.dumps(value)[:40]}, not "
                      f"{'an integer' if integer else 'a number'}")
    if not math.isfinite(value):
        raise Invalid(f"{where} is {value}, not a finite number")
    low, high = bounds
    if not low - TOLERANCE <= value <= high + TOLERANCE:
        raise Invalid(f"{where} is {value}, outside its range [{low}, {high}]")
    return value


def shaped(value, where, shape, bounds, n_layer, n_head):
    if shape == 'scalar':
        return number(value, where, bounds)
    if not isinstance(value, list) or len(value) != n_layer:
        raise Invalid(f"{where} is not a list of {n_layer} layers")
    for i, row in enumerate(value):
        if shape == 'head':
            if not isinstance(row, list) or len(row) != n_head:
                raise Invalid(f"{where}[{i}] is not a list of {n_head} heads")
            for h, x in enumerate(row):
                number(x, f"{where}[{i}][{h}]", bounds)
        else:
            number(row, f"{where}[{i}]", bounds)


def check_measures(fields, where, n_layer, n_head, required=()):
    for key in required:
        if key not in fields:
            raise Invalid(f"{where}{key} is missing")
    for key, value in fields.items():
        if key not in MEASURES:
            raise Invalid(f"{where}{key} is not a field of a record (schema {SCHEMA_VERSION})")
        if not (key == 'sink_mass' and value is None):  # null where the variant has no null slot
            shaped(value, where + key, *MEASURES[key], n_layer, n_head)


def check_identity(record):
    """The fields that place a run in the study: arm, variant, seed, teacher, no_decay, and the
    file's name."""
    arm, variant, seed, teacher = (record.get(k) for k in ('arm', 'variant', 'seed', 'teacher'))
    if arm not in ARMS:
        raise Invalid(f"arm is {json.dumps(arm)}, not one of {', '.join(ARMS)}")
    if variant not in ATTENTIONS:
        raise Invalid(f"variant is {json.dumps(variant)}, not one of model.py's "
                      f"{', '.join(ATTENTIONS)}")
    number(seed, 'seed', NONNEGATIVE, integer=True)
    if arm == 'recipe' and (seed, variant) != (RECIPE_SEED, SOFTMAX):
        raise Invalid(f"the recipe arm is {SOFTMAX}'s seed {RECIPE_SEED}, not {variant}'s seed "
                      f"{seed}")
    if arm == 'teacher' and variant != SOFTMAX:
        raise Invalid(f"variant is {variant}: a teacher is {SOFTMAX}")
    if arm in KD_ARMS:
        if not isinstance(teacher, str) or not re.fullmatch(rf'(ce|teacher)_{SOFTMAX}_s\d+',
                                                            teacher):
            raise Invalid(f"teacher is {json.dumps(teacher)}: a {arm} run names its teacher, "
                          f"ce_{SOFTMAX}_s<seed> or teacher_{SOFTMAX}_s<seed>")
    elif teacher is not None:
        raise Invalid(f"teacher is {json.dumps(teacher)}: a {arm} run has none")
    # the control leaves alpha_proj and g_proj out of the decay, the decay arm decays every matrix
    # (v1's rule); any other arm follows its recipe (v1: none, v2: both)
    allowed = {'control': [NO_DECAY], DECAY: [[]]}.get(arm, [[], NO_DECAY])
    if record.get('no_decay') not in allowed:
        raise Invalid(f"no_decay is {json.dumps(record.get('no_decay'))}; the {arm} arm's is "
                      f"{' or '.join(map(json.dumps, allowed))}")
    if record.get('name') != record_name(arm, variant, seed):
        raise Invalid(f"name is {json.dumps(record.get('name'))}, but its arm, variant and seed "
                      f"make it {record_name(arm, variant, seed)}")


def check_recipe(recipe):
    if not isinstance(recipe, dict) or set(recipe) != {*RECIPE_KEYS, 'tokens'}:
        raise Invalid(f"recipe does not hold exactly the keys {', '.join(RECIPE_KEYS)}, tokens")
    for key, value in recipe.items():
        if key != 'first_token':
            number(value, f"recipe.{key}", NONNEGATIVE, integer=key != 'learning_rate'
                   and isinstance(value, int))
    if recipe['tokens'] != recipe['max_iters'] * recipe['global_batch_size'] * recipe['block_size']:
        raise Invalid("recipe.tokens is not max_iters x global_batch_size x block_size")


def check_end(end, n_layer):
    """The end-of-run measures (sink_study.end_measures)."""
    try:
        gu, w8a8, knockout, spread = end['gu'], end['w8a8'], end['knockout'], end['row_total_std']
    except (TypeError, KeyError) as e:
        raise Invalid(f"end lacks {e}") from None
    number(gu.get('samples'), 'end.gu.samples', (1, math.inf), integer=True)
    number(gu.get('length'), 'end.gu.length', (1, math.inf), integer=True)
    check_measures({k: v for k, v in gu.items() if k not in ('samples', 'length')}, 'end.gu.',
                   n_layer, 1, required=('sink_rate', 'sink_rate_per_layer'))
    for key in ('fp', 'w8a8', 'ratio'):
        number(w8a8.get(key), f'end.w8a8.{key}', NONNEGATIVE)
    number(w8a8.get('calibration'), 'end.w8a8.calibration', (1, math.inf), integer=True)
    number(knockout.get('window'), 'end.knockout.window', (1, math.inf), integer=True)
    for key, value in knockout.items():
        if key != 'window':
            number(value, f'end.knockout.{key}', NONNEGATIVE)
    shaped(spread, 'end.row_total_std', 'layer', NONNEGATIVE, n_layer, 1)
    if 'payoff' in end:
        check_payoff(end['payoff'], n_layer)
    if 'heldout' in end:  # (v4's; records before it lack it)
        heldout = end['heldout']
        if not isinstance(heldout, dict) or set(heldout) != {'loss', 'windows', 'tokens'}:
            raise Invalid("end.heldout does not hold exactly loss, windows and tokens")
        number(heldout['loss'], 'end.heldout.loss', NONNEGATIVE)
        for key in ('windows', 'tokens'):
            number(heldout[key], f'end.heldout.{key}', (1, math.inf), integer=True)


def payoff_keys():
    """end.payoff's keys: per width of PAYOFF_BITS its loss (w8a6) and ratio over full precision
    (ratio_w8a6); per outlier measure of PAYOFF_OUTLIERS one number per layer."""
    widths = [f'w{weights}a{inputs}' for weights, inputs in PAYOFF_BITS]
    return (*widths, *(f'ratio_{w}' for w in widths), *PAYOFF_OUTLIERS)


def check_payoff(payoff, n_layer):
    """end.payoff (sink_study.end_measures): exactly payoff_keys(), losses and ratios at least 0,
    the outliers one number at least 0 per layer (Bondarenko et al.'s kurtosis, not the excess, is
    never negative)."""
    if not isinstance(payoff, dict):
        raise Invalid(f"end.payoff is {json.dumps(payoff)[:40]}, not an object of the payoff's "
                      "measures")
    missing = [key for key in payoff_keys() if key not in payoff]
    unknown = sorted(set(payoff) - set(payoff_keys()))
    if missing or unknown:
        raise Invalid(f"end.payoff lacks {', '.join(missing)}" if missing else
                      f"end.payoff.{unknown[0]} is not a field of a record (schema "
                      f"{SCHEMA_VERSION})")
    for key, value in payoff.items():
        if key in PAYOFF_OUTLIERS:
            shaped(value, f'end.payoff.{key}', 'layer', NONNEGATIVE, n_layer, 1)
        else:
            number(value, f'end.payoff.{key}', NONNEGATIVE)


def check_run(record, n_layer):
    tokens = record['recipe']['tokens']
    if record.get('tokens') != tokens:
        raise Invalid(f"tokens is {json.dumps(record.get('tokens'))}, not the recipe's {tokens}")
    number(record.get('seconds'), 'seconds', NONNEGATIVE)
    number(record.get('end_seconds'), 'end_seconds', NONNEGATIVE)
    for key in ('machine', 'ckpt'):
        if not isinstance(record.get(key), str) or not record[key]:
            raise Invalid(f"{key} is not a non-empty string")
    kd = record.get('final_kd_loss')
    if record['arm'] in KD_ARMS:
        number(kd, 'final_kd_loss', NONNEGATIVE)
    elif kd is not None:
        raise Invalid(f"final_kd_loss is {kd}: a {record['arm']} run has no KD loss")
    for key in ('spikes', 'spikes_whole_run', 'spikes_after_warmup'):
        if key == 'spikes_after_warmup' and record.get(key) is None:
            continue  # a record from before it, or a warm-up that reaches step 500
        counts = record.get(key)
        if not isinstance(counts, dict) or set(counts) != {str(k) for k in SPIKE_KS}:
            raise Invalid(f"{key} does not hold the counts of k = {', '.join(map(str, SPIKE_KS))}")
        for k, n in counts.items():
            number(n, f"{key}.{k}", NONNEGATIVE, integer=True)
    window = record.get('spikes_window')
    if not isinstance(window, list) or len(window) != 2 or window[0] != 0:
        raise Invalid("spikes_window is not [0, last step]")
    number(window[1], 'spikes_window[1]', NONNEGATIVE, integer=True)
    if 'spikes_after_warmup_window' in record:
        after = record['spikes_after_warmup_window']
        if not (isinstance(after, list) and len(after) == 2
                and all(isinstance(x, int) for x in after) and 0 <= after[0] <= after[1]):
            raise Invalid("spikes_after_warmup_window is not [warm-up, last step]")
    check_end(record.get('end'), n_layer)


def check_curve(curve, n_layer, n_head, tokens):
    if not isinstance(curve, list) or not curve:
        raise Invalid("curve is not a list of evaluations")
    last = 0
    for i, point in enumerate(curve):
        if not isinstance(point, dict):
            raise Invalid(f"curve[{i}] is not an evaluation")
        number(point.get('tokens'), f"curve[{i}].tokens", (last + 1, tokens), integer=True)
        last = point['tokens']
        check_measures({k: v for k, v in point.items() if k != 'tokens'}, f"curve[{i}].", n_layer,
                       n_head)
    if last != tokens:
        raise Invalid(f"curve ends at {last} tokens, not at the run's {tokens}")


def check_provenance(record):
    """What a record written since the schema learnt it holds about how it was made (OPTIONAL)."""
    if 'settings' in record:
        if not isinstance(record['settings'], dict):
            raise Invalid("settings is not train.py's settings of the run")
        if record.get('digest') is None:
            raise Invalid("it holds settings but no digest (the study writes both)")
    if 'corpus' in record and not (isinstance(record['corpus'], dict)
                                   and record['corpus'].get('checksums')):
        raise Invalid("corpus does not hold the checksums of the prepared data")
    for key in ('commit', 'started', 'first_started', 'finished'):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise Invalid(f"{key} is not a string")
    if record.get('dirty') not in (None, True, False):
        raise Invalid("dirty is not true, false or null")
    if record.get('seal') is not None and not COMMIT.fullmatch(str(record['seal'])):
        raise Invalid("seal is not a commit (40 hexadecimal digits)")
    if 'digest' in record:
        try:
            written = digest(record)
        except ValueError:  # strict JSON: the study never writes a NaN or an infinity
            raise Invalid("it holds NaN or an infinity, which the study never writes: it was "
                          "edited after the study wrote it") from None
        if record['digest'] != written:
            raise Invalid("its contents do not match its digest: it was edited after the study "
                          "wrote it")


FIXED = ('schema_version', 'name', 'arm', 'variant', 'seed', 'teacher', 'recipe', 'no_decay',
         'tokens', 'seconds',
         'machine', 'ckpt', 'final_kd_loss', 'spikes', 'spikes_window', 'spikes_whole_run', 'end',
         'end_seconds', 'curve')


def validate(record):
    """Raise Invalid naming the first field that is wrong; else return the record."""
    if not isinstance(record, dict):
        raise Invalid(f"it holds a JSON {type(record).__name__}, not a record (an object)")
    if record.get('schema_version') != SCHEMA_VERSION:
        raise Invalid(f"schema_version is {json.dumps(record.get('schema_version'))}, not "
                      f"{SCHEMA_VERSION}")
    check_identity(record)
    check_recipe(record.get('recipe'))
    n_layer, n_head = record['recipe']['n_layer'], record['recipe']['n_head']
    check_run(record, n_layer)
    check_curve(record.get('curve'), n_layer, n_head, record['tokens'])
    check_provenance(record)
    check_measures({k: v for k, v in record.items() if k not in FIXED + OPTIONAL}, '', n_layer,
                   n_head, required=REQUIRED_MEASURES)
    return record


def read_record(path):
    """One record file, validated: RunError naming the file and what is wrong."""
    aside = os.path.join(os.path.dirname(os.path.dirname(path)), 'set_aside')
    advice = f"move it out of runs/ (e.g. to {aside}/) and run the same command again"
    try:
        with open(path, encoding='utf-8') as f:
            record = json.load(f, parse_constant=lambda c: float(c))
        validate(record)
    except UnicodeDecodeError as e:
        raise RunError(f"{path}: byte {e.start} is not UTF-8, so this is not a record of the "
                       f"study; {advice}")
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not a record of the study (not JSON: {e.msg} at line {e.lineno}); "
                       f"{advice}")
    except Invalid as e:
        raise RunError(f"{path}: not a valid record of the study: {e}; {advice}")
    expected = record_name(record['arm'], record['variant'], record['seed']) + '.json'
    if os.path.basename(path) != expected:
        raise RunError(f"{path}: holds the record of {record['name']}, whose file is {expected}; "
                       f"{advice}")
    return record


def read_records(folder):
    """{name: record} of every file in folder (report_dir/runs), each validated; any other file is
    an error."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    records = {}
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            kind = 'a directory' if os.path.isdir(path) else 'a special file'
            raise RunError(f"{path}: not a record of the study ({kind}); move it out of runs/ and "
                           "run the same command again")
        record = read_record(path)
        records[record['name']] = record
    return records


# the gate's settings before it had kinds (model.GATES): a bool
GATE_BEFORE_KINDS = {False: 'none', True: 'elementwise'}


def comparable(settings):
    """A run's settings less the keys that may differ (PER_RUN_KEYS, EXECUTION_KEYS), as JSON would
    hold them, the gate's bool of older records as the kind it names."""
    kept = {k: v for k, v in settings.items() if k not in PER_RUN_KEYS + EXECUTION_KEYS}
    if isinstance(kept.get('gate'), bool):
        kept['gate'] = GATE_BEFORE_KINDS[kept['gate']]
    return json.loads(json.dumps(kept))


def reuse_problems(record, config, teacher, recipe, corpus, overrides):
    """Why a record cannot stand for a planned run (config: its RunConfig; [] if it can): its
    recipe, teacher, settings or corpus differ. A record from before settings were recorded (v1)
    holds only the recipe: it stands only where the command sets no train.py key beyond the
    recipe's, the per-run and the execution ones, on a corpus of the standard library (v1's)."""
    problems = []
    if record['recipe'] != recipe:
        problems += [f"{k} {record['recipe'].get(k)} -> {recipe.get(k)}" for k in recipe
                     if record['recipe'].get(k) != recipe.get(k)]
    if record['teacher'] != teacher:
        problems.append(f"teacher {record['teacher']} -> {teacher}")
    if record['no_decay'] != config.no_decay:
        problems.append(f"no_decay {record['no_decay']} -> {config.no_decay}")
    if 'settings' in record:
        old, new = comparable(record['settings']), comparable(dataclasses.asdict(config))
        problems += [f"{k} {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new))
                     if old.get(k) != new.get(k) and k not in recipe]
    else:
        problems += [f"{k} (a v1 record holds only the recipe)" for k in overrides
                     if k not in RECIPE_KEYS + PER_RUN_KEYS + EXECUTION_KEYS]
    if 'corpus' in record and record['corpus']['checksums'] != corpus['checksums']:
        problems.append("the corpus (its checksums differ)")
    elif 'corpus' not in record and corpus['source'] != 'stdlib':
        problems.append("the corpus (a v1 record trained on the standard library, this one is "
                        f"{corpus['source']})")
    return problems


def read_seal(report_dir):
    """report_dir/seal.json, checked: {commit, committed (UTC, ISO 8601), files: {path: sha256 of
    its bytes}}, every file the seal commit held outside docs/; None where the directory has
    none."""
    path = os.path.join(report_dir, SEAL_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            seal = json.load(f)
        if not (isinstance(seal, dict) and COMMIT.fullmatch(str(seal.get('commit'))) and
                isinstance(seal.get('committed'), str) and isinstance(seal.get('files'), dict)
                and seal['files']):
            raise ValueError("it needs commit (40 hexadecimal digits), committed and files")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RunError(f"{path}: not a seal ({e}): restore it from git") from None
    return seal


def file_sha256(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def unsealed_files(seal, root):
    """The seal's files whose bytes under root differ from the seal's (or that are missing),
    sorted."""
    return sorted(path for path, sha in seal['files'].items()
                  if not os.path.isfile(os.path.join(root, path))
                  or file_sha256(os.path.join(root, path)) != sha)
