"""Host <-> device copy bandwidth of pinned memory (the floor of a snapshot's encode and stage).

python bench/investigations/d2h.py [--gb 4]
"""

import argparse

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=4.0)
    n = int(p.parse_args().gb * 2**30)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    for name, dst, src in (("device -> pinned host", host, dev), ("pinned host -> device", dev, host)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        b.record()
        torch.cuda.synchronize()
        print(f"{name}: {3 * n / (a.elapsed_time(b) / 1e3) / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
