"""
What the tools time, besides training runs: the variants compared in the attention sections (the
paper's baseline, its proposal and the proposal written with its explicit T x T matrix), and both
KD losses on a random problem (tools/bench.py's kd section, tools/gpu_check.py's kd part).
"""
import torch

from distill import fused_kd_loss, kd_loss
from lmkit.distributed import autocast

PROPOSED = 'affine'  # the paper's own variant, which the tools time against its baseline
# the proposal with Attention.explicit set: Eq. 6 through the explicit T x T weights
EXPLICIT = f'{PROPOSED} (explicit T x T)'


def kd_problem(N, V, C_s, C_t, device, hidden_dtype):
    """Random hidden states and lm_heads of a student and a teacher, and both KD paths on them.
    The student is C_s wide, with hidden states in hidden_dtype and a float32 head; the teacher is
    C_t wide, in bf16 on CUDA as train.py loads it. Each path is a function that runs one forward
    and backward, under bf16 autocast on CUDA, and returns the loss: 'naive' is kd_loss (both
    models' full logits, then the KL, whose log-softmaxes autocast runs in float32), and
    'fused_kd_loss' is the fused loss. Returns (h_s, w_s, paths); the gradients land in h_s.grad
    and w_s.grad."""
    low = torch.bfloat16 if device.type == 'cuda' else torch.float32
    torch.manual_seed(0)
    h_s = torch.randn(N, C_s, device=device, dtype=hidden_dtype, requires_grad=True)
    w_s = (torch.randn(V, C_s, device=device) * C_s ** -0.5).requires_grad_()
    h_t = torch.randn(N, C_t, device=device, dtype=low)
    w_t = (torch.randn(V, C_t, device=device) * C_t ** -0.5).to(low)
    losses = dict(naive=lambda: kd_loss(h_s, w_s, h_t, w_t)[0],
                  fused_kd_loss=lambda: fused_kd_loss(h_s, w_s, h_t, w_t)[0])

    def step(loss_fn):
        h_s.grad = w_s.grad = None  # each step computes its gradients afresh
        with autocast(device):
            loss = loss_fn()
        loss.backward()
        return loss.detach()

    return h_s, w_s, {name: (lambda fn=fn: step(fn)) for name, fn in losses.items()}
