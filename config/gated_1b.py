# Paper Table 2, 1B row "Gated": a Llama-3.2-1B-shaped student (trained from scratch, distilled from
# Llama-3.2-3B) with attention = 'gated'.
# Check the model (no data needed):
#   python train.py config/gated_1b.py --dry_run=True
# Train on 8 GPUs (data and teacher: see the README):
#   torchrun --standalone --nproc_per_node=8 train.py config/gated_1b.py
# Expect (paper, 9,000 steps x 1,024 x 2,048 tokens): KD loss / C4 PPL / avg zero-shot acc =
# 2.71 / 56.6 / 57.1; extra parameters over softmax: 67,108,864.
model = 'llama3.2-1b'  # the shape (model.MODEL_SHAPES), at the paper's 2,048-token sequences
attention = 'gated'
out_dir = 'out/gated_1b'
# made by prepare_data.py with the teacher's tokenizer (README)
data_dir = 'data/fineweb_edu_llama3'
teacher = 'checkpoints/Llama-3.2-3B'  # the paper: Llama-3.2-3B
micro_batch_size = 4  # per GPU and forward; accumulation steps follow from global_batch_size = 1024
