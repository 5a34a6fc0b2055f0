# The quick start's students (python quickstart.py runs one per variant and seed): 4 layers, 128
# wide, GQA 4:2, distilled (pure KD, as the paper) from the quick start's teacher on the built-in
# corpus, 256-token sequences.
# Run one alone, after the teacher (python train.py config/quickstart_teacher.py):
#   python train.py config/quickstart_student.py --attention=affine \
#       --out_dir=out/quickstart/affine_seed0 --seed=0
# Expect about 1.5 minutes each, two at a time on 2 CPU cores (one thread each); the KD loss falls
# to 0.56-0.69 and the val loss ends near 2.5 (80 steps: short, so that the quick start's six
# students fit in its 10 minutes).
model = 'tiny'  # model.MODEL_SHAPES: 4 layers, 128 wide, GQA 4:2, 256-token sequences
attention = 'affine'
data_dir = 'data/builtin_bytes'
out_dir = 'out/quickstart/affine_seed0'
teacher = 'out/quickstart/teacher'
max_iters = 80
global_batch_size = 16
micro_batch_size = 16
warmup_iters = 20
eval_interval = 40
eval_batches = 8
log_interval = 40
