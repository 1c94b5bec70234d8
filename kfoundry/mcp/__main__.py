"""``python -m kfoundry.mcp [OPTIONS]``: the same as ``kf-run mcp [OPTIONS]``."""

import sys

from kfoundry.core.cli import main

main(["mcp", *sys.argv[1:]])
