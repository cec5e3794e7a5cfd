"""Dense Adam's propose/apply split is AdamW, and scale multiplies the step."""
import torch

from logra.optim.dense_adam import DenseAdam


def _pair(seed):
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    b = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def test_matches_torch_adamw_on_fresh_inputs():
    a, b = _pair(torch.seed() % 2**31)
    rule = DenseAdam(a, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)
    opt = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.05)
    for _ in range(6):
        x = torch.randn(4, 7)
        a(x).square().sum().backward()
        b(x).square().sum().backward()
        rule.apply(rule.propose(), 1.0)
        opt.step()
        opt.zero_grad()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
    assert rule.state_bytes() == 2 * sum(p.numel() * 4 for p in a.parameters())
    assert all(p.grad is None for p in a.parameters())  # apply frees the step buffers


def test_scale_multiplies_the_step():
    a, b = _pair(1)
    ra, rb = DenseAdam(a, lr=1e-2), DenseAdam(b, lr=1e-2)
    x = torch.randn(4, 7)
    w0 = [p.detach().clone() for p in a.parameters()]
    a(x).sum().backward()
    b(x).sum().backward()
    ra.apply(ra.propose(), 1.0)
    rb.apply(rb.propose(), 0.25)
    for p0, pa, pb in zip(w0, a.parameters(), b.parameters()):
        torch.testing.assert_close(pb - p0, 0.25 * (pa - p0))


def test_train_only_trains_exactly_logras_weights_and_reaches_them_under_checkpointing(
        tiny_dir):
    """dense_adam_targets' trainable set (`train_only`, LoGRA's target pattern) equals
    LoGRA's, in the same order; every other parameter (embedding, norms, lm_head) is frozen and
    unchanged by a step; with gradient checkpointing backward still reaches every target (the
    embedding's output requires grad); unwrap removes the hook."""
    from logra import rules
    from logra.optim.rule import DEFAULT_MODULES, requires_grad_output
    from logra.rl.models import load

    logra_model, logra_tok = load(tiny_dir)
    logra = rules.build("logra", logra_model, {"rank": 2})
    model, tok = load(tiny_dir)
    model.gradient_checkpointing_enable()
    model.train()
    rule = rules.build("dense_adam", model, {"lr": 1e-2, "train_only": DEFAULT_MODULES})
    assert [n for n, _ in rule.named] == [n for n, _ in logra.named]
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in logra.named}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = tok(["Q: 1+2\nA: 3"], return_tensors="pt")
    model(**ids, labels=ids["input_ids"]).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in rule.named)
    rule.apply(rule.propose(), 1.0)
    trained = {n for n, _ in rule.named}
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) != (n in trained), n
    hooks = model.get_input_embeddings()._forward_hooks
    assert requires_grad_output in hooks.values()
    rule.unwrap()
    assert rule.hooks == [] and requires_grad_output not in hooks.values()
