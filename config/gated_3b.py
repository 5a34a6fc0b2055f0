# Paper Table 2, 3B row "Gated": a Llama-3.2-3B-shaped student (trained from scratch, distilled from
# an 8B Llama-3) with attention = 'gated'.
# Check the model and its memory plan (no data needed):
#   python train.py config/gated_3b.py --dry_run=True
# Train on 8 GPUs (data and teacher: see the README). Next to the 8B teacher, the 3B student with
# AdamW does not fit an 80 GB GPU under DDP (see its dry run with --fsdp=False), so it is sharded
# with FSDP (docs/memory.md):
#   torchrun --standalone --nproc_per_node=8 train.py config/gated_3b.py
# More nodes or SLURM: scripts/slurm_train.sh (docs/training.md, multi-node launch).
# Expect (paper, 9,000 steps x 1,024 x 2,048 tokens): KD loss / C4 PPL / avg zero-shot acc =
# 2.65 / 44.6 / 61.6; extra parameters over softmax: 264,241,152.
model = 'llama3.2-3b'  # the shape (model.MODEL_SHAPES), at the paper's 2,048-token sequences
attention = 'gated'
out_dir = 'out/gated_3b'
# made by prepare_data.py with the teacher's tokenizer (README)
data_dir = 'data/fineweb_edu_llama3'
# the paper says "LLaMA3.3-8B", which does not exist; an 8B Llama-3: Llama-3.1-8B
teacher = 'checkpoints/Llama-3.1-8B'
fsdp = True  # FSDP2: the student's weights, gradients and AdamW state sharded over the GPUs
micro_batch_size = 4  # per GPU and forward; accumulation steps follow from global_batch_size = 1024
