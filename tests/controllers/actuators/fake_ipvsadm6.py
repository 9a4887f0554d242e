"""``fake_ipvsadm.py`` with ipvsadm's ``-6``: ``fake_ipvsadm6.py --state FILE ARGS...``.

ipvsadm.c ``parse_options``: ``-6`` after ``-f MARK`` makes the firewall-mark service the IPv6 one (before ``-f``
it fails "-6 used before -f"); ``print_service_entry`` lists it as ``FWM  MARK IPv6``. The kernel keys a mark
service by (family, mark), so ``-f 1`` and ``-f 1 -6`` are two services. In the fake's state an IPv6 mark service
has ``"addr": "MARK IPv6"`` (printed as ipvsadm prints it); an edit with ``-6`` names that one, without it the
IPv4 one ("No such service" when it does not exist, as the kernel answers).
"""

from __future__ import annotations

import sys

import fake_ipvsadm as base

_edit = base.edit


def edit(state: dict, tokens: list[str], old: bool = False) -> str | None:
    if "-6" in tokens:
        six = tokens.index("-6")
        mark = tokens.index("-f") if "-f" in tokens else -1
        if not 0 <= mark < six:
            return "-6 used before -f"
        tokens = tokens[:six] + tokens[six + 1:]
        tokens[mark + 1] = f"{tokens[mark + 1]} IPv6"
    return _edit(state, tokens, old)


if __name__ == "__main__":
    base.edit = edit   # base.main looks edit up in its module
    sys.exit(base.main(sys.argv[1:]))
