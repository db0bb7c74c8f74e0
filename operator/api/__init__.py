"""The harnessrl.io/v1alpha1 API: TrainingRun, HarnessPool and EnginePool as pydantic models.

The CRDs in crds/ are generated from these models (`harnessrl crds`); `load_manifest` reads a
manifest into them with errors that name the offending field.
"""

from harnessrl.operator.api.common import API_VERSION, GROUP, VERSION
from harnessrl.operator.api.enginepool import KIND as ENGINEPOOL_KIND
from harnessrl.operator.api.enginepool import PLURAL as ENGINEPOOL_PLURAL
from harnessrl.operator.api.enginepool import EnginePool, EnginePoolSpec, EnginePoolStatus
from harnessrl.operator.api.harnesspool import KIND as HARNESSPOOL_KIND
from harnessrl.operator.api.harnesspool import (
    KNOWN_HARNESSES,
    HarnessPool,
    HarnessPoolSpec,
    HarnessPoolStatus,
)
from harnessrl.operator.api.harnesspool import PLURAL as HARNESSPOOL_PLURAL
from harnessrl.operator.api.manifest import (
    ManifestError,
    Resource,
    load_manifest,
    load_manifests,
    parse_manifest,
)
from harnessrl.operator.api.status import Condition, set_condition
from harnessrl.operator.api.trainingrun import KIND as TRAININGRUN_KIND
from harnessrl.operator.api.trainingrun import PLURAL as TRAININGRUN_PLURAL
from harnessrl.operator.api.trainingrun import TrainingRun, TrainingRunSpec, TrainingRunStatus

__all__ = [
    "API_VERSION",
    "ENGINEPOOL_KIND",
    "ENGINEPOOL_PLURAL",
    "GROUP",
    "HARNESSPOOL_KIND",
    "HARNESSPOOL_PLURAL",
    "KNOWN_HARNESSES",
    "TRAININGRUN_KIND",
    "TRAININGRUN_PLURAL",
    "VERSION",
    "Condition",
    "EnginePool",
    "EnginePoolSpec",
    "EnginePoolStatus",
    "HarnessPool",
    "HarnessPoolSpec",
    "HarnessPoolStatus",
    "ManifestError",
    "Resource",
    "TrainingRun",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "load_manifest",
    "load_manifests",
    "parse_manifest",
    "set_condition",
]
