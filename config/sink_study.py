# The sink study's recipe (python -m study.sink_study runs it for every variant and seed;
# docs/analysis.md tells how it was found): the quick start's tiny shape (4 layers, 128 wide, GQA
# 4:2, byte tokens) on 128-token windows of Python's standard library that all start with
# <|endoftext|> (first_token='prefix'), a large learning rate and weight decay, the setting in which
# Gu et al. (2025) find softmax grows a first-token sink.
# Expect from a softmax run: a sink in layer 1 (Gu et al.'s Sink_1 above 0;
# docs/sink_study/report.md has the measured seeds), val loss about 1.73, and 4-8 minutes a run on
# one CPU thread with layers compiled (compile=True needs a C++ compiler; --compile=False runs
# eager, slower).
# Run one alone, after preparing its data:
#   python prepare_data.py --source=stdlib --tokenizer=bytes --out_dir=data/stdlib_bytes \
#       --val_every=50
#   python train.py config/sink_study.py --attention=softmax --seed=1 \
#       --out_dir=out/sink_study/train/ce_softmax_s1
model = 'tiny'
block_size = 128
attention = 'softmax'
data_dir = 'data/stdlib_bytes'
first_token = 'prefix'
out_dir = 'out/sink_study/run'
max_iters = 1465  # 16 x 128 x 1465 = 3.0M tokens
global_batch_size = 16
micro_batch_size = 16
learning_rate = 5e-3
weight_decay = 2.0
warmup_iters = 100
eval_interval = 183
eval_batches = 8
attention_windows = 8  # the sink measures of every evaluation (probes.sink_record)
log_interval = 100
seed = 0
# torch.compile per layer, on CPU too: 1.2x the tokens/s of eager on one thread (docs/benchmarks.md)
compile = True
