"""Tiny Hugging Face checkpoints (Llama, Mistral, Qwen2) built here with transformers, and their
logits; the hf_dirs fixture in conftest.py is made of them."""
import json

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from helpers import (CHAT, EOT, HF_QWEN2_REGEX, byte_level, digits_then_gpt2, hf_tokenizer,
                     split_then_bytes)

HF_CLASSES = {'llama': LlamaForCausalLM, 'mistral': MistralForCausalLM, 'qwen2': Qwen2ForCausalLM}
HF_CONFIGS = {'llama': LlamaConfig, 'mistral': MistralConfig, 'qwen2': Qwen2Config}


def rel_err(got, expected):
    return ((got - expected).abs().max() / expected.abs().max()).item()


def randomise(model, seed):
    """Weights far from HF's init (std 0.02, unit norms, zero biases): norms, biases and RoPE all
    show in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if 'norm' in name:
                p.copy_(1 + 0.3 * noise)
            elif name.endswith('bias'):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise if 'embed' in name else 0.15 * noise)


def hf_logits(path, idx):
    model_type = json.loads((path / 'config.json').read_text())['model_type']
    # eager: HF's explicit softmax(QK^T) attention, a different computation from our SDPA call
    model = HF_CLASSES[model_type].from_pretrained(path, attn_implementation='eager').float().eval()
    with torch.no_grad():
        return model(idx).logits


def save_hf_teacher(path, model_type, tokenizer, tokenizer_config, vocab_size, seed, **config):
    """A tiny randomised transformers model of model_type, with `tokenizer` (a tokenizers.Tokenizer)
    and its tokenizer_config.json next to it, as the hub has them."""
    config = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128) | config
    model = HF_CLASSES[model_type](HF_CONFIGS[model_type](**config))
    randomise(model, seed)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save(str(path / 'tokenizer.json'))
    (path / 'tokenizer_config.json').write_text(json.dumps(tokenizer_config))
    return path


def family_teacher_dirs(root):
    """'smollm_llama': a Llama with SmolLM's tokenizer (Digits + GPT-2's regex, <|endoftext|> at id
    0, tied); 'mistral': no sliding window, a GPT-2 tokenizer; 'mistral_window': a sliding window of
    16 positions; 'qwen2_padded': Qwen2.5's shape (q/k/v biases, tied, NFC, Qwen's regex, a
    non-special added token) with 1280 vocabulary rows for a tokenizer of fewer ids, as Qwen's
    151,936 rows for 151,665 tokens; 'qwen2_gpt2_regex': a qwen2 model whose tokenizer.json
    pre-tokenizes with GPT-2's regex."""
    gpt2_config = {'tokenizer_class': 'GPT2Tokenizer', 'bos_token': EOT, 'eos_token': EOT}
    qwen_config = {'tokenizer_class': 'Qwen2Tokenizer', 'bos_token': None, 'eos_token': EOT}
    smol = hf_tokenizer(digits_then_gpt2(True), leading_specials=CHAT)
    gpt2 = hf_tokenizer(byte_level(), specials=[EOT])
    qwen = hf_tokenizer(split_then_bytes(HF_QWEN2_REGEX), nfc=True, specials=CHAT,
                        inline=[('<tool_call>', False)])
    qwen_gpt2 = hf_tokenizer(byte_level(), nfc=True, specials=CHAT)
    return {
        'smollm_llama': save_hf_teacher(root / 'smollm_llama', 'llama', smol, gpt2_config,
                                        smol.get_vocab_size(), 0, tie_word_embeddings=True),
        'mistral': save_hf_teacher(root / 'mistral', 'mistral', gpt2, gpt2_config,
                                   gpt2.get_vocab_size(), 1, sliding_window=None, rope_theta=1e6),
        'mistral_window': save_hf_teacher(root / 'mistral_window', 'mistral', gpt2, gpt2_config,
                                          gpt2.get_vocab_size(), 2, sliding_window=16),
        'qwen2_padded': save_hf_teacher(root / 'qwen2_padded', 'qwen2', qwen, qwen_config, 1280, 3,
                                        tie_word_embeddings=True, rope_theta=1e6),
        'qwen2_gpt2_regex': save_hf_teacher(root / 'qwen2_gpt2_regex', 'qwen2', qwen_gpt2,
                                            qwen_config, 1280, 4, tie_word_embeddings=False),
    }
