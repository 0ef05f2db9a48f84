"""-v / -q are counted wherever they stand: before the subcommand (the group's) or after it (every command's)."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from optimizer.cli.commands import main


@pytest.mark.parametrize("args, level", [
    (["-q", "backends", "--json"], logging.ERROR),
    (["backends", "-q", "--json"], logging.ERROR),
    (["-v", "backends", "-q", "-q", "--json"], logging.ERROR),
    (["backends", "-vv", "--json"], logging.DEBUG),
])
def test_verbosity_counts_before_and_after_the_subcommand(args: list[str], level: int):
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert logging.getLogger("optimizer").level == level


def test_every_command_takes_verbose_and_quiet():
    missing = [name for name, cmd in main.commands.items() if not {"-v", "-q"} <= {o for p in cmd.params for o in p.opts}]
    assert not missing, f"these commands refuse -v / -q after their name: {missing}"
