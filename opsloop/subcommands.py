"""Commands whose sub-commands live in modules of their own (`opsloop stream worker`, `opsloop detect replay`).

Each sub-command is ``module:function`` (its ``main(argv)``) and the module has ``build_parser()``. The
command's own parser includes every sub-command's parser, so its help lists them and a walk over the
argparse tree (``tests/core/test_cli_help.py``) reaches each one; running a sub-command calls its ``main`` directly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

# name -> ("module:main", one-line help)
Subcommands = dict[str, tuple[str, str]]


def _load(target: str, attr: str | None = None) -> Callable[..., object]:
    module, func = target.split(":")
    return getattr(importlib.import_module(module), attr or func)  # type: ignore[no-any-return]


def build_dispatcher(prog: str, description: str, epilog: str, subcommands: Subcommands) -> argparse.ArgumentParser:
    """``prog``'s parser, each sub-command's parser attached under its name (help, arguments, epilog)."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(subcommands) + "}")
    for name, (target, help_) in subcommands.items():
        child = _load(target, "build_parser")()
        assert isinstance(child, argparse.ArgumentParser)
        # add_help=False: the child's own -h/--help comes with its arguments (parents=)
        sub.add_parser(name, help=help_, parents=[child], add_help=False, description=child.description,
                       epilog=child.epilog, formatter_class=child.formatter_class)
    return p


def dispatch(prog: str, parser: Callable[[], argparse.ArgumentParser], subcommands: Subcommands,
             argv: list[str] | None) -> int:
    """Run ``argv[0]``'s main with the rest; help for no argument or -h; exit 2 naming the choices."""
    argv = list(argv or [])
    if not argv or argv[0] in ("-h", "--help"):
        parser().print_help()
        return 0
    if argv[0] not in subcommands:
        print(f"{prog}: unknown subcommand {argv[0]!r} (one of: {', '.join(subcommands)}; "
              f"`{prog} --help` for details)", file=sys.stderr)
        return 2
    return int(_load(subcommands[argv[0]][0])(argv[1:]) or 0)  # type: ignore[call-overload]
