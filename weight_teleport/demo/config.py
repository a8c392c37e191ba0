"""The demo's configuration: a dataclass, no torch (the CLI reads its defaults)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class DemoConfig:
    """Everything that determines a demo run (two runs with equal configs are bit-identical)."""

    steps: int = 50
    """Optimizer steps (weight versions after the first)."""
    lr: float = 3e-5
    """AdamW learning rate on the fp32 master weights. Billion-parameter models use
    1e-6..1e-5 in RL; a 4.8M-parameter toy needs a larger step to learn within a minute."""
    batch: int = 64
    """Rollouts per step."""
    prompt_len: int = 4
    """Random prompt tokens per rollout."""
    new_tokens: int = 8
    """Sampled tokens per rollout."""
    vocab: int = 64
    """Vocabulary size; the reward counts sampled tokens below vocab // 8."""
    hidden: int = 512
    """Model width."""
    layers: int = 2
    """Decoder layers."""
    seed: int = 0
    """Seed of the initial weights, prompts and sampling."""
    trainer_ranks: int = 1
    """Trainer processes: 1, a Publisher; more, ranks of a gloo group whose master weights
    FSDP2 shards, each publishing its own shard (a PublisherGroup)."""

    @property
    def target_tokens(self) -> int:
        return self.vocab // 8
