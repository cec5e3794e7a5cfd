"""Full-vocabulary logits in chunks of tokens: the output layer replaced by a function that forms
what it needs a chunk at a time, so nothing of (tokens x vocabulary) is held at once (the
policy loss, logra.rl.loss.token_logprobs, and LoGRA's KL prediction, logra.optim.kl_control)."""
from __future__ import annotations

import contextlib

# tokens whose full-vocabulary logits exist at a time, in the loss (logra.rl.loss.token_logprobs)
# and in the KL probe (logra.optim.kl_control); config grpo.chunk_tokens
CHUNK_TOKENS = 512


@contextlib.contextmanager
def output_layer_replaced(model, fn):
    """Inside, the model's output layer calls `fn(hidden, weight, bias)` on its input and returns
    empty logits, so nothing of vocabulary size is formed by the model itself: `fn` forms what
    it needs in chunks of tokens, inside the model's forward (where FSDP has the weights
    unsharded). The output layer must be a plain Linear (no hooks of an update rule on it)."""
    head = model.get_output_embeddings()
    if getattr(model.config.get_text_config(), "final_logit_softcapping", None):
        raise ValueError("the model caps its logits (final_logit_softcapping), which the "
                         "chunked log-probs do not apply")
    if head._forward_hooks or head._forward_pre_hooks:
        raise ValueError("the output layer has forward hooks (is it trained as a low-rank "
                         "module?); the chunked log-probs need a plain output layer")

    def forward(x):
        fn(x, head.weight, head.bias)
        return x[..., :0]
    own = head.__dict__.get("forward")  # an instance-level forward of someone else's, if any
    head.forward = forward
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
