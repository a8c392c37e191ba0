"""The command line as a tool: help for every command, defaults shown, a version, light
imports (`--help` loads neither torch, numba nor aiohttp)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from weight_teleport import __version__
from weight_teleport.cli import build_parser

COMMANDS = ["demo", "bench", "publish", "pull", "status", "serve", "inspect", "verify"]


def test_every_command_is_registered_once() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_defaults(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: weight-teleport {command}" in text
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, "==SUPPRESS=="):
            assert "default" in formatter._get_help_string(action), action.dest


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"weight-teleport {__version__}"


def test_help_imports_nothing_heavy() -> None:
    """What makes `--help` slow is what it imports: none of these may load."""
    heavy = ("torch", "numba", "aiohttp", "numpy", "prometheus_client")
    code = (
        "import sys; from weight_teleport.cli import main\n"
        "for c in [[], *[[c] for c in %r]]:\n"
        "    try: main([*c, '--help'])\n"
        "    except SystemExit: pass\n"
        "print(sorted(m for m in %r if m in sys.modules))" % (COMMANDS, heavy)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_serve_without_aiohttp_says_what_to_install(tmp_path) -> None:
    """A missing optional package is an error message with the install line, not a traceback."""
    code = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "from weight_teleport.cli import main\n"
        f"sys.exit(main(['serve', '--root', {str(tmp_path / 'root')!r}, '--port', '0']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "weight-teleport serve: the origin server needs 'aiohttp': pip install \"weight-teleport[http]\""
    )


def _checkpoint(directory, torch):
    from safetensors.torch import save_file

    directory.mkdir()
    save_file({"w": torch.ones(64, 64, dtype=torch.bfloat16)}, str(directory / "model.safetensors"))
    return directory / "model.safetensors"


def test_a_truncated_checkpoint_is_named_without_a_traceback_or_an_empty_bar(tmp_path, capsys) -> None:
    import torch

    from weight_teleport.cli import main

    path = _checkpoint(tmp_path / "ckpt", torch)
    path.write_bytes(path.read_bytes()[:200])
    assert main(["publish", str(tmp_path / "ckpt"), "--to", f"file://{tmp_path}/store"]) == 1
    err = capsys.readouterr().err
    assert f"{path} is not a readable safetensors file" in err
    assert "upload:" not in err  # no progress bar of nothing before the error


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_a_damaged_pack_is_named(tmp_path, capsys, command) -> None:
    import torch

    import weight_teleport as wt
    from weight_teleport.cli import main

    pack = tmp_path / "v0.pack"
    pack.write_bytes(bytes(wt.encode_snapshot({"w": torch.ones(64, 64)}, version=0))[:-9])
    assert main([command, str(pack)]) == 1
    assert f"weight-teleport {command}: {pack}: " in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path) -> None:
    """`status --json | head`: no "Broken pipe" message, the status SIGPIPE would give."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "weight_teleport.cli", "status", f"file://{tmp_path}", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the command writes: it starts an interpreter first
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == "", err
