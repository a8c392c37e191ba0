"""Real optimizer steps of a real causal LM on real text, published as bf16 states.

Text: the Python documentation's topic pages that ship with CPython
(`pydoc_data.topics`, about 465k characters of English prose and code), cut into
fixed windows of tokens in a fixed order. Two losses:

* ``ntl``: next-token cross-entropy on a batch of text windows.
* ``pg``: a policy gradient (REINFORCE with group-normalised advantages, as in GRPO).
  Prompts are text windows; the model samples a group of completions per prompt; the
  reward is the share of completion tokens that are alphabetic words (a checkable reward
  that keeps the policy on prose); the loss is -advantage * mean log-probability of the
  completion.

AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01 on matrices), gradients clipped to
norm 1.0, fp32 master weights; a published version is the master cast to bf16 (round to
nearest even). Everything is seeded, so the same package, torch build and settings give
the same bit patterns.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainConfig:
    """The shape of the training batches."""

    batch: int = 4
    """Text windows per next-token step; prompts per policy-gradient step."""
    seq: int = 128
    """Tokens per text window (prompts take the first 32 of theirs)."""
    group: int = 4
    """Completions sampled per prompt (policy gradient)."""
    completion: int = 24
    """Tokens per sampled completion."""


def corpus_tokens(tokenizer) -> torch.Tensor:
    """Token ids of the CPython documentation topics, in sorted topic order."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)


def windows(tokens: torch.Tensor, index: int, count: int, seq: int) -> torch.Tensor:
    """[count, seq] token windows, the `index`-th batch of them (wrapping around)."""
    n = tokens.numel() // seq
    rows = [(index * count + i) % n for i in range(count)]
    return torch.stack([tokens[r * seq : (r + 1) * seq] for r in rows])


def make_optimizer(model, lr: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.999),
        eps=1e-8,
    )


def _word_share(tokenizer, ids: torch.Tensor) -> torch.Tensor:
    """Per row, the share of tokens whose text is an alphabetic word."""
    pieces = [[tokenizer.decode([t]).strip() for t in row.tolist()] for row in ids]
    return torch.tensor([sum(p.isalpha() for p in row) / len(row) for row in pieces])


def ntl_loss(model, batch: torch.Tensor) -> torch.Tensor:
    return model(batch, labels=batch).loss


def pg_loss(model, tokenizer, prompts: torch.Tensor, cfg: TrainConfig, seed: int) -> torch.Tensor:
    """GRPO-style policy-gradient loss of completions sampled from `model` for `prompts`."""
    prompts = prompts.repeat_interleave(cfg.group, 0)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            top_k=0,
            temperature=1.0,
            max_new_tokens=cfg.completion,
            min_new_tokens=cfg.completion,
            pad_token_id=model.config.eos_token_id,
        )
    completion = out[:, prompts.shape[1] :]
    reward = _word_share(tokenizer, completion).view(-1, cfg.group)
    adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)).view(-1)
    logits = model(out).logits[:, prompts.shape[1] - 1 : -1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, completion[..., None])[..., 0]
    return -(adv * logp.mean(1)).mean()


def step(model, optimizer, loss: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def published(model) -> dict[str, torch.Tensor]:
    """The bf16 copy of the model's parameters a trainer publishes (tied ones once)."""
    return {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}
