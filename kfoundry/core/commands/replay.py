"""``kf-run replay RUN_DIR``: run a recorded optimisation again with every language model replayed.

By default the recorded run's evaluations seed the new run's cache, so every verdict and time is
the recorded one and the replay is exact (and fast); ``--remeasure`` evaluates everything again on
this machine, where choices that depend on measured times may then differ.
"""

from __future__ import annotations

from pathlib import Path

import click

from kfoundry.core.config import load_config
from kfoundry.core.store import Store


def seed_evaluation_cache(recorded: Path, new: Path) -> int:
    """Copy the recorded store's evaluations and reference timings into a new store; rows copied."""
    with Store(recorded) as old, Store(new) as fresh:
        return fresh.copy_evaluations_from(old)


@click.command(
    "replay",
    epilog="\b\nExamples:\n  kf-run replay kf-runs/softmax-20261130-104500\n"
    "  kf-run replay kf-runs/softmax-20261130-104500 --remeasure --on-miss sequence",
)
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True))
@click.option(
    "--on-miss",
    type=click.Choice(["error", "sequence"]),
    default="error",
    show_default=True,
    help="A call the recording lacks: fail, or take the member's next recorded reply.",
)
@click.option(
    "--remeasure", is_flag=True, help="Evaluate every kernel again instead of reusing the recorded verdicts."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def command(run_dir: str, on_miss: str, remeasure: bool, as_json: bool) -> None:
    """Re-run RUN_DIR's problem and config in a new run folder, serving every LLM reply from its recording.

    No API is called and no key is needed; tokens and cost come from the recording, so the
    budget caps stop the replay at the same call.
    """
    from kfoundry.api import run_folder
    from kfoundry.core.commands.optimize import cli_observer, finish
    from kfoundry.core.ensemble import replay_config
    from kfoundry.core.run.folder import (
        STORE_FILE,
        new_run_dir,
        read_run_file,
        run_shape_sets,
        write_run_file,
    )

    folder = Path(run_dir)
    info = read_run_file(folder)
    config = replay_config(load_config(data=info["config"]), folder, on_miss=on_miss)
    problem = Path(info["problem"])
    seed = Path(info["seed_kernel"]) if info.get("seed_kernel") else None
    shape_sets = run_shape_sets(info)
    run_id, new_dir = new_run_dir(config, problem.stem)
    write_run_file(new_dir, run_id, problem, shape_sets[0], config, seed, shape_sets=shape_sets)
    if not remeasure and (folder / STORE_FILE).is_file():
        n = seed_evaluation_cache(folder / STORE_FILE, new_dir / STORE_FILE)
        click.echo(f"replaying {folder} into {new_dir} ({n} recorded evaluations reused)", err=as_json)
    else:
        click.echo(f"replaying {folder} into {new_dir} (evaluating again)", err=as_json)
    observer = cli_observer(config)
    try:
        result = run_folder(config, problem, shape_sets, run_id, new_dir, seed, observer)
    finally:
        if observer is not None:
            observer.stop()
    finish(result, as_json)
