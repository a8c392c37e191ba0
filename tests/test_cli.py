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
    code = ("import sys; from weight_teleport.cli import main\n"
            "for c in [[], *[[c] for c in %r]]:\n"
            "    try: main([*c, '--help'])\n"
            "    except SystemExit: pass\n"
            "print(sorted(m for m in %r if m in sys.modules))" % (COMMANDS, heavy))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_serve_without_aiohttp_says_what_to_install(tmp_path) -> None:
    """A missing optional package is an error message with the install line, not a traceback."""
    code = ("import sys; sys.modules['aiohttp'] = None\n"
            "from weight_teleport.cli import main\n"
            f"sys.exit(main(['serve', '--root', {str(tmp_path / 'root')!r}, '--port', '0']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip() == ("weight-teleport serve: the origin server needs 'aiohttp': "
                                  'pip install "weight-teleport[http]"')
