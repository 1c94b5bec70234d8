"""The pieces of an optimisation run that :class:`kfoundry.core.loop.OptimizeLoop` puts together.

- :mod:`~kfoundry.core.run.state`: the saved loop state, the summary, the typed stop reasons and what
  the loop needs of an evaluator and an observer.
- :mod:`~kfoundry.core.run.budgets`: generations, evaluations, wall time and stagnation, checked
  before every evaluation.
- :mod:`~kfoundry.core.run.planning`: a generation's proposals (strategy asks, generator answers,
  seeds in generation 0); the run's generator.
- :mod:`~kfoundry.core.run.tuning_stage`: tuning the best elites' template parameters every N
  generations and at the end.
- :mod:`~kfoundry.core.run.shapes`: one evaluator over several shape sets.
- :mod:`~kfoundry.core.run.folder`: run folders (``run.json``, the store's file name, seed kernels).
- :mod:`~kfoundry.core.run.export`: the best kernel written to the run folder.
- :mod:`~kfoundry.core.run.progress`: how each evaluation and the best kernel so far read in the log.
"""
