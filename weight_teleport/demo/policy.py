"""The demo's RL problem: a small Qwen3-style policy learns to emit tokens of a target set.

Plain torch + transformers, shared by the trainer, the sampler and the colocated reference
run, so that all three compute exactly the same thing."""

from typing import TYPE_CHECKING

import torch

from weight_teleport.demo.config import DemoConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def build_model(cfg: DemoConfig, dtype: torch.dtype):
    """The policy, initialised from cfg.seed (no download)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=2 * cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=cfg.hidden // 4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=None,
    )
    torch.manual_seed(cfg.seed)
    return Qwen3ForCausalLM(config).to(dtype).eval()


def published(master: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The bf16 weights a trainer publishes from its fp32 master (round to nearest even)."""
    return {k: v.detach().to(torch.bfloat16) for k, v in master.state_dict().items()}


def sampling_seed(cfg: DemoConfig, version: int) -> int:
    return cfg.seed * 100_003 + version


def prompts(cfg: DemoConfig, version: int) -> torch.Tensor:
    """The random prompts [batch, prompt_len] of `version`."""
    gen = torch.Generator().manual_seed(sampling_seed(cfg, version))
    return torch.randint(0, cfg.vocab, (cfg.batch, cfg.prompt_len), generator=gen)


def rollout(sampler: "PreTrainedModel", cfg: DemoConfig, version: int) -> torch.Tensor:
    """Prompts and sampled continuations [batch, prompt_len + new_tokens] at `version`
    (HF transformers `generate`)."""
    ids = prompts(cfg, version)
    torch.manual_seed(sampling_seed(cfg, version))
    with torch.no_grad():
        out = sampler.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            max_new_tokens=cfg.new_tokens,
            min_new_tokens=cfg.new_tokens,
            pad_token_id=0,
        )
    return out[:, : cfg.prompt_len + cfg.new_tokens]


def rewards(tokens: torch.Tensor, cfg: DemoConfig) -> torch.Tensor:
    """Verifiable reward: the fraction of sampled tokens inside the target set."""
    return (tokens[:, cfg.prompt_len :] < cfg.target_tokens).float().mean(dim=1)


def train_step(master: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, cfg: DemoConfig) -> float:
    """One REINFORCE step with a mean baseline; returns the batch's mean reward."""
    r = rewards(tokens, cfg)
    advantage = r - r.mean()
    master.train()
    logits = master(tokens).logits[:, cfg.prompt_len - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, cfg.prompt_len :, None])[..., 0]
    loss = -(advantage[:, None] * logp).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    master.eval()
    return float(r.mean())


def make_optimizer(master: torch.nn.Module, cfg: DemoConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(master.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0)
