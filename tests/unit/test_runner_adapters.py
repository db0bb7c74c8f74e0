"""Adapters: the exact commands, env and config files each harness gets, and how its outcome is read."""

from __future__ import annotations

import json
import tomllib

import pytest
import yaml
from harnessrl.runtime.contracts.harness_versions import pins
from harnessrl.runtime.contracts.runner_config import CustomHarnessSpec, KnownHarnessSpec
from harnessrl.runtime.harness.adapters import KNOWN, adapter_for
from harnessrl.runtime.harness.adapters.base import HarnessStatus, RunContext, RunOutput
from harnessrl.runtime.harness.adapters.custom import Custom

CTX = RunContext(
    instruction="Sum the `amount` column; write it to answer.txt. Don't 'quote' me.",
    model="policy",
    base_url="http://127.0.0.1:8080/s/abc/v1",
    api_key="sess-123",
    step_budget=7,
    home="/sb/home",
    workspace="/sb/workspace",
)


def test_every_known_harness_is_pinned_and_has_an_adapter() -> None:
    assert set(KNOWN) == set(pins()) == {"claude-code", "codex", "opencode", "gemini-cli", "qwen-code", "mini-swe-agent"}
    for name, cls in KNOWN.items():
        adapter = cls()
        assert adapter.version == pins()[name].version
        assert adapter.invocation(CTX).argv[0] == pins()[name].bin


def test_pinned_versions_are_exact() -> None:
    for pin in pins().values():
        assert all(part.isdigit() for part in pin.version.split(".")), pin
    assert pins()["claude-code"].version == "2.1.197"  # the last release that runs on Node 20


def test_claude_code() -> None:
    inv = KNOWN["claude-code"]().invocation(CTX)
    assert inv.argv == [
        "claude", "-p", CTX.instruction, "--model", "policy", "--output-format", "json",
        "--max-turns", "7", "--dangerously-skip-permissions",
    ]
    assert inv.env["ANTHROPIC_BASE_URL"] == CTX.base_url and inv.env["ANTHROPIC_API_KEY"] == "sess-123"
    assert inv.env["IS_SANDBOX"] == "1" and inv.env["DISABLE_TELEMETRY"] == "1"
    assert inv.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and inv.env["DISABLE_AUTOUPDATER"] == "1"
    assert inv.env["ANTHROPIC_SMALL_FAST_MODEL"] == "policy"
    assert json.loads(inv.files["/sb/home/.claude/settings.json"])["permissions"]["defaultMode"] == "bypassPermissions"


def test_codex_writes_a_custom_responses_provider() -> None:
    inv = KNOWN["codex"]().invocation(CTX)
    assert inv.argv[:5] == ["codex", "exec", "--skip-git-repo-check", "--json", "--dangerously-bypass-approvals-and-sandbox"]
    assert inv.argv[-1] == CTX.instruction
    assert inv.env["CODEX_HOME"] == "/sb/home/.codex"
    config = tomllib.loads(inv.files["/sb/home/.codex/config.toml"])
    provider = config["model_providers"][config["model_provider"]]
    assert provider["wire_api"] == "responses" and provider["base_url"] == CTX.base_url
    assert inv.env[provider["env_key"]] == "sess-123"
    assert config["features"]["plugins"] is False and config["analytics"]["enabled"] is False
    assert config["feedback"]["enabled"] is False and config["check_for_update_on_startup"] is False


@pytest.mark.parametrize(
    ("dialect", "package", "base"),
    [
        ("openai_chat", "@ai-sdk/openai-compatible", CTX.base_url),
        ("openai_responses", "@ai-sdk/openai", CTX.base_url),
        ("anthropic", "@ai-sdk/anthropic", CTX.base_url + "/v1"),
        ("gemini", "@ai-sdk/google", CTX.base_url + "/v1beta"),
    ],
)
def test_opencode_speaks_each_dialect(dialect: str, package: str, base: str) -> None:
    adapter = adapter_for(KnownHarnessSpec(name="opencode", dialect=dialect))  # type: ignore[arg-type]
    assert adapter.dialect == dialect
    inv = adapter.invocation(CTX)
    config = json.loads(inv.files[inv.env["OPENCODE_CONFIG"]])
    provider = config["provider"]["harnessrl"]
    assert provider["npm"] == package and provider["options"] == {"baseURL": base, "apiKey": "sess-123"}
    assert config["model"] == "harnessrl/policy" and config["agent"]["build"]["steps"] == 7
    assert inv.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1" and inv.env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert inv.argv[:4] == ["opencode", "run", "--format", "json"]


def test_gemini_and_qwen() -> None:
    gem = KNOWN["gemini-cli"]().invocation(CTX)
    assert gem.argv == ["gemini", "-p", CTX.instruction, "-m", "policy", "--output-format", "json", "--yolo"]
    assert gem.env["GOOGLE_GEMINI_BASE_URL"] == CTX.base_url and gem.env["GEMINI_API_KEY"] == "sess-123"
    settings = json.loads(gem.files["/sb/home/.gemini/settings.json"])
    assert settings["model"]["maxSessionTurns"] == 7 and settings["telemetry"]["enabled"] is False
    qwen = KNOWN["qwen-code"]().invocation(CTX)
    assert qwen.argv[:3] == ["qwen", "-p", CTX.instruction] and "--yolo" in qwen.argv
    assert qwen.env["OPENAI_BASE_URL"] == CTX.base_url and qwen.env["OPENAI_API_KEY"] == "sess-123"
    assert json.loads(qwen.files["/sb/home/.qwen/settings.json"])["security"]["auth"]["selectedType"] == "openai"


def test_mini_swe_agent() -> None:
    adapter = KNOWN["mini-swe-agent"]()
    inv = adapter.invocation(CTX)
    assert inv.argv[:3] == ["mini", "-m", "openai/policy"] and "-y" in inv.argv and "--exit-immediately" in inv.argv
    config_path = inv.argv[inv.argv.index(next(a for a in inv.argv if a.endswith("harnessrl.yaml")))]
    config = yaml.safe_load(inv.files[config_path])
    assert config["agent"]["step_limit"] == 7 and config["model"]["model_kwargs"]["api_base"] == CTX.base_url
    assert inv.env["MSWEA_CONFIGURED"] == "true" and inv.env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert inv.collect == ["/sb/home/mini.traj.json"]

    def outcome(status: str) -> HarnessStatus:
        traj = json.dumps({"info": {"exit_status": status}})
        return adapter.result(RunOutput(exit_code=0, collected={inv.collect[0]: traj})).status

    # Exit code 0 either way: only the trajectory tells.
    assert outcome("Submitted") == HarnessStatus.finished
    assert outcome("LimitsExceeded") == HarnessStatus.step_budget
    assert outcome("FormatError") == HarnessStatus.harness_error
    assert adapter.result(RunOutput(exit_code=0, collected={inv.collect[0]: None})).status == HarnessStatus.harness_error


def test_result_parsing_of_json_outputs() -> None:
    claude, qwen, gemini = KNOWN["claude-code"](), KNOWN["qwen-code"](), KNOWN["gemini-cli"]()
    ok = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done"})
    turns = json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True})
    assert claude.result(RunOutput(exit_code=0, stdout="log line\n" + ok)).status == HarnessStatus.finished
    assert claude.result(RunOutput(exit_code=1, stdout=turns)).status == HarnessStatus.step_budget
    assert claude.result(RunOutput(exit_code=1, stdout="", stderr="boom")).detail == "boom"
    api_error = json.dumps([{"type": "system"}, {"type": "result", "subtype": "success", "is_error": False,
                                                   "result": "[API Error: 500]"}])
    assert qwen.result(RunOutput(exit_code=0, stdout=api_error)).status == HarnessStatus.harness_error
    assert qwen.result(RunOutput(exit_code=0, stdout=f"[{ok}]")).status == HarnessStatus.finished
    assert gemini.result(RunOutput(exit_code=0, stdout='{"response": "ok", "stats": {}}')).status == HarnessStatus.finished
    assert gemini.result(RunOutput(exit_code=53, stdout="")).status == HarnessStatus.step_budget
    assert gemini.result(RunOutput(exit_code=1, stdout='{"error": {"message": "bad"}}')).status == HarnessStatus.harness_error
    codex = KNOWN["codex"]()
    retry = '{"type":"error","message":"Reconnecting..."}\n{"type":"turn.completed"}'
    assert codex.result(RunOutput(exit_code=0, stdout=retry)).status == HarnessStatus.finished
    failed = '{"type":"turn.failed","error":{"message":"x"}}'
    assert codex.result(RunOutput(exit_code=1, stdout=failed)).status == HarnessStatus.harness_error


def test_custom_harness_needs_no_code() -> None:
    spec = CustomHarnessSpec(
        name="my-agent",
        command="my-agent --model {model} --url {base_url} --key {api_key} --steps {step_budget} {instruction}",
        dialect="openai_chat",
        env={"MY_AGENT_QUIET": "1"},
    )
    adapter = adapter_for(spec)
    assert isinstance(adapter, Custom) and adapter.dialect == "openai_chat"
    inv = adapter.invocation(CTX)
    assert inv.argv[:2] == ["sh", "-c"]
    assert inv.argv[2] == (
        "my-agent --model policy --url http://127.0.0.1:8080/s/abc/v1 --key sess-123 --steps 7 "
        "'Sum the `amount` column; write it to answer.txt. Don'\"'\"'t '\"'\"'quote'\"'\"' me.'"
    )
    assert inv.env["MY_AGENT_QUIET"] == "1"


def test_bad_specs_are_refused_in_the_pools_terms() -> None:
    with pytest.raises(ValueError, match="instruction"):
        CustomHarnessSpec(name="x", command="agent --model {model}", dialect="openai_chat")
    # A bad template is refused when the config is loaded, not at every rollout.
    with pytest.raises(ValueError, match=r"placeholders are .*literal braces"):
        CustomHarnessSpec(name="x", command="agent {instruction} {nope}", dialect="gemini")
    with pytest.raises(ValueError, match="not a valid template"):
        CustomHarnessSpec(name="x", command='python3 -c \'print({"a": 1})\' {instruction}', dialect="gemini")
    with pytest.raises(ValueError, match="pinned"):
        adapter_for(KnownHarnessSpec(name="codex", version="0.1.0"))
    with pytest.raises(ValueError, match="speaks"):
        adapter_for(KnownHarnessSpec(name="claude-code", dialect="gemini"))
