"""ProxyConfig validation and the `harnessrl proxy` command's refusal of a bad config."""

from __future__ import annotations

from pathlib import Path

import pytest
from harnessrl.runtime.contracts.proxy_config import ProxyConfig, load_config
from harnessrl.runtime.proxy.main import main
from pydantic import ValidationError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    return path


def test_load_config_and_base_url(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("  s3cret\n")
    config = load_config(_write(tmp_path, f"""
port: 9000
upstream_urls: [http://e0:8000, http://e1:8000]
served_model: tiny
admin_token_file: {tmp_path / 'token'}
journal_dir: {tmp_path / 'journal'}
upstream: {{max_connections: 64}}
"""))
    assert config.base_url() == "http://127.0.0.1:9000"
    assert config.read_admin_token() == "s3cret" and config.read_runner_token() is None
    (tmp_path / "runner-token").write_text("runner\n")
    assert config.model_copy(update={"runner_token_file": tmp_path / "runner-token"}).read_runner_token() == "runner"
    assert config.upstream.max_connections == 64 and config.upstream.keepalive_expiry_s < 5
    public = config.model_copy(update={"public_base_url": "http://proxy-1.proxy.ns.svc:8080/"})
    assert public.base_url() == "http://proxy-1.proxy.ns.svc:8080"


@pytest.mark.parametrize(
    "bad",
    [
        {"upstream_urls": []},
        {"upstream_urls": ["http://e0", "http://e0"]},
        {"upstream_urls": ["not a url"]},
        {"replica_id": "has space"},
        {"surprise": 1},
        {"workers": 0},
        {"workers": 2, "port": 0},  # the workers' own ports follow the replica's
        {"workers": 2, "port": 65534},
    ],
)
def test_bad_configs_are_refused(tmp_path: Path, bad: dict[str, object]) -> None:
    data = {"upstream_urls": ["http://e0"], "served_model": "m", "admin_token_file": "t", "journal_dir": "j", **bad}
    with pytest.raises(ValidationError):
        ProxyConfig.model_validate(data)


def test_proxy_command_refuses_a_bad_config(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "token").write_text("")  # empty token file
    path = _write(tmp_path, f"""
upstream_urls: [http://e0:8000]
served_model: tiny
admin_token_file: {tmp_path / 'token'}
journal_dir: {tmp_path / 'journal'}
""")
    assert main(["--config", str(path)]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
