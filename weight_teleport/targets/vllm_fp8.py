"""vLLM's block-FP8 linear layers in a worker: which of them hold the checkpoint's tensors
as loaded (`targets.vllm_layout` maps them), and a refusal naming the others.

vLLM 0.32's `Fp8LinearMethod` keeps a block-FP8 layer's `weight` (float8_e4m3fn [N, K]) and
`weight_scale_inv` (float32 blocks) as its loader fills them, then hands them to the GEMM
kernel it chose (`init_fp8_linear_kernel`), whose `process_weights_after_loading` may
rewrite them:

- CUTLASS, Triton and the torch fallback keep both as loaded (their transposes are views
  taken per call);
- DeepGEMM (and FlashInfer's DeepGEMM kernel), the default on Hopper where N % 64 == 0 and
  K % 128 == 0, keeps them too unless `VLLM_USE_DEEP_GEMM_E8M0` is on (its default): then
  it requantizes every block in place to power-of-two scales (`requant_weight_ue8m0_inplace`),
  derived values that a patch of the checkpoint's would leave stale;
- the CPU kernels (AMX) repack the weight for their ISA, Marlin repacks both, and the
  per-tensor FP8 path requantizes fused shards to one scale.

A worker refuses the rewriting kernels at start (`check_fp8_layers`), naming the layer, the
kernel and the setting that avoids it: it never patches a tensor the kernel does not read."""

from weight_teleport.targets.vllm_layout import UnsupportedLayoutError

KEEPS_CHECKPOINT = (
    "CutlassFp8BlockScaledMMKernel",
    "TritonFp8BlockScaledMMKernel",
    "BlockWiseTorchFP8ScaledMMLinearKernel",
)
"""vLLM block-FP8 GEMM kernels that compute from the checkpoint's tensors as loaded."""
DEEP_GEMM = ("DeepGemmFp8BlockScaledMMKernel", "FlashInferFp8DeepGEMMDynamicBlockScaledKernel")
"""Kernels that keep them unless DeepGEMM's E8M0 scales are on."""


def refusal(layer: str, block_quant: bool, kernel: str, e8m0: bool) -> str | None:
    """Why a worker cannot patch FP8 linear layer `layer` in place (None: it can), from its
    method's `block_quant`, its kernel's class name and whether DeepGEMM's E8M0 scales are on."""
    if not block_quant:
        return f"{layer}: FP8 without weight blocks (per-tensor or per-channel) is not mapped; publish fp8-block"
    if kernel in KEEPS_CHECKPOINT or (kernel in DEEP_GEMM and not e8m0):
        return None
    if kernel in DEEP_GEMM:
        return (
            f"{layer}: vLLM's {kernel} requantizes the block-FP8 weights to power-of-two scales after "
            "loading (VLLM_USE_DEEP_GEMM_E8M0=1), which a patch would leave stale; start the engine "
            "with VLLM_USE_DEEP_GEMM_E8M0=0 (or VLLM_USE_DEEP_GEMM=0)"
        )
    return (
        f"{layer}: vLLM's {kernel} repacks the block-FP8 weights after loading; only "
        f"{', '.join(KEEPS_CHECKPOINT + DEEP_GEMM)} read the checkpoint's tensors (choose one with "
        "VLLM_DISABLED_KERNELS or --linear-backend)"
    )


def check_fp8_layers(model) -> None:
    """Raise UnsupportedLayoutError for the first FP8 linear layer of vLLM's `model` whose
    kernel does not compute from the checkpoint's tensors as loaded (`refusal`)."""
    from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used

    e8m0 = None
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or type(method).__name__ != "Fp8LinearMethod":
            continue
        if e8m0 is None:
            e8m0 = bool(is_deep_gemm_e8m0_used())
        why = refusal(name, bool(method.block_quant), type(method.fp8_linear).__name__, e8m0)
        if why:
            raise UnsupportedLayoutError(why)
