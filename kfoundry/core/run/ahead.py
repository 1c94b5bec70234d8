"""The steady-state mode: the next generation is planned while this one is judged.

With ``search.options.steady_state = true`` the loop asks the strategy and the generator for
generation ``g + 1`` in a background thread as soon as generation ``g``'s jobs are handed to the
executor, so language-model calls overlap compiles and benchmarks instead of waiting for them. The
asks of ``g + 1`` see the archive as it stood before ``g``'s results (one generation stale), which is why
only strategies that allow it (``SearchStrategy.plans_ahead``) accept the option. The planned
proposals are stored like any others, so a kill re-serves them on resume instead of asking again.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from kfoundry.core.config import RunConfig
from kfoundry.core.db.loop import Row
from kfoundry.core.run.planning import Planner
from kfoundry.core.search import SearchStrategy


def steady_state(strategy: SearchStrategy) -> bool:
    """Whether the run's strategy was configured for the steady-state mode."""
    return bool(getattr(strategy.options, "steady_state", False)) and strategy.plans_ahead


class PlanAhead:
    """Plans one generation ahead in a thread of its own (a no-op when the mode is off)."""

    def __init__(self, planner: Planner, config: RunConfig, enabled: bool) -> None:
        self.planner, self.config, self.enabled = planner, config, enabled
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[list[Row]] | None = None
        #: Generations this run planned ahead (for the log and the tests).
        self.planned: list[int] = []

    def start(self, generation: int, stored: list[Row], evaluations_left: int | None, pending: int) -> None:
        """Plan ``generation`` now, unless it is already stored, past the budget or the mode is off."""
        if not self.enabled or stored or generation >= self.config.budget.generations:
            return
        if evaluations_left is not None and evaluations_left <= pending:
            return  # this generation spends the evaluation budget: nothing would judge the next one
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kf-plan-ahead")
        self._future = self._pool.submit(self.planner.plan, generation)
        self.planned.append(generation)

    def join(self) -> BaseException | None:
        """Wait for the planning in flight; the error it raised, if any (its rows are stored)."""
        future, self._future = self._future, None
        if future is None:
            return None
        try:
            future.result()
        except BaseException as exc:  # re-raised by the loop once this generation's results are told
            return exc
        return None

    def close(self) -> None:
        """Let the thread go; a planning still in flight (the run stopped by an error) is not waited for."""
        self._future = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
