"""A gloo weight-transfer backend for vLLM, so a whole NCCL-style publish runs on CPU.

vLLM 0.32 ships no weight-transfer backend that runs without CUDA (nccl and sparse_nccl open a PyNccl
communicator, ipc shares CUDA memory). This one subclasses vLLM's own dense NCCL engines and replaces only
the collective: a torch gloo group instead of NCCL. Everything else is vLLM's: the HTTP routes
(/init_weight_transfer_engine, /start_weight_update, /update_weights, /finish_weight_update), the worker's
init-info parsing and rank arithmetic, the trainer-side round trip (`send_weights`: start → update RPC
concurrent with the broadcast → finish) and the layerwise reload into the served model.

The server side is loaded as a vLLM general plugin (entry point group `vllm.general_plugins`, see
`plugin_dist_info`); the trainer side is registered in the test process with `register_trainer`.
"""

from __future__ import annotations

import datetime
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

BACKEND = "gloo"
TIMEOUT = datetime.timedelta(seconds=120)


def _group(host: str, port: int, rank: int, world_size: int) -> Any:
    """A gloo group on vLLM's own rendezvous, as its NCCL engines open theirs: rank 0 binds `host` (a TCPStore
    alone would listen on every interface, and hide a rendezvous address the trainer does not own)."""
    from vllm.distributed.utils import StatelessProcessGroup

    group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size,
                                         store_timeout=int(TIMEOUT.total_seconds()))
    return torch.distributed.ProcessGroupGloo(group.store, rank, world_size, TIMEOUT)


def register() -> None:
    """The vLLM general plugin: make `--weight-transfer-config '{"backend":"gloo"}'` available to workers."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    class GlooWeightTransferEngine(NCCLWeightTransferEngine):
        def init_transfer_engine(self, init_info: Any) -> None:
            pc = self.parallel_config
            rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
            self.model_update_group = _group(init_info.master_address, init_info.master_port, rank,
                                             init_info.world_size)

        def receive_weights(self, update_info: Any) -> None:
            if self.model_update_group is None:
                raise RuntimeError("gloo weight transfer not initialized")
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes,
                                               strict=True):
                weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
                self.model_update_group.broadcast(weight, 0).wait()
                self.model.load_weights([(name, weight)])

        def shutdown(self) -> None:
            self.model_update_group = None

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)


@functools.cache
def trainer_init_info_type() -> type:
    """`NCCLTrainerInitInfo` with the gloo backend key (registered on first use in the test process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
    )

    @dataclass
    class GlooTrainerInitInfo(NCCLTrainerInitInfo):
        backend: ClassVar[str] = BACKEND

    class GlooTrainerWeightTransferEngine(NCCLTrainerWeightTransferEngine):
        @classmethod
        def trainer_init(cls, init_info: Any, *, client: Any, source: Any = None) -> Self:
            engine = cls(client=client, source=source, is_sender=init_info.is_sender, packed=False)
            payload = worker_init_payload(NCCLWeightTransferInitInfo(
                master_address=init_info.master_address, master_port=init_info.master_port, rank_offset=1,
                world_size=init_info.world_size, packed=False,
            ))
            # As vLLM's NCCL engine: the workers block in init until the trainer joins the rendezvous.
            with ThreadPoolExecutor(max_workers=1) as exe:
                future = exe.submit(client.init_weight_transfer_engine, payload)
                engine.model_update_group = _group(init_info.master_address, init_info.master_port, 0,
                                                   init_info.world_size)
                future.result()
            return engine

        def _broadcast(self, source: Any, meta: Any) -> None:
            for _name, tensor in self._checked_iter(source, meta):
                self.model_update_group.broadcast(tensor.detach().contiguous(), 0).wait()

        def shutdown(self) -> None:
            self.model_update_group = None

    WeightTransferTrainerFactory.register_engine(BACKEND, GlooTrainerWeightTransferEngine)
    return GlooTrainerInitInfo


PLUGIN_MODULE = "harnessrl_test_gloo_transfer"


def plugin_site(site: Path) -> Path:
    """This module and a distribution's metadata declaring its `register` as a vLLM general plugin, under
    `site`: put `site` on the server's PYTHONPATH (importlib.metadata finds the entry point there, no install;
    the module is copied because the repo root on the path would shadow the stdlib `operator`)."""
    info = site / f"{PLUGIN_MODULE}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (site / f"{PLUGIN_MODULE}.py").write_text(Path(__file__).read_text())
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_MODULE}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\ngloo_transfer = {PLUGIN_MODULE}:register\n")
    return site
