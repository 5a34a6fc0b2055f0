"""
The Hugging Face face of model.py: an export's config.json (hf_config) and, for every model
transformers' own classes do not compute (hf_native), the code export_hf.py copies
beside model.py and attention_kernels.py, to which config.json maps the Auto classes
(trust_remote_code=True). The model is this repository's GPT; this file only translates: a
right-padded attention_mask into seq_lens, labels into shifted targets, the logits into
transformers' output class. generate() recomputes the whole sequence at every step (no cache): exact
for every variant, with prompts of one length at a time. docs/export.md has the rest.
"""
import dataclasses

import torch
import torch.nn.functional as F
import transformers
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# in an exported directory transformers imports this file as part of a package (see model.py's
# imports); transformers 4.x copies into its module cache only the files this one imports: every
# code file is named here
try:
    from .attention_kernels import SinkAttention  # noqa: F401  (imported by model.py)
    from .model import GPT, IGNORE_INDEX, VARIANTS, ModelConfig
except ImportError:  # in this repository: the network at its root
    from model import GPT, IGNORE_INDEX, VARIANTS, ModelConfig

TRANSFORMERS_5 = int(transformers.__version__.split('.')[0]) >= 5

# The variants that transformers' own Llama and Qwen2 compute, by their key in model.VARIANTS. An
# export of one without a gate is a plain Llama or Qwen2 and ships no code; any other model ships
# ours.
HF_NATIVE = ('softmax',)
# an export's config.json model_type for the variants transformers does not have
MODEL_TYPE = 'affine_scaled_gpt'
# below: what such an export's Auto classes map to
WRAPPER_CLASSES = ('AffineScaledConfig', 'AffineScaledForCausalLM')


def transformers_names(config):
    """A ModelConfig's numbers under transformers' names, for the tools that read them (lm-eval's
    max length, ...)."""
    return dict(vocab_size=config.vocab_size, hidden_size=config.n_embd,
                intermediate_size=config.intermediate_size,
                num_hidden_layers=config.n_layer, num_attention_heads=config.n_head,
                num_key_value_heads=config.n_kv_head, max_position_embeddings=config.block_size,
                tie_word_embeddings=config.tie_embeddings)


def hf_native(cfg):
    """Whether transformers' own Llama or Qwen2 computes a ModelConfig's model (HF_NATIVE)."""
    return cfg.variant_name in HF_NATIVE and not cfg.is_gated


def hf_config(cfg, dtype, special_ids, tok_info):
    """config.json of an export. A model transformers computes itself (hf_native:
    softmax without the gate): its own Llama (Qwen2 when q/k/v have biases) in the hub's layout,
    which 4.x and 5.x both read (5.x writes rope_parameters, which 4.x ignores, falling back to
    rope_theta = 10000). Other models: our ModelConfig under model_config and an auto_map to the
    shipped hf_wrapper.py. Both record the run's tokenizer (tokenizer_info, as meta.json has it),
    which distill.py checks a KD teacher's data against."""
    common = dict(transformers_names(cfg), **special_ids,
                  torch_dtype=str(dtype).removeprefix('torch.'), tokenizer_info=tok_info)
    if not hf_native(cfg):
        config_class, model_class = WRAPPER_CLASSES
        return dict(architectures=[model_class], model_type=MODEL_TYPE,
                    auto_map={'AutoConfig': f'hf_wrapper.{config_class}',
                              'AutoModelForCausalLM': f'hf_wrapper.{model_class}'},
                    model_config=dataclasses.asdict(cfg), **common)
    llama = dict(head_dim=cfg.head_dim, hidden_act='silu', initializer_range=cfg.init_std,
                 rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                 rope_scaling=cfg.rope_scaling, attention_dropout=0.0, use_cache=True)
    # Qwen2: biases on q/k/v (not o), as ours; Llama's attention_bias would add one to o_proj too
    if cfg.qkv_bias:
        return dict(architectures=['Qwen2ForCausalLM'], model_type='qwen2', **llama,
                    use_sliding_window=False,
                    sliding_window=None, max_window_layers=cfg.n_layer, **common)
    return dict(architectures=['LlamaForCausalLM'], model_type='llama', **llama,
                attention_bias=False, mlp_bias=False, pretraining_tp=1, **common)


class AffineScaledConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, model_config=None, **kwargs):
        # our ModelConfig as one dict, apart from transformers' own attributes (transformers 5 would
        # turn a top-level rope_scaling into its rope_parameters); the names transformers knows are
        # derived from it
        self.model_config = dict(model_config or {})
        super().__init__(**(kwargs | transformers_names(ModelConfig(**self.model_config))))


def seq_lens_from_mask(attention_mask):
    """model.py's seq_lens (B,) from a right-padded attention_mask (B, T) of ones then zeros; None
    without padding."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    lens = attention_mask.sum(dim=1)
    positions = torch.arange(attention_mask.size(1), device=attention_mask.device)
    if lens.min() < 1 or not torch.equal(attention_mask.bool(), positions[None, :] < lens[:, None]):
        raise ValueError("attention_mask: only right padding is supported (each row ones, then "
                         "zeros; at least one one): set tokenizer.padding_side = 'right', and give "
                         "generate() prompts of one length")
    return lens


class AffineScaledForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AffineScaledConfig
    base_model_prefix = 'model'
    _no_split_modules = ['Block']
    # the variants' float32 buffers (affine's alpha_ma) stay float32 in a bf16/fp16 model, as in
    # model.py (Attention._apply); transformers 4.x takes only module names here, and rounds them to
    # the dtype asked for (load in float32 there, its default, to keep them)
    _keep_in_fp32_modules_strict = sorted({n for v in VARIANTS.values()
                                           for n in v.fp32}) if TRANSFORMERS_5 else None
    # the tied lm_head (when config.tie_word_embeddings): transformers 5 takes {tied: source}, 4.x
    # the tied names
    _tied_weights_keys = {
        'lm_head.weight': 'model.embed_tokens.weight'} if TRANSFORMERS_5 else ['lm_head.weight']

    def __init__(self, config):
        super().__init__(config)
        gpt = GPT(ModelConfig(**config.model_config))
        # GPT's own modules under GPT's own names, so the weights are model.py's state dict key for
        # key; the GPT itself stays outside the module tree (its modules are registered once, here)
        # and runs the forward
        self.model, self.lm_head = gpt.model, gpt.lm_head
        self.__dict__['gpt'] = gpt
        self.post_init()

    def _init_weights(self, module):
        """GPT's init, for what transformers did not load. Transformers 5 also calls it on a layer
        whose saved buffers it loaded (affine's alpha_ma), because of the running sums beside them
        (registered with persistent=False, so never saved): those are zeroed, the loaded ones
        kept."""
        if any(getattr(b, '_is_hf_initialized', False) for b in module.buffers(recurse=False)):
            for name in module._non_persistent_buffers_set:
                module._buffers[name].zero_()
        else:
            self.gpt._init_weights(module)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = self.gpt.lm_head = value

    def forward(self, input_ids, attention_mask=None, labels=None, inputs_embeds=None,
                position_ids=None, **unused):
        """GPT.forward; labels as transformers takes them (the loss shifts them). A cache,
        return_dict and the like are accepted and ignored: nothing is cached, the output is always a
        CausalLMOutputWithPast."""
        if inputs_embeds is not None or position_ids is not None:
            raise ValueError("inputs_embeds and position_ids are not supported: pass input_ids "
                             "(right-padded)")
        if unused.get('output_attentions') or unused.get('output_hidden_states'):
            raise ValueError("output_attentions / output_hidden_states are not supported "
                             "(model.py's Attention.weights gives any variant's attention matrix)")
        targets = None if labels is None else F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
        logits, loss = self.gpt(input_ids, targets, seq_lens=seq_lens_from_mask(attention_mask))
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **unused):
        # the whole sequence at every step
        return dict(input_ids=input_ids, attention_mask=attention_mask)
