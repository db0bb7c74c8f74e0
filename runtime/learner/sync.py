"""Weight sync: the new policy reaches the engines, then the proxy is told its name and version.

Three ways behind one interface (`publish(model, version) -> PolicyState`, blocking; the learner runs it off
the event loop):
- LoRA: save the adapter, `POST /v1/load_lora_adapter` as `<served>-v<N>` on every engine, unload old ones. Engines
  that do not see the learner's files (a cluster) get it uploaded to the adapter store in their Pod first.
- NCCL: full weights over vLLM's weight-transfer API, one transfer group per engine replica (weight_transfer.py).
  GPU only; the engines need `VLLM_SERVER_DEV_MODE=1` and `--weight-transfer-config '{"backend":"nccl"}'`.
- restart: write the adapter or full weights and `policy.json`; whoever runs the engines restarts them on it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
from harnessrl.runtime.contracts.client import bearer
from harnessrl.runtime.contracts.learner_config import EngineLink, ModelConfig, ProxyLink, SyncMode
from harnessrl.runtime.contracts.proxy import PolicyState, ProxyClient, SequencesResponse
from harnessrl.runtime.engine.adapter_store import StoredAdapter, adapter_tar
from harnessrl.runtime.engine.api_key import engine_headers
from harnessrl.runtime.engine.lora import (
    LoraEndpointError,
    load_lora_adapter,
    server_root,
    unload_lora_adapter,
)
from harnessrl.runtime.engine.restart import PublishedPolicy, write_published
from harnessrl.runtime.trajectory.models import TrainingSequence

log = logging.getLogger(__name__)


class WeightSync(Protocol):
    # Whether publishing overwrites the engines' own weights (NCCL): an engine then serves whatever the last
    # learner pushed, even a dead one's, so version 0 (the base) is pushed too. Else v0 is the base as served.
    replaces_weights: bool

    def publish(self, model: Any, version: int) -> PolicyState: ...

    def restore(self, version: int) -> list[str]:
        """Serve `version` again on engines that lost it (restarted); the URLs that needed it."""
        ...

    def retire(self, version: int) -> None:
        """The run is over: stop serving its policies (an engine it shares serves other runs on)."""
        ...


def adapter_name(served: str, version: int) -> str:
    return f"{served}-v{version}"


class LoraSync:
    replaces_weights = False  # adapters beside the base: the base model's name serves v0

    def __init__(self, engine: EngineLink, served_name: str, sync_dir: Path, keep: int = 3):
        self.engine = engine
        self.served = served_name
        self.sync_dir = sync_dir
        # Adapters kept loaded: the new one plus a few that in-flight calls may still name.
        self.keep = keep
        self.client = httpx.Client(timeout=engine.request_timeout_s, headers=engine_headers(engine.api_key_file))

    def publish(self, model: Any, version: int) -> PolicyState:
        name = adapter_name(self.served, version)
        path = self.sync_dir / name
        tmp = self.sync_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)  # the engine never sees a half-written adapter
        for i in range(len(self.engine.urls)):
            self._load(i, name, path)
        self._unload_old(version)
        return PolicyState(model=name, version=version)

    def restore(self, version: int) -> list[str]:
        name, path = adapter_name(self.served, version), self.sync_dir / adapter_name(self.served, version)
        missing = []
        for i, url in enumerate(self.engine.urls):
            served = self.client.get(f"{server_root(url)}/v1/models").json().get("data", [])
            if name not in {m.get("id") for m in served}:
                missing.append(url)
                self._load(i, name, path)
        return missing

    def _load(self, i: int, name: str, path: Path) -> None:
        url, where = self.engine.urls[i], self._engine_path(i, name, path)
        try:
            load_lora_adapter(url, name, where, client=self.client, timeout_s=self.engine.request_timeout_s)
        except LoraEndpointError as exc:
            # A resumed learner (or an earlier run on the same engine) published this name before: replace it.
            if "already been loaded" not in str(exc):
                raise
            unload_lora_adapter(url, name, client=self.client)
            load_lora_adapter(url, name, where, client=self.client, timeout_s=self.engine.request_timeout_s)

    def _engine_path(self, i: int, name: str, path: Path) -> str:
        """Where engine i reads the adapter: the learner's own path, or its upload to the engine's adapter store."""
        if not self.engine.adapter_stores:
            return str(path.resolve())
        url = f"{self.engine.adapter_stores[i]}/adapters/{name}"
        r = self.client.put(url, content=adapter_tar(path), headers=self._store_headers())
        if r.status_code != 200:
            raise LoraEndpointError(f"PUT {url} -> {r.status_code}: {r.text[:300]}")
        return StoredAdapter.model_validate(r.json()).path

    def _store_headers(self) -> dict[str, str]:
        return bearer(self.engine.read_store_token())

    def _unload_old(self, version: int) -> None:
        old = version - self.keep
        if old < 1:
            return
        name = adapter_name(self.served, old)
        self._unload(name)
        shutil.rmtree(self.sync_dir / name, ignore_errors=True)

    def retire(self, version: int) -> None:
        # Every version publish kept loaded; the files stay (checkpoints do not need them, but nothing is lost).
        for kept in range(max(1, version - self.keep + 1), version + 1):
            self._unload(adapter_name(self.served, kept))

    def _unload(self, name: str) -> None:
        """Unload `name` from every engine and its adapter store; one already gone is not an error."""
        for url in self.engine.urls:
            try:
                unload_lora_adapter(url, name, client=self.client)
            except Exception as exc:  # an already-evicted adapter is not a sync failure
                log.info("unload of %s on %s: %s", name, url, exc)
        for store in self.engine.adapter_stores:
            try:
                self.client.delete(f"{store}/adapters/{name}", headers=self._store_headers())
            except httpx.HTTPError as exc:  # a store that restarted lost it anyway (its volume is an emptyDir)
                log.info("deleting %s from %s: %s", name, store, exc)


class RestartSync:
    """Fallback: publish the policy (adapter or full weights) to a directory with `policy.json` naming it;
    whoever runs the engines restarts them on it (see engine/restart.py)."""

    replaces_weights = False

    def __init__(self, served_name: str, sync_dir: Path):
        self.served = served_name
        self.sync_dir = sync_dir

    def publish(self, model: Any, version: int) -> PolicyState:
        path = self.sync_dir / f"policy-v{version}"
        tmp = self.sync_dir / f".policy-v{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        is_adapter = hasattr(model, "peft_config")
        name = adapter_name(self.served, version) if is_adapter else self.served
        write_published(self.sync_dir, PublishedPolicy(version=version, model=name, path=str(path.resolve()),
                                                       adapter=is_adapter, written_at=time.time()))
        return PolicyState(model=name, version=version)

    def restore(self, version: int) -> list[str]:
        return []  # engines are restarted on policy.json by whoever runs them

    def retire(self, version: int) -> None:
        pass  # whoever runs the engines stops them with the run


def publish_policy(sync: WeightSync, policy: Callable[[], Any], served_name: str, version: int) -> PolicyState:
    """Serve `version` (the weights `policy` gives) on the engines; blocking. Version 0 is the base model as the
    engines serve it, unless the sync replaces their weights: a learner restarted before its first checkpoint
    must push its v0, or the engines keep the dead learner's last weights under the name v0."""
    if version == 0 and not sync.replaces_weights:
        return PolicyState(model=served_name, version=0)
    return sync.publish(policy(), version)


def make_sync(engine: EngineLink, model: ModelConfig, sync_dir: Path) -> WeightSync:
    sync_dir.mkdir(parents=True, exist_ok=True)
    if engine.sync == SyncMode.lora:
        return LoraSync(engine, model.adapter_name_prefix, sync_dir)
    if engine.sync == SyncMode.nccl:
        from harnessrl.runtime.learner.weight_transfer import NcclSync

        return NcclSync(engine, model.served_name)
    return RestartSync(model.served_name, sync_dir)


class ForeignProxy(RuntimeError):
    """A completion named a proxy this run does not own."""


class ProxyControl:
    """The learner's calls to the proxy's admin API: switch the served policy, fetch a session's sequences."""

    def __init__(self, link: ProxyLink, timeout_s: float = 60.0):
        self.url = link.url.rstrip("/")
        self.replica_urls = [u.rstrip("/") for u in link.replica_urls] or [self.url]
        self.session_urls = link.session_urls()
        self._token = link.read_admin_token()
        self.timeout_s = timeout_s

    async def set_policy(self, policy: PolicyState) -> None:
        """On every replica at once (setting it again is harmless, so a retry after a partial failure is safe);
        raises naming each replica that did not take it."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as c:
            proxy = ProxyClient(c, self._token)
            outcomes = await asyncio.gather(*(proxy.put_policy(url, policy) for url in self.replica_urls),
                                            return_exceptions=True)
        failed = [
            f"{url}: {outcome.response.status_code} {outcome.response.text[:300]}"
            if isinstance(outcome, httpx.HTTPStatusError) else f"{url}: {type(outcome).__name__}: {outcome}"
            for url, outcome in zip(self.replica_urls, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        if failed:
            raise RuntimeError(f"proxy PUT /policy failed on {len(failed)} of {len(outcomes)} replicas: "
                               + "; ".join(failed))

    def fetcher(self, client: httpx.AsyncClient) -> Callable[[str, str | None], Awaitable[list[TrainingSequence]]]:
        """The coordinator server's sequence fetcher (runtime/coordinator/server.py) over `client`."""

        async def fetch(session_id: str, base_url: str | None) -> list[TrainingSequence]:
            return list((await self.sequences(session_id, base_url, client)).sequences)

        return fetch

    async def sequences(self, session_id: str, base_url: str | None, client: httpx.AsyncClient) -> SequencesResponse:
        """From the replica that owns the session (`base_url`), or the configured proxy URL. A `base_url` that is
        not one of this run's proxy replicas (a runner's word, not the learner's) is refused before any request:
        the admin token goes nowhere else."""
        url = (base_url or self.url).rstrip("/")
        if url not in self.session_urls:
            raise ForeignProxy(f"session base URL {url!r} is not one of this run's proxy replicas")
        try:
            return await ProxyClient(client, self._token).sequences(url, session_id)
        except httpx.HTTPStatusError as exc:
            raise RuntimeError(f"proxy GET /sessions/{{id}}/sequences -> {exc.response.status_code}: "
                               f"{exc.response.text[:300]}") from None
