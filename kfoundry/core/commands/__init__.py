"""``kf-run`` subcommands, one module each; :mod:`kfoundry.core.cli` lists them."""
