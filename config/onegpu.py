# The one-GPU tier: a SmolLM2-135M-shaped student (from scratch) distilled with the paper's pure KD
# from the real SmolLM2-360M, on 1.05B tokens (4,000 steps x 128 x 2,048), sized for one GPU of
# 24 GiB; any variant via --attention. Check the plan first (no data or teacher needed) with
# python train.py config/onegpu.py --attention=gated --dry_run=True
# Prepare once (the teacher from the hub, the data tokenized with its tokenizer):
#   hf download HuggingFaceTB/SmolLM2-360M --local-dir checkpoints/SmolLM2-360M
#   python prepare_data.py --source=fineweb-edu --tokenizer=checkpoints/SmolLM2-360M \
#       --out_dir=data/fineweb_edu_smollm2 --max_tokens=1_100_000_000
# Train and evaluate the five variants, each at the largest micro-batch that fits 24 GiB (on 80 GiB
# every variant takes --micro_batch_size=16, and all but affine_gated 32, which is faster):
# for v in softmax sink gated affine affine_gated; do
#  mb=8; [ $v = affine_gated ] && mb=4   # what fits 24 GiB (80 GiB: 32, affine_gated 16)
#  python train.py config/onegpu.py --attention=$v --micro_batch_size=$mb --out_dir=out/onegpu_$v &&
#      python eval_zeroshot.py --ckpt=out/onegpu_$v --out=out/onegpu_$v/eval.json
#  [ $? = 0 ] || break   # a stop (exit 128 + its signal) or a failure ends the loop
# done
# Then compare them in a Table-1-style report:
#   python analyze.py table out/onegpu_* --out_dir=out/table_onegpu
# Expect (an estimate, not measured: FLOPs per token at 40% MFU of an H100's bf16 peak): ~1.6-1.7 h
# per variant on one H100; the README's "Try it on one GPU" table gives each variant's memory plan.
model = 'smollm2-135m'  # the shape (model.MODEL_SHAPES), at 2,048-token sequences
attention = 'affine'
out_dir = 'out/onegpu_affine'
# made by prepare_data.py with the teacher's tokenizer (above)
data_dir = 'data/fineweb_edu_smollm2'
teacher = 'checkpoints/SmolLM2-360M'
global_batch_size = 128  # an eighth of the paper's 1,024 sequences per step
max_iters = 4000
# the largest that fits 24 GiB with 10% to spare, but for affine_gated (4): --dry_run=True says
micro_batch_size = 8
dry_run_world_size = 1  # --dry_run plans for this tier's machine: one GPU of 24 GiB
dry_run_gpu_gib = 24
