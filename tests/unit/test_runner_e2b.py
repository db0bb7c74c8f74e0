"""The e2b sandbox's requests, built without a network: E2B is a hosted service this machine cannot reach, so
only the request construction is tested here (the SDK calls themselves are not exercised)."""

from __future__ import annotations

import base64
import io
import subprocess
import tarfile
from pathlib import Path

from harnessrl.runtime.contracts.runner_config import E2BSandboxConfig
from harnessrl.runtime.harness.sandboxes import remote
from harnessrl.runtime.harness.sandboxes.e2b import create_kwargs, public_url

CONFIG = E2BSandboxConfig(
    template="harnessrl-agents", api_key_file=Path("/secrets/e2b"), proxy_public_url="https://proxy.example.org/rl"
)


def test_create_request_names_template_metadata_and_egress() -> None:
    kwargs = create_kwargs(CONFIG, "e2b_key", "pool-a", "runner-0", "rollout-7")
    assert kwargs["template"] == "harnessrl-agents" and kwargs["api_key"] == "e2b_key"
    assert kwargs["timeout"] == CONFIG.sandbox_timeout_s
    assert kwargs["metadata"] == {"managed-by": "harnessrl", "harnessrl-pool": "pool-a",
                                  "harnessrl-runner": "runner-0", "harnessrl-rollout": "rollout-7"}
    assert kwargs["network"] == {"allow_out": ["proxy.example.org"], "deny_out": ["0.0.0.0/0"]}
    assert "domain" not in kwargs


def test_session_url_is_moved_to_the_public_origin() -> None:
    assert public_url("http://proxy-0.proxy.ns.svc:8080/v1", "https://proxy.example.org/rl") == "https://proxy.example.org/rl/v1"
    assert public_url("http://10.0.0.1:8080", "https://p.example.org") == "https://p.example.org"


def test_remote_shell_lines_round_trip_through_a_real_shell(tmp_path: Path) -> None:
    """The lines the remote sandboxes send, run here by sh: quoting, file writes and reads, tarballs."""
    target = tmp_path / "a dir" / "it's.txt"
    content = "line 1\n$HOME `x` 'q' \"dq\"\n"
    subprocess.run(["sh", "-c", remote.write_file_line(str(target), content)], check=True)
    assert target.read_text() == content and target.stat().st_mode & 0o777 == 0o600
    out = subprocess.run(["sh", "-c", remote.read_file_line(str(target))], capture_output=True, text=True, check=True)
    assert base64.b64decode(out.stdout).decode() == content
    assert subprocess.run(["sh", "-c", remote.read_file_line(str(tmp_path / "none"))], check=False).returncode == 3
    line = remote.shell_line(["sh", "-c", 'printf "%s|%s" "$A" "$1"', "x", "a b"], {"A": "v w"}, str(tmp_path), 5)
    assert line.startswith("cd ") and "timeout --signal=KILL 5" in line
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout == "v w|a b"
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.csv").write_text("a,b\n")
    (src / ".keep").write_text("")
    b64 = remote.tar_b64(src)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(b64))) as tar:
        names = tar.getnames()
    assert sorted(names) == ["sub", "sub/data.csv"]
    subprocess.run(["sh", "-c", remote.untar_line(b64, str(tmp_path / "dest"))], check=True)
    assert (tmp_path / "dest" / "sub" / "data.csv").read_text() == "a,b\n"
