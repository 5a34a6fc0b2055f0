# A tiny student for laptop CPUs (the offline quick start and smoke tests): 4 layers, 128 wide,
# GQA 4:2, byte-level tokens (prepare_data.py --tokenizer=bytes: 257 ids, padded to 320), 256-token
# sequences; 830,592 parameters (affine). Any variant:
# --attention=softmax|sink|gated|affine|affine_gated|softmax1. Run, after preparing its data:
#   python prepare_data.py --source=builtin --tokenizer=bytes --out_dir=data/builtin_bytes \
#       --val_every=10
#   python train.py config/tiny_cpu.py --attention=affine --data_dir=data/builtin_bytes
model = 'tiny'  # model.MODEL_SHAPES: 4 layers, 128 wide, GQA 4:2, 256-token sequences
attention = 'affine'
# training on the built-in corpus: 300 steps of 16 x 256 tokens
data_dir = 'data/builtin_bytes'
out_dir = 'out/tiny_cpu'
max_iters = 300
global_batch_size = 16
micro_batch_size = 8
warmup_iters = 20
eval_interval = 100
eval_batches = 8
log_interval = 50
