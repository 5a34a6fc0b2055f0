# Paper Tables 1-2, 1B row "Baseline": a Llama-3.2-1B-shaped student (trained from scratch,
# distilled from Llama-3.2-3B) with attention = 'softmax'.
# Run on 8 GPUs (train.py is issue #4; until it lands this file defines the model, and
# `python -m pytest tests/test_configs.py` checks its shape and extra parameters):
#   torchrun --standalone --nproc_per_node=8 train.py config/softmax_1b.py
# Expect (paper, 9,000 steps x 1,024 x 2,048 tokens): KD loss / C4 PPL / avg zero-shot acc = 2.73 / 61.9 / 56.7;
# extra parameters over softmax: 0.
n_layer = 16
n_head = 32
n_kv_head = 8
n_embd = 2048
intermediate_size = 8192
vocab_size = 128256
block_size = 2048  # the paper's sequence length
rope_theta = 500000.0
rope_scaling = {'rope_type': 'llama3', 'factor': 32.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
                'original_max_position_embeddings': 8192}
rms_norm_eps = 1e-5
qkv_bias = False
tie_embeddings = True
attention = 'softmax'
