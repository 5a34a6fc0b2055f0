"""
The six zero-shot tasks offline, for timing eval_zeroshot.py against lm-evaluation-harness 0.4.9 as
whole processes (tools/bench.py's harness section): rows in each task's own hub schema, of about the
tasks' usual lengths, made of English phrases (Python's own help topics, pydoc_data), written where
eval_zeroshot.py --data_dir reads them; and, for the harness, one task YAML per task that includes
the harness's own YAML and reads the same file (lm_eval --include_path). The words are not the
tasks' words, so accuracies mean nothing; the requests' shapes are what count.
"""
import json
import os
import random
import re

from lmkit.files import atomic_write
from lmkit.zeroshot import HUB

SIX_TASKS = ('arc_easy', 'arc_challenge', 'hellaswag', 'piqa', 'boolq', 'winogrande')
# each task's YAML in lm-evaluation-harness 0.4.9's lm_eval/tasks/
HARNESS_YAMLS = dict(arc_easy='arc/arc_easy.yaml', arc_challenge='arc/arc_challenge.yaml',
                     hellaswag='hellaswag/hellaswag.yaml', piqa='piqa/piqa.yaml',
                     boolq='super_glue/boolq/default.yaml', winogrande='winogrande/default.yaml')


def phrases(seed):
    """phrase(lo, hi): lo to hi consecutive words from a random place of Python's help topics."""
    from pydoc_data.topics import topics
    words = re.findall(r"[A-Za-z][A-Za-z']*", ' '.join(topics[name] for name in sorted(topics)))
    rng = random.Random(seed)

    def phrase(lo, hi):
        n = rng.randint(lo, hi)
        start = rng.randrange(len(words) - n)
        return ' '.join(words[start:start + n])
    return phrase, rng


def task_rows(task, n, seed=0):
    """n rows of task in its hub schema (the fields lmkit.zeroshot's builders read), lengths in
    words about the task's own: ARC questions of 10-30 and answers of 1-6 in 4 choices; HellaSwag
    contexts of 20-45, endings of 10-30; PIQA goals of 5-15, solutions of 8-35; BoolQ passages of
    60-140, questions of 5-10; WinoGrande sentences of 15-25, options of 1-2."""
    phrase, rng = phrases(f'{task}{seed}')
    rows = []
    for i in range(n):
        if task.startswith('arc'):
            rows.append(dict(id=str(i), question=phrase(10, 30) + '?',
                             answerKey='ABCD'[rng.randrange(4)],
                             choices=dict(text=[phrase(1, 6) for _ in range(4)],
                                          label=list('ABCD'))))
        elif task == 'hellaswag':
            rows.append(dict(ind=i, activity_label=phrase(1, 3).title(), ctx_a=phrase(15, 35) + '.',
                             ctx_b=phrase(4, 10), endings=[phrase(10, 30) + '.' for _ in range(4)],
                             label=str(rng.randrange(4)), split='val', split_type='indomain',
                             source_id=str(i)))
        elif task == 'piqa':
            rows.append(dict(goal=phrase(5, 15), sol1=phrase(8, 35), sol2=phrase(8, 35),
                             label=rng.randrange(2)))
        elif task == 'boolq':
            rows.append(dict(question=phrase(5, 10).lower(), passage=phrase(60, 140) + '.', idx=i,
                             label=rng.randrange(2)))
        else:
            before, after = phrase(6, 14), phrase(6, 11)
            rows.append(dict(sentence=f'{before} _ '
                                      f'{after}.', option1=phrase(1, 2), option2=phrase(1, 2),
                             answer=str(rng.randint(1, 2))))
    return rows


def write_tasks(data_dir, n_docs, seed=0):
    """<data_dir>/<task>/<split>.jsonl for each of SIX_TASKS: n_docs rows each. Returns {task: its
    file}."""
    paths = {}
    for task in SIX_TASKS:
        paths[task] = os.path.join(data_dir, task, HUB[task][2] + '.jsonl')
        os.makedirs(os.path.dirname(paths[task]), exist_ok=True)
        with atomic_write(paths[task]) as f:
            f.writelines(json.dumps(row) + '\n' for row in task_rows(task, n_docs, seed))
    return paths


def write_harness_yamls(yaml_dir, harness_tasks_dir, paths):
    """One YAML per task for lm_eval --include_path=yaml_dir: the harness's own task (its prompt,
    choices and metrics, included from harness_tasks_dir, its lm_eval/tasks) reading paths[task]
    instead of the hub. Returns the tasks' names there (bench_<task>)."""
    os.makedirs(yaml_dir, exist_ok=True)
    names = []
    for task, path in paths.items():
        split = HUB[task][2]
        names.append(f'bench_{task}')
        with atomic_write(os.path.join(yaml_dir, f'bench_{task}.yaml')) as f:
            splits = ''.join(f"{name}_split: {split if split == name else 'null'}\n"
                             # the one split written
                             for name in ('training', 'validation', 'test'))
            f.write(f"include: {os.path.join(harness_tasks_dir, HARNESS_YAMLS[task])}\n"
                    f"task: bench_{task}\ntag: []\ndataset_path: json\ndataset_name: null\n{splits}"
                    f"dataset_kwargs:\n  data_files:\n    {split}: {os.path.abspath(path)}\n")
    return names


if __name__ == '__main__':
    from tools.tables import not_a_command
    not_a_command(__doc__)
