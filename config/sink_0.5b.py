# Paper Table 1, 0.5B row "Sink": a Qwen1.5-0.5B-shaped student (trained from scratch,
# distilled from Qwen1.5-1.8B) with attention = 'sink'.
# Check the model (no data needed):  python train.py config/sink_0.5b.py --dry_run=True
# Train on 8 GPUs (data and teacher: see the README):
#   torchrun --standalone --nproc_per_node=8 train.py config/sink_0.5b.py
# Expect (paper, 9,000 steps x 1,024 x 2,048 tokens): KD loss / C4 PPL / avg zero-shot acc = 2.83 / 81.5 / 50.8;
# extra parameters over softmax: 384 (the paper rounds to 0.0M).
n_layer = 24
n_head = 16
n_kv_head = 16
n_embd = 1024
intermediate_size = 2816
vocab_size = 151936  # Qwen's padded embedding (151,646 real tokens)
block_size = 2048  # the paper's sequence length
rope_theta = 1000000.0
rope_scaling = None
rms_norm_eps = 1e-6
qkv_bias = True
tie_embeddings = True
attention = 'sink'
out_dir = 'out/sink_0.5b'
data_dir = 'data/fineweb_edu_qwen'  # made by prepare_data.py with the teacher's tokenizer (README)
teacher = 'checkpoints/Qwen1.5-1.8B'  # the paper: Qwen1.5-1.8B
micro_batch_size = 4  # per GPU and forward; accumulation steps follow from global_batch_size = 1024
