# The sink study v2's recipe, layered on config/sink_study.py (v1's), as its search chose it by a
# rule fixed before its runs (docs/sink_study_v2/search.md): the learning rate constant after
# warm-up; alpha_proj and g_proj left out of weight decay, as sink's logits (vectors) always were,
# so that no variant's own parameters decay; and matched initialisation, so that every variant of
# one seed starts from the same shared tensors and sees the same batches.
# Expect from a softmax run: a sink in layer 1 alone (Gu et al.'s Sink_1 of layer 1 0.62-0.84 in
# the search's three seeds, 0 in layers 2-4), val loss about 2.0-2.1, about 3.5 minutes on one CPU
# thread with layers compiled.
# Run one alone, after preparing its data:
#   python prepare_data.py --source=stdlib --tokenizer=bytes --out_dir=data/stdlib_bytes \
#       --val_every=50
#   python train.py config/sink_study.py config/sink_study_v2.py --attention=softmax --seed=1 \
#       --out_dir=out/v2_run
decay_frac = 0.0
no_decay = ['alpha_proj', 'g_proj']
matched_init = True
