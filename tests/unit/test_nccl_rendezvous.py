"""Where the learner's NCCL weight-transfer rendezvous listens (engine.weightSync nccl).

vLLM's trainer side opens the group with `StatelessProcessGroup.create`, which binds rank 0's listening socket to
the address it is given; tests elsewhere use 127.0.0.1, which every process owns. On a cluster the address was the
learner's Service name, whose ClusterIP is on no Pod's interfaces: the bind fails (EADDRNOTAVAIL). Here: vLLM's
own create on an address this host does not own, the learner's refusal of such an address at start, and the
rendered learner Pod, whose rendezvous address is its own IP from the downward API."""

from __future__ import annotations

import errno
import socket

import pytest
import yaml
from harnessrl.operator.plan.placement import POD_IP_ENV
from harnessrl.runtime.contracts.learner_config import EngineLink, LearnerConfig, SyncMode
from harnessrl.runtime.contracts.learner_exit import EXIT_FAILED, WEIGHT_SYNC_ADDRESS, LearnerFailure
from harnessrl.runtime.learner.weight_transfer import NcclSync

from tests.ports import free_port
from tests.unit.test_operator_manifests import VARIANTS, manifests

# TEST-NET-3 (RFC 5737): routable nowhere, so on none of this host's interfaces, as a ClusterIP is on none of a Pod's.
NOT_OURS = "203.0.113.7"


def test_vllms_rendezvous_binds_its_address_so_an_address_the_process_does_not_own_fails() -> None:
    from vllm.distributed.utils import StatelessProcessGroup

    with pytest.raises(OSError) as info:
        StatelessProcessGroup.create(host=NOT_OURS, port=free_port(), rank=0, world_size=2, store_timeout=5)
    assert info.value.errno == errno.EADDRNOTAVAIL
    # The same call on an address this process owns opens the group (a group of one returns at once).
    group = StatelessProcessGroup.create(host="127.0.0.1", port=free_port(), rank=0, world_size=1, store_timeout=5)
    assert group.rank == 0


def sync(**link: object) -> NcclSync:
    return NcclSync(EngineLink(urls=["http://127.0.0.1:1"], sync=SyncMode.nccl, **link), "m", init_info_type=object)


def test_the_learner_refuses_at_start_a_rendezvous_address_it_does_not_own() -> None:
    with pytest.raises(LearnerFailure) as info:
        sync(nccl_master_address=NOT_OURS)
    assert info.value.reason == WEIGHT_SYNC_ADDRESS and info.value.exit_code == EXIT_FAILED
    assert NOT_OURS in info.value.message and "Pod's own IP" in info.value.message


def test_the_rendezvous_address_is_the_pods_own_ip_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POD_IP_ENV, "127.0.0.1")
    assert sync(nccl_master_address_env=POD_IP_ENV).address == "127.0.0.1"
    monkeypatch.delenv(POD_IP_ENV)
    with pytest.raises(LearnerFailure, match=f"{POD_IP_ENV}, which is not set") as info:
        sync(nccl_master_address_env=POD_IP_ENV)
    assert info.value.reason == WEIGHT_SYNC_ADDRESS


def test_the_rendered_learner_pod_gives_its_rendezvous_an_address_it_owns(monkeypatch: pytest.MonkeyPatch) -> None:
    out = manifests(**VARIANTS["nccl"])
    [container] = out[("Job", "run-learner")]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env[POD_IP_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    cfg = LearnerConfig.model_validate(yaml.safe_load(out[("ConfigMap", "run-learner-config")]["data"]["config.yaml"]))
    assert cfg.engine.nccl_master_address_env == POD_IP_ENV
    # As the kubelet fills it in: the Pod's IP, an address of the Pod's own network namespace (here, this host's).
    own = socket.gethostbyname(socket.gethostname())
    monkeypatch.setenv(POD_IP_ENV, own)
    assert cfg.engine.rendezvous_address() == own
    with socket.socket() as s:
        s.bind((cfg.engine.rendezvous_address(), 0))
    # The Service in front of the learner is not where the rendezvous listens.
    assert "svc" not in cfg.engine.rendezvous_address()
