# The quick start's teacher (python quickstart.py runs it): a softmax model twice as deep as the
# students, 6 layers, 128 wide, GQA 4:2, byte-level tokens (257 ids, padded to 320), 256-token
# sequences, 1.2M parameters.
# Run alone, after preparing its data:
#   python prepare_data.py --source=builtin --tokenizer=bytes --out_dir=data/builtin_bytes \
#       --val_every=10
#   python train.py config/quickstart_teacher.py
# Expect about 2.5 minutes on 2 CPU cores (~6k tokens/s) and a final val loss near 1.81 on the
# built-in corpus.
model = 'tiny'  # model.MODEL_SHAPES: 128 wide, GQA 4:2, 256-token sequences
n_layer = 6  # the students' 4, doubled
attention = 'softmax'
data_dir = 'data/builtin_bytes'
out_dir = 'out/quickstart/teacher'
max_iters = 200
global_batch_size = 16
micro_batch_size = 16
warmup_iters = 20
eval_interval = 100
eval_batches = 8
log_interval = 50
