# Paper Table 1, 0.5B row "Affine-Scaled": a Qwen1.5-0.5B-shaped student (trained from scratch,
# distilled from Qwen1.5-1.8B) with attention = 'affine'.
# Check the model (no data needed):
#   python train.py config/affine_0.5b.py --dry_run=True
# Train on 8 GPUs (data and teacher: see the README):
#   torchrun --standalone --nproc_per_node=8 train.py config/affine_0.5b.py
# Expect (paper, 9,000 steps x 1,024 x 2,048 tokens): KD loss / C4 PPL / avg zero-shot acc =
# 2.82 / 70.6 / 51.3; extra parameters over softmax: 393,216.
model = 'qwen1.5-0.5b'  # the shape (model.MODEL_SHAPES), at the paper's 2,048-token sequences
attention = 'affine'
out_dir = 'out/affine_0.5b'
data_dir = 'data/fineweb_edu_qwen'  # made by prepare_data.py with the teacher's tokenizer (README)
teacher = 'checkpoints/Qwen1.5-1.8B'  # the paper: Qwen1.5-1.8B
micro_batch_size = 4  # per GPU and forward; accumulation steps follow from global_batch_size = 1024
