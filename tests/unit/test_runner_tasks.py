"""The shipped task set and the Harbor-format loader: ≥ 40 tasks, split, in sync with its generator, graded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from harnessrl.runtime.harness.tasks import TaskError, load_dir, load_task, parse_reward, split_tasks

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("generate_tasks", TASKS / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_tasks"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_at_least_40_tasks_split_into_train_and_test() -> None:
    tasks = load_dir(TASKS)
    assert len(tasks) >= 40
    train, test = split_tasks(tasks, "train"), split_tasks(tasks, "test")
    assert len(train) + len(test) == len(tasks) and len(test) >= 8 and len(train) >= 30
    for task in tasks.values():
        assert task.path.parent.name == task.split  # directory and metadata.split agree
        assert task.config.agent.timeout_sec and task.config.verifier.timeout_sec
        assert (task.tests_dir / "test.sh").stat().st_mode & 0o111
    categories = {t.config.metadata["category"] for t in tasks.values()}
    assert categories == {"python", "data-analysis"}


def test_committed_tree_matches_the_generator() -> None:
    expected = generator().tree()
    on_disk = {
        str(p.relative_to(TASKS)): p.read_text()
        for split in ("train", "test")
        for p in (TASKS / split).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert on_disk == expected, "run `python examples/tasks/generate.py` and commit the result"


def test_loader_errors_name_the_task(tmp_path: Path) -> None:
    bad = tmp_path / "broken"
    (bad / "tests").mkdir(parents=True)
    (bad / "task.toml").write_text("version = '1.0'\n")
    (bad / "instruction.md").write_text("do it")
    with pytest.raises(TaskError, match=r"broken.*tests/test.sh"):
        load_task(bad)
    (bad / "tests" / "test.sh").write_text("exit 0")
    (bad / "task.toml").write_text("[metadata]\nsplit = 'dev'\n")
    with pytest.raises(TaskError, match="split"):
        load_task(bad)
    (bad / "task.toml").write_text("[agent\n")
    with pytest.raises(TaskError, match=r"bad task\.toml"):
        load_task(bad)
    with pytest.raises(TaskError, match="no tasks"):
        load_dir(tmp_path / "broken" / "tests")


def test_reward_files_as_harbor_writes_them() -> None:
    assert parse_reward("1\n", None).reward == 1.0
    assert parse_reward(None, '{"reward": 0.5, "style": 1.0}').reward == 0.5
    assert parse_reward(None, '{"a": 1.0, "b": 0.0}').reward == 0.5
    assert parse_reward("0.25", '{"reward": 1}').reward == 0.25  # reward.txt wins
    for txt, js, msg in [(None, None, "neither"), ("yes", None, "not a number"), ("2", None, "outside"),
                         (None, "[1]", "object of numbers"), (None, "{", "not JSON")]:
        with pytest.raises(TaskError, match=msg):
            parse_reward(txt, js)


def test_hub_snapshot_is_loaded_through_huggingface_hub(
    hub_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task set pushed to the local Hub stand-in (it serves model-type repos) is downloaded with
    huggingface_hub.snapshot_download over HTTP and loaded."""
    import huggingface_hub.constants
    from harnessrl.runtime.contracts.runner_config import HubTasks
    from harnessrl.runtime.harness.tasks import source_dir

    from tests.fixtures.hub_server import Commit, Repo

    files = {str(p.relative_to(TASKS)): p.read_bytes() for p in (TASKS / "test").rglob("*") if p.is_file()}
    repo = Repo(repo_id="org/tasks", private=True)
    repo.commits["c1"] = Commit(oid="c" * 40, parent=None, message="tasks", files=files)
    repo.commits["c" * 40] = repo.commits.pop("c1")
    repo.branches["main"] = "c" * 40
    hub_server.state.repos["org/tasks"] = repo
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub_server.endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub_server.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    token = tmp_path / "token"
    token.write_text(hub_server.token + "\n")
    root = source_dir(HubTasks(repo_id="org/tasks", repo_type="model", subdir="test", token_file=token,
                               cache_dir=tmp_path / "cache"))
    tasks = load_dir(root)
    assert set(tasks) == set(split_tasks(load_dir(TASKS), "test"))
    assert all(t.split == "test" for t in tasks.values())
