"""The analytic side of memory: the bytes autograd saves for backward in one forward of an HF
Llama/Qwen2-style decoder, derived op by op (`activation_breakdown`, checked to the byte against
`saved_tensor_bytes`), which the planner (`logra.measure.planner`) and the loop's analytic
breakdown (`analytic_breakdown`) use."""
from __future__ import annotations

from collections.abc import Iterable

import torch


def analytic_breakdown(
    *,
    param_bytes: int,
    grad_bytes_at_peak: int,
    optimizer_bytes: int,
    activation_bytes: int,
    rollout_bytes: int = 0,
    other_bytes: int = 0,
) -> dict[str, int]:
    """Analytic peak = weights + grads alive at the peak + optimizer state + activations alive at
    the peak + rollout buffers + anything else.  Keys: weights, grads, optimizer, activations,
    rollout, other, total."""
    d = {
        "weights": int(param_bytes),
        "grads": int(grad_bytes_at_peak),
        "optimizer": int(optimizer_bytes),
        "activations": int(activation_bytes),
        "rollout": int(rollout_bytes),
        "other": int(other_bytes),
    }
    d["total"] = sum(d.values())
    return d


def _cfg(config, name: str, default=None):
    v = getattr(config, name, None)
    return default if v is None else v


def activation_breakdown(
    config,
    batch: int | None = None,
    seq_len: int | None = None,
    *,
    n_tokens: int | None = None,
    dtype_bytes: int = 4,
    checkpointing: bool = False,
    attn_implementation: str | None = None,
    attention_mask: bool = False,
    include_head: bool = True,
    frozen: bool = False,
    sketch_rank: int = 0,
    loss: str = "hf",
) -> dict[str, int]:
    """Bytes autograd saves for backward in ONE forward of an HF Llama/Qwen2-style decoder.

    Derived op by op from the eager HF Qwen2 code (transformers 5.x) and verified *exactly* (to
    the byte, fp32 and bf16, eager and sdpa) against the storages captured by
    `torch.autograd.graph.saved_tensors_hooks` (`saved_tensor_bytes`).  Notation: N =
    batch*seq_len tokens, H hidden, A = heads*head_dim, Akv = kv_heads*head_dim, I intermediate,
    b = dtype_bytes, f = 4 (fp32).  Per decoder layer:

    - 2 x RMSNorm (`x.to(fp32)`; `x.pow(2)`; `x * rsqrt`; `w * y.to(dtype)`): each
      saves its input as fp32 (N*H*f; when b == 4 the cast is a no-op and the residual-stream
      tensor itself is saved, when b < 4 only the fp32 copy is), rsqrt (N*f) and the normalised
      `y` in dtype (N*H*b).  The norm outputs `w*y` are saved by the q/k/v and gate/up
      projections (2*N*H*b).
    - rotary: `q*cos + rotate_half(q)*sin` saves only cos/sin (shared across layers,
      2*T*hd*b per forward; 2*B*T*hd*b with `loss="chunked"`, whose forward passes per-row
      position ids for left padding), not the projections' outputs.
    - eager attention: the matmuls save q_rot and the GQA-repeated k, v (3*N*A*b), softmax saves
      its fp32 output (B*h*T^2*f) and, if dtype != fp32, the second matmul the cast probs
      (B*h*T^2*b); o_proj saves its input (N*A*b).
      sdpa (flash / efficient kernels): q (N*A*b), k and v (2*N*Akv*b, or 2*N*A*b when a padding
      mask makes HF repeat_kv), output (N*A*b; laid out (B,T,h,hd), so it *is* o_proj's input),
      logsumexp (B*h*T*f), and with `attention_mask=True` the additive mask (B*T^2*b, a fresh
      copy per layer).
    - residual adds save nothing.
    - SiLU-gated MLP saves gate, silu(gate), up and their product (4*N*I*b).

    Head (`include_head`): final norm (as above) + lm_head input (N*H*b) + the fp32
    log_softmax output (N*V*f; HF's loss upcasts logits) + int64 targets (N*8) + a scalar.  The
    logits themselves are not saved (they are alive while the model output holds them: not
    counted).  A GRPO loss of the form `logits.float().log_softmax(-1).gather(...)` saves the
    same N*V*f.  `loss="chunked"` (`logra.rl.loss.token_logprobs`, the trainer's loss): final
    norm + the output layer's input (N*H*b, saved for the recomputed logits even when frozen) +
    int64 targets (N*8) + each token's fp32 logsumexp (N*f); nothing of vocabulary size.
    Caller-owned input_ids (saved by the embedding) are not counted.

    `frozen=True`: the base weights do not train (LoRA): the RMSNorms' normalised values and
    the lm_head input, saved only for those weights' gradients, are not saved (the adapters'
    own rank-r tensors are not counted: N·r per adapted module).

    `sketch_rank=r` (LoGRA, logra/optim/logra_rule.py; implies `frozen`): no weight has a
    gradient, so the seven projections of each layer save no input (not the norm outputs 2*N*H*b,
    not o_proj's, not down_proj's: the MLP saves 3*N*I*b) and keep X·Aᵀ instead, N*r*b each
    (all seven targeted, LoGRA's default).

    With `checkpointing=True` (HF per-layer gradient checkpointing) only each layer's input
    (N*H*b) is kept from the forward; during backward one layer is recomputed, so the peak of
    saved activations is L*N*H*b + max(head, one layer).
    """
    if seq_len is None:
        raise TypeError("seq_len is required (attention terms scale with seq_len**2)")
    if batch is None:
        if n_tokens is None or n_tokens % seq_len:
            raise TypeError("give batch, or n_tokens divisible by seq_len")
        batch = n_tokens // seq_len
    elif n_tokens is not None and n_tokens != batch * seq_len:
        raise ValueError(f"n_tokens={n_tokens} != batch*seq_len={batch * seq_len}")
    L = int(config.num_hidden_layers)
    H = int(config.hidden_size)
    I = int(config.intermediate_size)
    nh = int(config.num_attention_heads)
    nkv = int(_cfg(config, "num_key_value_heads", nh))
    hd = int(_cfg(config, "head_dim", H // nh))
    V = int(config.vocab_size)
    B, T = int(batch), int(seq_len)
    N = B * T
    b = int(dtype_bytes)
    f = 4
    A, Akv = nh * hd, nkv * hd
    impl = attn_implementation or getattr(config, "_attn_implementation", None) or "sdpa"

    frozen = frozen or sketch_rank > 0

    def rmsnorm() -> int:
        # fp32 input copy (when b == 4 the .to() is a no-op and the input itself is saved),
        # rsqrt, normalised value cast back to dtype (saved for the weight's gradient only).
        return N * H * f + N * f + (0 if frozen else N * H * b)

    if impl == "eager":
        attn = 3 * N * A * b + B * nh * T * T * f + (B * nh * T * T * b if b != f else 0)
        o_in = N * A * b
    else:  # sdpa / flash / efficient kernels
        kv = 2 * N * (A if attention_mask else Akv) * b
        attn = N * A * b + kv + N * A * b + B * nh * T * f
        o_in = 0  # sdpa output is laid out (B, T, h, hd): the o_proj input shares its storage
        # sdpa saves the additive float mask (B, 1, T, T) in model dtype, a fresh copy per layer
        attn += B * T * T * b if attention_mask else 0
    if sketch_rank:
        per_layer = 2 * rmsnorm() + attn + 3 * N * I * b + 7 * N * sketch_rank * b
    else:
        per_layer = 2 * rmsnorm() + N * H * b + attn + o_in + N * H * b + 4 * N * I * b
    rope = 2 * (B if loss == "chunked" else 1) * T * hd * b
    if loss not in ("hf", "chunked"):
        raise ValueError(f"loss: unknown {loss!r}; known: hf, chunked")
    if not include_head:
        head = 0
    elif loss == "hf":  # + fp32 scalar total_weight saved by nll_loss
        head = rmsnorm() + (0 if frozen else N * H * b) + N * V * f + N * 8 + f
    else:
        head = rmsnorm() + N * H * b + N * 8 + N * f

    if not checkpointing:
        layers, head_part = L * per_layer, head
    else:
        # Forward keeps only each layer's input; the head's saved tensors are freed by the time
        # the first layer is recomputed, so the peak holds max(head, one recomputed layer).
        layers, head_part = L * N * H * b + max(per_layer, head), 0
    out = {
        "per_layer": per_layer,
        "layers": layers,
        "rope": rope,
        "head": head_part,
    }
    out["total"] = layers + rope + head_part
    return out


def activation_bytes_estimate(
    config,
    batch: int | None = None,
    seq_len: int | None = None,
    *,
    n_tokens: int | None = None,
    dtype_bytes: int = 4,
    checkpointing: bool = False,
    **kw,
) -> int:
    """Bytes saved for backward by one forward over `batch x seq_len` tokens (or `n_tokens`
    tokens in rows of `seq_len`).  See `activation_breakdown` for the derivation and the
    keyword options (`attn_implementation`, `attention_mask`, `include_head`, `frozen`,
    `loss`).  Options after `seq_len` are keyword-only so a positional `dtype_bytes` cannot
    be mistaken for a sequence length."""
    return activation_breakdown(
        config,
        batch,
        seq_len,
        n_tokens=n_tokens,
        dtype_bytes=dtype_bytes,
        checkpointing=checkpointing,
        **kw,
    )["total"]


def saved_tensor_bytes(fn, *args, exclude: Iterable[torch.Tensor] = (), **kwargs):
    """Run `fn(*args, **kwargs)` and return `(result, bytes)` where bytes is the size of the
    unique storages autograd saved for backward, excluding storages of `exclude` (parameters).
    Used to verify `activation_bytes_estimate` exactly."""
    skip = {(str(t.device), t.untyped_storage().data_ptr()) for t in exclude}
    seen: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        k = (str(st.device), st.data_ptr())
        if k not in skip and k not in seen:
            seen[k] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(*args, **kwargs)
    return result, sum(seen.values())
