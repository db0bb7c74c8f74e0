"""A Hub export that fails does not stop training: the error is kept for the status (the operator's
HubExportFailing reason) and cleared by the next export that succeeds."""

from __future__ import annotations

from pathlib import Path

import pytest
from harnessrl.runtime.contracts.learner_config import HubExport
from harnessrl.runtime.learner.checkpoint import CheckpointMeta
from harnessrl.runtime.learner.coordinator import Artifacts
from harnessrl.runtime.learner.hub import HubExporter
from harnessrl.runtime.learner.loop import export_checkpoint
from harnessrl.runtime.learner.metrics import StepMetrics


class ReachableHub(HubExporter):
    """The real exporter with the upload replaced: what a reachable Hub would answer (the upload itself is
    covered against the local Hub test server in tests/integration/test_learner_hub.py)."""

    def export(self, checkpoint: Path, history: list[StepMetrics]) -> str:
        return f"{self.cfg.revision_prefix}{CheckpointMeta.model_validate_json((checkpoint / 'meta.json').read_text()).step}"


def test_failed_export_is_reported_then_cleared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_HUB_TOKEN_HERE", raising=False)
    checkpoint = tmp_path / "step-0000002"
    checkpoint.mkdir()
    meta = CheckpointMeta(step=2, policy_version=2, policy_model="m-v2", adapter_kind="lora", written_at=0.0)
    (checkpoint / "meta.json").write_text(meta.model_dump_json())
    cfg = HubExport(repo="org/model", token_env="NO_HUB_TOKEN_HERE")
    artifacts = Artifacts(hub_revision="step-1")
    export_checkpoint(HubExporter(cfg, "run"), checkpoint, [], artifacts)  # does not raise
    assert artifacts.export_error == "ValueError: export: Hub token env var NO_HUB_TOKEN_HERE is empty or missing"
    assert artifacts.hub_revision == "step-1"  # the last good export stays in status
    export_checkpoint(ReachableHub(cfg, "run"), checkpoint, [], artifacts)
    assert artifacts.export_error is None and artifacts.hub_revision == "step-2"
