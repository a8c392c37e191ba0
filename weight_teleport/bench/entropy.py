"""Order-0 entropy of a weight delta, measured on bit patterns.

An element changed when its bit pattern changed (so -0.0 -> +0.0 is a change and a NaN
that kept its payload is not). A changed element's residual is the difference of the
order-preserving integer keys of its new and old bit patterns (for a w-bit float,
``key(b) = b ^ (2**w - 1)`` if the sign bit is set, else ``b ^ 2**(w-1)``), so a one-ULP
move is +-1 on either side of zero. The order-0 bound, in bits per element, is
``H(p) + p * H(residual)``: a change mask coded at its density ``p`` plus each changed
element's residual coded with its empirical histogram, both without context.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

_SIGNED_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class DeltaEntropy:
    """Order-0 statistics of one delta."""

    elements: int
    """Elements in the state."""
    changed: int
    """Elements whose bit pattern changed."""
    residual_bits: float
    """Empirical entropy of the residual histogram, bits per changed element."""

    @property
    def density(self) -> float:
        """Fraction of elements that changed."""
        return self.changed / self.elements if self.elements else 0.0

    @property
    def bound_bits_per_element(self) -> float:
        """Order-0 bound: H(p) + p * H(residual), in bits per element."""
        p = self.density
        return _binary_entropy(p) + p * self.residual_bits


def _binary_entropy(p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def order_keys(bits: torch.Tensor) -> torch.Tensor:
    """Map bit patterns (a signed integer view of 1, 2 or 4 bytes) to order-preserving
    unsigned keys, returned as int64: float order becomes integer order."""
    width = bits.element_size() * 8
    if width > 32:
        raise ValueError(f"order keys support 8, 16 and 32-bit patterns, not {width}-bit")
    unsigned = bits.to(torch.int64) & ((1 << width) - 1)
    sign_set = unsigned >> (width - 1) == 1
    return torch.where(sign_set, unsigned ^ ((1 << width) - 1), unsigned ^ (1 << (width - 1)))


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """Return the flat signed-integer view of ``t``'s bit patterns."""
    return t.contiguous().view(-1).view(_SIGNED_VIEW[t.element_size()])


def _histogram_entropy(counts: torch.Tensor) -> float:
    total = counts.sum().item()
    if total == 0:
        return 0.0
    q = counts.to(torch.float64) / total
    return float(-(q * q.log2()).sum())


def delta_entropy(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> DeltaEntropy:
    """Order-0 entropy of the delta from ``old`` to ``new`` (same names, shapes, dtypes),
    with one residual histogram pooled over all tensors."""
    residuals, elements = [], 0
    for name, old_tensor in old.items():
        old_bits, new_bits = bit_view(old_tensor), bit_view(new[name])
        changed = old_bits != new_bits
        residuals.append(order_keys(new_bits[changed]) - order_keys(old_bits[changed]))
        elements += old_bits.numel()
    residual = torch.cat(residuals) if residuals else torch.zeros(0, dtype=torch.int64)
    _, counts = torch.unique(residual, return_counts=True)
    return DeltaEntropy(elements, residual.numel(), _histogram_entropy(counts))
