# A tiny student for laptop CPUs (the offline quick start and smoke tests): 4 layers, 128 wide,
# GQA 4:2, byte-level tokens (prepare_data.py --tokenizer=bytes: 257 ids, padded to 320), 256-token
# sequences. About 0.6M parameters; a forward+backward of 8 x 256 tokens takes well under a second on
# 2 CPU cores. Any variant: --attention=softmax|sink|gated|affine|affine_gated.
# Run (train.py is issue #4; until it lands `python -m pytest tests/test_configs.py` builds it):
#   python train.py config/tiny_cpu.py --attention=affine
n_layer = 4
n_head = 4
n_kv_head = 2
n_embd = 128
intermediate_size = 384
vocab_size = 320
block_size = 256
rope_theta = 10000.0
rms_norm_eps = 1e-5
tie_embeddings = True
attention = 'affine'
