"""``kf-run resume RUN_DIR``: continue a stopped or killed optimisation run where it left off.

Before anything runs, the run's store is checked: a store that went missing or empty is refused
(``--start-over`` begins the search again instead), and every stored row of the run must read back
(one line naming the row otherwise). Another ``kf-run`` writing the same folder is refused by the
store's lock.
"""

from __future__ import annotations

from pathlib import Path

import click

from kfoundry.core.config import load_config
from kfoundry.core.db import loop as loop_db
from kfoundry.core.run.folder import STORE_FILE, read_run_file
from kfoundry.core.run.state import LoopState
from kfoundry.core.store import Store, StoreError


def check_resumable(folder: Path, run_id: str, start_over: bool = False) -> None:
    """Refuse (one line) to resume from a missing, empty or unreadable store.

    With ``start_over``, a missing or empty store is allowed (the search begins again); a store
    with rows that do not read back is refused either way (move it away to start over).
    """
    path = folder / STORE_FILE
    if start_over and (not path.is_file() or path.stat().st_size == 0):
        return
    try:
        store = Store(path, create=False)
    except StoreError as exc:
        raise StoreError(f"{exc}; kf-run resume --start-over {folder} begins the search again") from None
    try:
        if store.get_run(run_id) is None:
            if start_over:
                return
            raise StoreError(
                f"store {path} holds no record of run {run_id!r} (emptied or replaced?); "
                f"kf-run resume --start-over {folder} begins the search again"
            )
        verify_rows(store, run_id)
    finally:
        store.close()


def verify_rows(store: Store, run_id: str) -> None:
    """Every stored row of ``run_id`` reads back as its model (one :class:`StoreError` line otherwise)."""
    try:
        _verify_rows(store, run_id)
    except (IndexError, KeyError) as exc:  # a damaged schema: a table without a column the loop reads
        raise StoreError(f"store {store.path} is damaged: a loop table lacks column {exc}") from None


def _verify_rows(store: Store, run_id: str) -> None:
    store.list_candidates(run_id)
    store.evaluations(run_id=run_id)
    state = loop_db.load_state(store, run_id)
    if state is not None:
        store.decode(LoopState, state, f"loop_state row of run {run_id!r}")
    loop_db.proposals(store, run_id)  # every proposal reads back, or one line naming its row and column


@click.command(
    "resume",
    epilog="\b\nExamples:\n  kf-run resume kf-runs/matmul-20261130-104500\n"
    "  kf-run resume kf-runs/matmul-20261130-104500 --set budget.generations=12",
)
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="Change a budget before continuing (e.g. budget.generations=12).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option(
    "--start-over",
    is_flag=True,
    help="If the run's store went missing or empty, begin the search again instead of refusing.",
)
def command(run_dir: str, overrides: tuple[str, ...], as_json: bool, start_over: bool) -> None:
    """Continue the run in RUN_DIR: stored proposals and finished evaluations are not repeated."""
    from kfoundry.api import resume
    from kfoundry.core.commands.optimize import cli_observer, finish

    folder = Path(run_dir)
    info = read_run_file(folder)
    missing = [k for k in ("run_id", "problem", "config") if not isinstance(info, dict) or k not in info]
    if missing:
        raise StoreError(f"{folder}: the run file lacks {', '.join(missing)}; not a resumable run folder")
    config = load_config(data=info["config"], overrides=list(overrides))
    check_resumable(folder, str(info["run_id"]), start_over)
    observer = cli_observer(config)
    try:
        result = resume(folder, overrides=overrides, observer=observer)
    finally:
        if observer is not None:
            observer.stop()
    finish(result, as_json)
