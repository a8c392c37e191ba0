"""A sampler process for the status page test: follows URL into a plain state, sends
heartbeats as SAMPLER_ID, and exits when its standard input closes.

    python sampler_process.py URL SAMPLER_ID"""

import sys
import threading

import torch

from weight_versions import expected
from weight_teleport.pipeline import SubscriberConfig
from weight_teleport.subscribe import Subscriber
from weight_teleport.targets.torch import TorchTarget


def main(url: str, sampler_id: str) -> None:
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    live = {k: torch.zeros_like(t) for k, t in expected(0).items()}
    config = SubscriberConfig(heartbeat_s=0.2, sampler_id=sampler_id, watch_timeout_s=0.5, threads=1)
    with Subscriber(url, TorchTarget(live), config) as sub:
        print("following", flush=True)
        while not done.is_set():
            if sub.wait(0.2):
                sub.apply()


if __name__ == "__main__":
    main(*sys.argv[1:3])
