"""weight-teleport behind `vllm serve`: the weight-transfer backend driven over vLLM's HTTP
routes, in the order that keeps the server's generations on one version at a time.

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "weight_teleport"}' \\
        --worker-extension-cls weight_teleport.targets.vllm_backend.TeleportBackendExtension

    server = VllmServer("http://127.0.0.1:8000")
    server.init({"store_url": "http://origin:8000", "initial_version": 0})
    ...                           # every worker stages the versions it finds, while vLLM serves
    server.commit_version(7)      # the pause: "APPLIED", "SKIPPED" or "RESYNC"

`commit_version` freezes generation (`/pause?mode=keep`: requests in flight stay, with their
KV), commits (`/start_weight_update`, `/update_weights`, `/finish_weight_update`), reads the
outcome (`/collective_rpc` of `teleport_status`), and once the version is applied resets
the caches derived from the old weights (`/reset_prefix_cache` with the running requests'
KV and a connector's external cache, `/reset_encoder_cache`) and labels the outputs with the
version (`/update_weight_version`); then it resumes generation (`/resume`, on an error too).

A request in flight across an applied version samples its tokens before the pause with the
old weights; at the reset vLLM preempts it, and after the pause it computes its prompt and
the tokens it has again, with the new weights, and samples the rest with them. So every
token is sampled by one version, from KV of that version alone, and the response says which
tokens came from which version: `weight_versions`, spans of output tokens with their label
(vLLM's `/inference/v1/generate`, mounted with `--enable-scale-out`; `GET /weight_info`
gives the server's current label). A version that is not applied changes nothing.

vLLM 0.32 mounts these routes only with VLLM_SERVER_DEV_MODE=1. This client needs no vLLM;
the routes' arguments are documented by vLLM (`vllm/entrypoints/rl/online/api_router.py`,
`vllm/entrypoints/serve/dev/`)."""

import json
import urllib.error
import urllib.parse
import urllib.request

from weight_teleport.errors import WeightTeleportError
from weight_teleport.targets.vllm_engine import EngineCacheError
from weight_teleport.targets.worker_local import TeleportInitInfo, group_outcome


class VllmServerError(WeightTeleportError, RuntimeError):
    """The vLLM server refused a request; its message says why."""


class VllmServer:
    """A running `vllm serve` started with the weight-teleport backend (module docstring)."""

    def __init__(self, url: str, *, timeout: float = 600.0) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout

    def init(self, init_info: dict) -> None:
        """Every worker follows `init_info["store_url"]` (fields: `TeleportInitInfo`)."""
        TeleportInitInfo(**init_info)  # a typo fails here, not in the workers
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def commit_version(self, version: int, *, wait_s: float | None = None, through=None) -> str:
        """The pause: apply `version` on every worker or none, then reset the caches and
        label the outputs (module docstring). Returns the group's outcome, as
        `vllm_engine.commit_version` does.

        `through`: a vLLM `VLLMWeightSyncClient` of this server (the trainer-side engine's,
        `vllm_trainer.py`) that makes the three weight-update calls instead of this client;
        its finish carries `str(version)` as `weight_version`, as vLLM's trainer engines
        send it, which labels the outputs before the outcome is known, so a version not
        applied gets the server's previous label back before generation resumes."""
        info = {"version": version, "resets_caches": True} | ({} if wait_s is None else {"wait_s": wait_s})
        sync = self if through is None else through
        self._post("/pause", query={"mode": "keep", "clear_cache": "false"})
        try:
            label = None if through is None else self.weight_version()
            sync.start_weight_update()
            sync.update_weights(info)
            sync.finish_weight_update(None if through is None else str(version))
            statuses = self.status()
            outcome = group_outcome(statuses, version)
            if outcome is None:
                raise VllmServerError(
                    f"the workers report no common outcome for version {version}: "
                    f"{[s['outcomes'][-1:] for s in statuses]}"
                )
            if outcome == "APPLIED":
                self._reset_caches()
                self.update_weight_version(str(version))
            elif label is not None:
                self.update_weight_version(label)
        finally:
            self._post("/resume")
        return outcome

    # vLLM's `VLLMWeightSyncClient` protocol (structural): a `VllmServer` can be handed to
    # the trainer-side engine as its client.
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.init(init_info)

    def start_weight_update(self) -> None:
        self._post("/start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("/finish_weight_update", None if weight_version is None else {"weight_version": weight_version})

    def update_weight_version(self, label: str) -> None:
        """Label what the server generates from now on (`weight_versions` in responses)."""
        self._post("/update_weight_version", {"new_version": label})

    def weight_version(self) -> str:
        """The server's current label (`GET /weight_info`)."""
        return self._request("GET", "/weight_info", None)["weight_version"]

    def status(self) -> list[dict]:
        """Every worker's state (`WorkerLocal.status`; JSON: integer keys become strings)."""
        return self._post("/collective_rpc", {"method": "teleport_status"})["results"]

    def _reset_caches(self) -> None:
        reply = self._post("/reset_prefix_cache", query={"reset_running_requests": "true", "reset_external": "true"})
        if not reply.get("success"):
            raise EngineCacheError(
                "the server's KV connector refused to reset its cache: prompts may reuse KV "
                "computed with the old weights; POST /reset_prefix_cache?reset_external=true "
                "before serving"
            )
        self._post("/reset_encoder_cache")

    def _post(self, route: str, body: dict | None = None, query: dict | None = None) -> dict:
        return self._request("POST", route + ("?" + urllib.parse.urlencode(query) if query else ""), body or {})

    def _request(self, method: str, route: str, body: dict | None) -> dict:
        url = self.url + route
        request = urllib.request.Request(
            url,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            raise VllmServerError(
                f"{method} {route} failed ({e.code}): {e.read()[:2000]!r}; the server needs "
                "VLLM_SERVER_DEV_MODE=1 and the backend's serve arguments"
            ) from e
        return json.loads(raw) if raw else {}
