"""Publisher and subscriber configuration: plain dataclasses, no I/O."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, cast, get_args

from weight_teleport.format.codecs import CHOICES, DEFAULT, DEPRECATED_CODERS, Choice
from weight_teleport.format.limits import MAX_CHUNK_ELEMS
from weight_teleport.observe.config import MetricsConfig
from weight_teleport.pipeline.errors import ConfigError
from weight_teleport.quantize.names import FORMATS, FormatName
from weight_teleport.store import StoreConfig

if TYPE_CHECKING:
    from weight_teleport.pipeline.health import Health

Backpressure = Literal["block", "skip"]
BaselineDevice = Literal["cpu", "cuda"]
DecompressBackend = Literal["default", "cuda", "hardware"]
BACKPRESSURE, BASELINE_DEVICES = get_args(Backpressure), get_args(BaselineDevice)
DECOMPRESS_BACKENDS = get_args(DecompressBackend)


class _Fields:
    """Checks of a config's fields, each raising ConfigError that names the field."""

    def __init__(self, config):
        self.config = config

    def bad(self, name: str, why: str) -> ConfigError:
        return ConfigError(f"{type(self.config).__name__}.{name}={getattr(self.config, name)!r}: {why}")

    def whole(self, name: str, low: int, none: bool = False) -> None:
        value = getattr(self.config, name)
        if value is None and none:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.bad(name, f"use an integer >= {low}" + (" or None" if none else ""))

    def seconds(self, name: str, positive: bool = False, none: bool = False, finite: bool = True) -> None:
        value = getattr(self.config, name)
        if value is None and none:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (value > 0 if positive else value >= 0)
            or (finite and value == float("inf"))
        ):
            raise self.bad(
                name,
                f"use a{' finite' if finite else ''} number of seconds "
                f"{'> 0' if positive else '>= 0'}" + (" or None" if none else ""),
            )

    def choice(self, name: str, choices: tuple) -> None:
        if getattr(self.config, name) not in choices:
            raise self.bad(name, f"use one of {', '.join(map(repr, choices))}")

    def instance(self, name: str, kind, what: str) -> None:
        if not isinstance(getattr(self.config, name), kind):
            raise self.bad(name, f"use {what}")


@dataclass
class RetentionConfig:
    """Which objects a publisher keeps in the store."""

    keep_anchors: int = 2
    """Anchors kept (the newest ones); every object older than the oldest kept anchor is
    removed from the manifest, then deleted. 0 keeps everything."""


@dataclass
class PublisherConfig:
    """Options of `Publisher`."""

    anchor_every: int = 16
    """A full snapshot (anchor) is published with every Nth version after the previous
    anchor, beside that version's delta. The first version is always an anchor."""
    catchup_every: int = 0
    """Catch-up deltas from the boot version (the first version of a fresh store: the
    checkpoint the run began from, which samplers start from): every Nth version after the
    previous one also gets a delta straight from the boot version, uploaded in the
    background after the version's own delta, and the older one is deleted. A sampler
    that holds the boot version (`SubscriberConfig.initial_version`) joins or restarts
    with that one delta where it is smaller than an anchor and the deltas after it. It costs
    one more copy of the weights on `baseline_device` (counted in `memory_budget_bytes`)
    and an encode every N versions; the boot version's anchor is kept by retention. The
    manifest becomes format 3, which readers older than it refuse. 0: off."""
    max_pending: int = 1
    """Snapshots waiting to be encoded while one is in flight (the bounded queue)."""
    backpressure: Backpressure = "block"
    """When the queue is full: "block" makes `publish` wait for a slot; "skip" drops the
    oldest waiting snapshot (that version is never published; the next delta spans it)."""
    baseline_device: BaselineDevice = "cpu"
    """Where the baseline (the last published weights) and the snapshots live: "cpu"
    (pinned when CUDA is present; the CPU codec encodes) or "cuda" (device copies on a
    side stream; the CUDA codec encodes on a side stream while training goes on)."""
    memory_budget_bytes: int | None = None
    """Upper bound on the host memory of the baseline plus queued snapshots; `publish`
    raises ConfigError if the weights would not fit. None: no bound."""
    resume: bool = True
    """Continue the versions already in the store: the first delta is taken against the
    latest version there (fetched once). False: start with a fresh anchor."""
    chunk_elems: int | None = None
    """Codec chunk size in elements; None takes the codec's default."""
    hints: Mapping[str, Any] | None = None
    """Per tensor name, how packs walk and cut it for samplers that hold slices (a
    `codec.Hint`, an (order, bounds) pair, or `targets.vllm_layout.slice_hints(config,
    tp_sizes)` as it is): then each sampler rank fetches and stages only its chunks (format
    version 2). None: regular chunks (format version 1)."""
    level: int = 3
    """Zstd level of the pack streams."""
    codec: Choice = DEFAULT
    """The codec of a delta's sparse records (`encode_delta`'s `codec`): "sparse";
    "sparse_ac", smaller packs, slower to code where many elements change (readers older
    than codec `sparse_ac` refuse them); or "auto", `sparse_ac` for each record with at
    most 1% of its elements changed and `sparse` for the others
    (`format.codecs.AUTO_AC_MAX_DENSITY`)."""
    threads: int | None = None
    """Encoder threads; None uses every core."""
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """What to delete as new anchors arrive."""
    signing_key: bytes | None = None
    """Ed25519 private key that signs every manifest written (32 raw bytes, or an
    unencrypted PKCS#8 PEM; `weight_teleport.format.signing.generate_keypair` makes one).
    Subscribers given the public key in `SubscriberConfig.trusted_keys` refuse manifests
    it did not sign. Needs `cryptography` (`pip install 'weight-teleport[sign]'`). None:
    manifests are unsigned."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Options of the transport (token, endpoint, retries)."""
    retry_for_s: float = 60.0
    """How long each write of a version (an upload, the manifest) keeps trying a store
    that fails transiently (a refused connection, a timeout, HTTP 5xx), with a doubling
    backoff up to `store.retry.backoff_max_s`, before the version fails with the store's
    last error; each try is the store's own (`store.retry`). 0: the store's tries alone.
    The check of write access when the publisher starts is not retried beyond them: a
    wrong URL or token fails at once."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Where the Prometheus metrics are seen (`Publisher.metrics`): a port of their own,
    or a registry the host process serves."""
    sampler_format: FormatName | None = None
    """What the samplers hold: None, the tensors `publish` is given; "fp8-block", a
    block-FP8 checkpoint (`weight_teleport.quantize`, docs/FORMAT.md): the weights of
    linear layers quantized where they lie (on the trainer's GPU, one pass over them) as
    `publish` snapshots them, and published with their scales as any tensor is. The
    given tensors never leave the trainer; a `config.json` among `publish`'s files gains
    the format's `quantization_config`."""
    coder: str | None = None
    """Deprecated (use `codec`): "zstd" meant "sparse", "adaptive" "sparse_ac". Checked
    and moved into `codec` when the config is made (then None)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value no publisher can use;
        `Publisher` calls it again (fields may change after construction)."""
        f = _Fields(self)
        bad, whole = f.bad, f.whole
        if self.coder is not None:
            if self.coder not in DEPRECATED_CODERS:
                raise bad("coder", f"coder is deprecated: set codec, one of {', '.join(map(repr, CHOICES))}")
            if self.codec not in (DEFAULT, DEPRECATED_CODERS[self.coder]):
                raise bad("coder", f"it is deprecated: set codec={self.codec!r} alone")
            warnings.warn(
                f"PublisherConfig.coder={self.coder!r} is deprecated: use codec={DEPRECATED_CODERS[self.coder]!r}",
                DeprecationWarning,
                stacklevel=4,
            )
            # a deprecated coder names one of CHOICES (checked below with the rest)
            self.codec, self.coder = cast(Choice, DEPRECATED_CODERS[self.coder]), None
        for name, choices in (
            ("backpressure", BACKPRESSURE),
            ("baseline_device", BASELINE_DEVICES),
            ("codec", CHOICES),
            ("sampler_format", (None, *FORMATS)),
        ):
            f.choice(name, choices)
        whole("anchor_every", 1)
        whole("catchup_every", 0)
        whole("max_pending", 1)
        whole("memory_budget_bytes", 1, none=True)
        whole("threads", 1, none=True)
        whole("level", -(1 << 17))
        if self.level > 22:
            raise bad("level", "zstd levels go up to 22")
        whole("chunk_elems", 8, none=True)
        if self.chunk_elems is not None and (self.chunk_elems % 8 or self.chunk_elems > MAX_CHUNK_ELEMS):
            raise bad("chunk_elems", f"use a multiple of 8, at most {MAX_CHUNK_ELEMS}, or None")
        if not isinstance(self.resume, bool):
            raise bad("resume", "use True or False")
        if self.hints is not None and not isinstance(self.hints, Mapping):
            raise bad("hints", "use a mapping of tensor name -> hint, or None")
        f.seconds("retry_for_s", finite=False)  # inf: retry for as long as it takes
        if self.signing_key is not None and not isinstance(self.signing_key, (bytes, str)):
            raise bad("signing_key", "use the key's bytes (raw or PEM), or None")
        for name, kind in (("retention", RetentionConfig), ("store", StoreConfig), ("metrics", MetricsConfig)):
            f.instance(name, kind, f"a {kind.__name__}")
        keep = self.retention.keep_anchors
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise ConfigError(f"RetentionConfig.keep_anchors={keep!r}: use an integer >= 0 (0 keeps everything)")


@dataclass
class SubscriberConfig:
    """Options of `Subscriber`."""

    initial_version: int | None = None
    """The version the target already holds (after a restart); None: unknown, start from
    an anchor. A wrong claim is caught by the digests and resynced."""
    max_staged_bytes: int = 1 << 30
    """Staged patches are held up to this much memory; staging pauses above it until
    `apply` (one version is always staged, whatever its size)."""
    device_staged_bytes: int | None = None
    """CUDA targets: a staged patch larger than this is held in pinned host memory instead
    of device memory (`stage_delta`'s `device_budget`); None keeps patches on the device."""
    decompress_backend: DecompressBackend = "default"
    """CUDA targets: nvCOMP's decompression backend (`CudaCodecConfig.decompress_backend`):
    "default", "cuda", or "hardware" (Blackwell's decompression engine, for LZ4 packs;
    it raises on older GPUs)."""
    watch_timeout_s: float = 5.0
    """Longest single wait for a new manifest before checking again."""
    fetch_attempts: int = 3
    """Failures of one object (missing, rejected, or failing to stage; counted across
    fetches until it is staged) before it is set aside and another plan is sought. Also
    the consecutive failures after which `health` turns from "degraded" to "failing"."""
    retry_backoff_s: float = 0.2
    """Delay after a failure before the next try; doubled after each consecutive failure."""
    retry_backoff_max_s: float = 5.0
    """Longest delay between two tries."""
    give_up_after_s: float | None = 600.0
    """After this long without progress (every try failing, or a refused manifest
    standing), the subscriber gives up: it stops following and `wait`/`apply` raise
    SubscriberFailed with the last error. The target keeps its last version. None: never
    give up (watch `Subscriber.health` or `on_health` instead)."""
    on_health: Callable[["Health"], None] | None = None
    """Called with the new `Health` each time the state changes (starting, healthy,
    degraded, failing), from the subscriber's thread: keep it short, it must not block."""
    follow_resets: bool = False
    """Follow a store whose latest version went backwards (a deliberate reset or restore):
    resync from its anchor. False: such a manifest is refused as a rollback (health says
    so) and the subscriber keeps its weights until the store reaches its version again."""
    trusted_keys: tuple[bytes, ...] = ()
    """Ed25519 public keys (32 raw bytes, or PEM) whose manifest signatures are accepted
    (`PublisherConfig.signing_key`); several allow a key rotation. Non-empty: unsigned
    manifests and manifests signed by other keys are refused. Needs `cryptography`."""
    threads: int | None = None
    """Decoder threads; None uses every core."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Options of the transport (endpoint, retries)."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Where the Prometheus metrics are seen (`Subscriber.metrics`): a port of their own,
    or a registry the host process serves."""
    heartbeat_s: float | None = 5.0
    """Seconds between two heartbeats (version, state, lag, last pause and error) to the
    origin's status page, sent from a thread of their own: never on `apply`'s path, and
    harmless when the origin is unreachable (bounded timeouts, backoff, logged once per
    backoff step). None: no heartbeat."""
    report_to: str | None = None
    """URL of the HTTP origin that hears the heartbeats; None: the subscriber's own URL
    when it is an http(s):// origin, else none is sent. They carry `store.read_token`
    (else `store.token`)."""
    sampler_id: str | None = None
    """This sampler's name on the status page; None: HOST-PID."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value no subscriber can use;
        `Subscriber` calls it again (fields may change after construction). The trusted
        keys' bytes are parsed when the subscriber starts (format/signing.py)."""
        f = _Fields(self)
        f.whole("initial_version", 0, none=True)
        f.whole("max_staged_bytes", 1)
        f.whole("device_staged_bytes", 0, none=True)
        f.choice("decompress_backend", DECOMPRESS_BACKENDS)
        f.seconds("watch_timeout_s", positive=True)
        f.whole("fetch_attempts", 1)
        f.seconds("retry_backoff_s")
        f.seconds("retry_backoff_max_s")
        f.seconds("give_up_after_s", positive=True, none=True)
        if self.on_health is not None and not callable(self.on_health):
            raise f.bad("on_health", "use a function of one Health, or None")
        f.instance("follow_resets", bool, "True or False")
        if isinstance(self.trusted_keys, (bytes, str)) or not isinstance(self.trusted_keys, (tuple, list)):
            raise f.bad("trusted_keys", "use a tuple of public keys (bytes each)")
        f.whole("threads", 1, none=True)
        f.instance("store", StoreConfig, "a StoreConfig")
        f.instance("metrics", MetricsConfig, "a MetricsConfig")
        f.seconds("heartbeat_s", positive=True, none=True)
        for name in ("report_to", "sampler_id"):
            f.instance(name, (str, type(None)), "a string, or None")
