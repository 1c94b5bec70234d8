"""Persistence: the one schema of the run store and the repository functions that read and write it.

- :mod:`~kfoundry.core.db.schema`: every table, the schema version and the ordered migrations.
- :mod:`~kfoundry.core.db.lock`: the run folder's single-writer lock and one-line error causes.
- :mod:`~kfoundry.core.db.loop`: the optimize loop's state, proposals, archive cells and tuning results.
- :mod:`~kfoundry.core.db.llm`: language-model calls, ensemble votes and prompt variants.
- :mod:`~kfoundry.core.db.tuning`: tuner trials and the performance records warm starts read.

The connection and the core tables (runs, candidates, evaluations, reference timings) are
:class:`kfoundry.core.store.Store`; no other module writes SQL.
"""
