"""The CLI's local pieces: where remote mode finds its service (flags, environment, a config
file only its owner may read), shell completion scripts, and human times in words."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from promptsched import cli
from promptsched.cli import common, completion, remote, render

URL, TOKEN = "https://sched.example", "pst_" + "a" * 43


def _write(tmp_path: Path, text: str, mode: int) -> dict[str, str]:
    path = tmp_path / "promptsched" / "cli.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return {"XDG_CONFIG_HOME": str(tmp_path)}


def test_no_url_and_no_token_is_direct_mode(tmp_path: Path) -> None:
    assert remote.target(None, None, {"XDG_CONFIG_HOME": str(tmp_path)}) is None


def test_flags_win_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    env = _write(tmp_path, f'url = "https://file.example"\ntoken = "{TOKEN}"\n', 0o600)
    assert remote.target(None, None, env) == remote.Target("https://file.example", TOKEN)
    env |= {remote.URL_ENV: URL + "/", remote.TOKEN_ENV: "pst_env"}
    assert remote.target(None, None, env) == remote.Target(URL, "pst_env")
    assert remote.target("http://flag.example", "pst_flag", env) == remote.Target(
        "http://flag.example", "pst_flag"
    )


def test_a_config_file_others_can_read_is_refused_saying_why(tmp_path: Path) -> None:
    env = _write(tmp_path, f'url = "{URL}"\ntoken = "{TOKEN}"\n', 0o644)
    with pytest.raises(common.CliError) as caught:
        remote.target(None, None, env)
    message = str(caught.value)
    assert "readable by others (mode 644)" in message and "chmod 600" in message
    assert TOKEN not in message


def test_a_half_configured_remote_mode_names_what_is_missing(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    with pytest.raises(common.CliError, match="PROMPTSCHED_URL"):
        remote.target(None, TOKEN, env)
    with pytest.raises(common.CliError, match="PROMPTSCHED_TOKEN"):
        remote.target(URL, None, env)
    with pytest.raises(common.CliError, match="http:// or https://"):
        remote.target("sched.example", TOKEN, env)
    bad = _write(tmp_path, 'url = "x"\npassword = "y"\n', 0o600)
    with pytest.raises(common.CliError, match="unknown key 'password'"):
        remote.target(None, None, bad)


def _script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "promptsched", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PROMPTSCHED_")},
    )
    return done.stdout


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers for the last of ``words`` after sourcing the script."""
    quoted = " ".join(f"'{w}'" for w in words)
    probe = f"""{script}
COMP_WORDS=(promptsched {quoted}); COMP_CWORD={len(words)}; _promptsched
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.split()


def test_the_bash_completion_is_valid_and_lists_every_subcommand_and_flag(tmp_path: Path) -> None:
    script = _script("bash")
    path = tmp_path / "promptsched.bash"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    parser = cli.build_parser()
    top = next(children for p, children, _ in completion.walk(parser) if p == "promptsched")
    assert _complete(script, "") == top
    assert {"run", "schedules", "runs", "preview", "completion"} <= set(top)
    assert _complete(script, "sch") == ["schedules"]
    assert "edit" in _complete(script, "schedules", "")
    assert {"explain", "history"} <= set(_complete(script, "schedules", ""))
    assert "watch" in _complete(script, "runs", "")
    flags = _complete(script, "schedules", "edit", "7", "--ver")
    assert flags == ["--version"]
    assert "--url" in _complete(script, "runs", "list", "--")


def test_the_zsh_completion_is_valid_and_lists_the_subcommands(tmp_path: Path) -> None:
    script = _script("zsh")
    assert script.startswith("#compdef promptsched\n")
    assert "'promptsched schedules' 'add edit " in script and "explain" in script
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed: only the bash script's syntax can be checked here")
    path = tmp_path / "_promptsched"
    path.write_text(script)
    syntax = subprocess.run([zsh, "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    # compdef and compadd come from compinit: stand-ins record what would be offered.
    probe = f"""compdef() {{ : }}
compadd() {{ shift; print -l -- "$@" }}
source {path}
words=(promptsched runs ""); CURRENT=3; _promptsched
"""
    done = subprocess.run([zsh, "-f", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["list", "show", "replay", "cancel", "watch"]


def test_notify_targets_are_words_not_python_reprs() -> None:
    notify = {"on_success": False, "on_failure": True, "email": ["a@x.example"],
              "webhook": {"url": "https://h.example/x", "secret_set": True}}  # fmt: skip
    words = render.notify_words(notify)
    assert words == ("email a@x.example; webhook https://h.example/x (signed) on failure"), words
    assert "{" not in words and "secret_set" not in words
