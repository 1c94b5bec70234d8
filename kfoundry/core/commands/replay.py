"""``kf-run replay RUN_DIR``: run a recorded optimisation again with every language model replayed."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from kfoundry.core.config import load_config


@click.command(
    "replay",
    epilog="\b\nExamples:\n  kf-run replay kf-runs/softmax-20261130-104500\n"
    "  kf-run replay kf-runs/softmax-20261130-104500 --on-miss sequence",
)
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option(
    "--on-miss",
    type=click.Choice(["error", "sequence"]),
    default="error",
    show_default=True,
    help="A call the recording lacks: fail, or take the member's next recorded reply.",
)
def command(run_dir: str, on_miss: str) -> None:
    """Re-run RUN_DIR's problem and config in a new run folder, serving every LLM reply from its recording.

    No API is called and no key is needed; tokens and cost come from the recording, so the
    budget caps stop the replay at the same call.
    """
    from kfoundry.core.commands.optimize import run_loop
    from kfoundry.core.ensemble import replay_config
    from kfoundry.core.loop import new_run_dir, read_run_file, write_run_file

    folder = Path(run_dir)
    info = read_run_file(folder)
    config = replay_config(load_config(data=info["config"]), folder, on_miss=on_miss)
    problem = Path(info["problem"])
    seed = Path(info["seed_kernel"]) if info.get("seed_kernel") else None
    shapes = dict(info.get("shapes") or {})
    run_id, new_dir = new_run_dir(config, problem.stem)
    write_run_file(new_dir, run_id, problem, shapes, config, seed)
    Console().print(f"replaying {folder} into {new_dir}")
    run_loop(config, problem, shapes, run_id, new_dir, seed, Console())
