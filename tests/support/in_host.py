"""Run a command on one of tests/support/netns.py's hosts: ``python -m tests.support.in_host NETNS
HOSTNAME -- command ...`` enters the host's network namespace (and a UTS namespace named HOSTNAME),
then executes the command in this process (a kill of it is a kill of the command).

With ``DYNASEM_TEST_OWN_PIDS=1`` the command also gets a pid namespace of its own (util-linux
``unshare --pid --fork --kill-child``): processes of other hosts no longer see it as on their
host (dynasem's dead-holder check compares boot id and pid namespace), and a SIGKILL of this
process kills everything in that namespace, as a host that dies."""

from __future__ import annotations

import os
import sys


def main() -> None:
    netns_name, hostname, dashes, *command = sys.argv[1:]
    if dashes != "--" or not command:
        raise SystemExit("usage: python -m tests.support.in_host NETNS HOSTNAME -- command ...")
    from tests.support import netns

    netns.enter(netns_name, hostname)
    if os.environ.get("DYNASEM_TEST_OWN_PIDS") == "1":
        command = ["unshare", "--pid", "--fork", "--kill-child", "--", *command]
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
