# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in for the get-pip.py bootstrap script that ansible-test downloads.

ansible-test creates its sanity venvs without pip and bootstraps pip with a
get-pip.py fetched from a CI file host that this network cannot reach. This
does the same job with what is here: ensurepip for a first pip, then that pip
installs the requested pip version (and any other requested packages) from
the configured package index. get-pip's own flags (--no-setuptools,
--no-wheel) are honoured by leaving those packages out.
"""
from __future__ import annotations

import subprocess
import sys


def main() -> None:
    args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"],
                          stdout=subprocess.DEVNULL)
    subprocess.check_call([sys.executable, "-m", "pip", "install", *args])


if __name__ == "__main__":
    main()
