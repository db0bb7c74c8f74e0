"""The local sandbox's bubblewrap command line (pure) and what the provider does where bubblewrap cannot run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
from harnessrl.runtime.contracts.runner_config import LocalSandboxConfig
from harnessrl.runtime.harness.sandboxes.base import SandboxError
from harnessrl.runtime.harness.sandboxes.bwrap import BwrapPlan, bwrap_argv, install_root, tool_roots
from harnessrl.runtime.harness.sandboxes.local import LocalProvider, inside_url
from harnessrl.runtime.harness.tasks import load_dir

TASK = load_dir(Path(__file__).resolve().parents[2] / "examples" / "tasks")["sales-total"]


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_the_sandbox_mounts_only_the_system_its_tools_and_its_own_directory(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    (tools / "secret-inside").mkdir(parents=True)
    (tools / "token").write_text("t")
    plan = BwrapPlan(bwrap="bwrap", rollout_dir=tmp_path / "sb" / "r1", read_only=(tools, tools / "nested"),
                     hide=(tools / "secret-inside", tools / "token", tmp_path / "tasks"))
    argv = bwrap_argv(plan, ["sh", "-c", "true"], str(tmp_path / "sb" / "r1" / "workspace"))
    assert argv[0] == "bwrap" and argv[-3:] == ["sh", "-c", "true"]
    assert {"--unshare-net", "--unshare-pid", "--unshare-user", "--die-with-parent"} <= set(argv)
    ro = pairs(argv, "--ro-bind")
    assert (str(tools), str(tools)) in ro and (str(tools / "nested"), str(tools / "nested")) not in ro
    assert pairs(argv, "--bind") == [(str(tmp_path / "sb" / "r1"),) * 2]  # the only writable host path
    assert ("/dev/null", str(tools / "token")) in ro  # a hidden file under a bound directory is masked
    assert str(tools / "secret-inside") in argv[argv.index("--tmpfs", argv.index("--bind")) + 1:]
    assert str(tmp_path / "tasks") not in argv  # never mounted: nothing to mask
    assert argv[argv.index("--remount-ro") + 1] == "/"
    assert argv[argv.index("--chdir") + 1] == str(tmp_path / "sb" / "r1" / "workspace")


def test_a_root_runner_drops_the_harness_to_an_unprivileged_uid(tmp_path: Path) -> None:
    plan = BwrapPlan(bwrap="bwrap", rollout_dir=tmp_path, read_only=(), drop_to=65534, share_net=True)
    argv = bwrap_argv(plan, ["id"], "/")
    tail = argv[argv.index("--") + 1:]
    assert tail == ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "id"]
    assert "--unshare-user" not in argv and "--unshare-net" not in argv and argv.count("--cap-add") == 2


def test_tool_roots_follow_path_programs_but_never_the_runners_directory(tmp_path: Path) -> None:
    npm = tmp_path / "npm" / "node_modules" / "cli" / "bin.js"
    npm.parent.mkdir(parents=True)
    npm.write_text("")
    bin_dir = tmp_path / "tools" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "cli").symlink_to(npm)
    repo_bin = tmp_path / "repo" / "bin"
    repo_bin.mkdir(parents=True)
    roots = tool_roots(f"{bin_dir}:{repo_bin}:relative:/usr/bin", protected=[tmp_path / "repo"])
    assert tmp_path / "tools" in roots and tmp_path / "npm" in roots and install_root(npm) == tmp_path / "npm"
    assert repo_bin in roots and tmp_path / "repo" not in roots  # narrowed to the PATH entry itself
    assert Path(sys.base_prefix).resolve() in roots or Path(sys.base_prefix).resolve().is_relative_to("/usr")


def test_a_path_entry_in_home_does_not_expose_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ~/bin on PATH the tool roots once widened to the whole home: an .ssh key and a Hub token were read."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    (home / "bin").mkdir()
    (home / "bin" / "tool").write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{home / 'bin'}:/usr/bin")
    roots = LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "sb")).read_only
    assert home / "bin" in roots
    assert not [r for r in roots if home.is_relative_to(r)], roots


def test_the_proxy_url_inside_is_loopback_on_the_same_port() -> None:
    assert inside_url("http://proxy.ns.svc:8080/s/abc/v1") == ("http://127.0.0.1:8080/s/abc/v1", ("proxy.ns.svc", 8080))
    with pytest.raises(SandboxError):
        inside_url("file:///x")


async def test_without_bubblewrap_the_runner_refuses_unless_unisolated_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    refused = LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "a"))
    with pytest.raises(SandboxError, match=r"bubblewrap\) is not installed.*allowUnisolated: true"):
        await refused.start()
    allowed = LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "b", allow_unisolated=True))
    await allowed.start()
    assert not allowed.isolated and not allowed.isolates_network
    sb = await allowed.open("r", TASK)
    assert sb.proxy_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"
    res = await sb.run([sys.executable, "-c", "import os; print(os.getcwd())"], {}, 30)
    assert res.stdout.strip() == sb.workspace
    await sb.close()


async def test_in_a_pod_the_refusal_names_the_masked_proc_not_a_missing_bubblewrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What bubblewrap 0.8 answers in a container (make cluster-check's runner Pod): /proc has masked paths there,
    # so the kernel refuses the fresh proc mount its sandbox needs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").write_text("#!/bin/sh\necho \"bwrap: Can't mount proc on /newroot/proc: Operation not "
                                   "permitted\" >&2\nexit 1\n")
    (bin_dir / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(SandboxError) as refused:
        await LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "a")).start()
    message = str(refused.value)
    assert "cannot mount a fresh /proc" in message and "procMount: Unmasked" in message
    assert "Install it" not in message and "allowUnisolated: true" in message


async def test_a_process_that_slips_the_kill_and_holds_the_output_does_not_hang_the_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unisolated, a harness can start a process in a session of its own without the sandbox's tag, holding the
    command's stdout. asyncio's Process.wait() returns only once every pipe is closed, so the runner waited on
    it for as long as that process lived (seen in make fresh-check, where a sandbox's bubblewrap init outlived
    the kill while holding the pipes): the command must still end, its output cut at the kill."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    provider = LocalProvider(LocalSandboxConfig(base_dir=tmp_path / "b", allow_unisolated=True))
    await provider.start()
    sb = await provider.open("r", TASK)
    pid_file = tmp_path / "escaped.pid"
    escape = ("import os, subprocess, sys, time\n"
              "env = {k: v for k, v in os.environ.items() if not k.startswith('HARNESSRL')}\n"
              f"p = subprocess.Popen(['/bin/sleep', '60'], env=env, start_new_session=True)\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              "print('started', flush=True)\n")
    try:
        res = await asyncio.wait_for(sb.run([sys.executable, "-c", escape], {}, 30), 20)
        assert res.exit_code == 0 and "started" in res.stdout
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        await sb.close()
