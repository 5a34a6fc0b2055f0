# The quick start's teacher (python quickstart.py runs it): a softmax model twice as deep as the students, 6
# layers, 128 wide, GQA 4:2, byte-level tokens (257 ids, padded to 320), 256-token sequences, 1.2M parameters.
# Run alone (first: python prepare_data.py --source=builtin --tokenizer=bytes --out_dir=data/builtin_bytes --val_every=10):
#   python train.py config/quickstart_teacher.py
# Expect about 2 minutes on 2 CPU cores (~11k tokens/s) and a final val loss near 1.56 on the built-in corpus.
n_layer = 6
n_head = 4
n_kv_head = 2
n_embd = 128
intermediate_size = 384
vocab_size = 320
block_size = 256
rope_theta = 10000.0
tie_embeddings = True
attention = 'softmax'
data_dir = 'data/builtin_bytes'
out_dir = 'out/quickstart/teacher'
max_iters = 300
global_batch_size = 16
micro_batch_size = 16
warmup_iters = 20
eval_interval = 100
eval_batches = 8
log_interval = 50
