"""The batch layer: explaining and scoring folders of images, as library code that the command
line, the Ray engine and :func:`explain.ray_data.explain_dataset` call.

- :mod:`~explain.batch.options`: what a job is asked to do (typed dataclasses, free of torch;
  lists of names as :class:`~explain.batch.options.NameList`);
- :mod:`~explain.batch.job`: the job interface (:class:`~explain.batch.job.DatasetJob`) and
  what every job is given (:func:`~explain.batch.job.run_job`);
- :mod:`~explain.batch.inputs`, :mod:`~explain.batch.storage`: finding the images, the output folder;
- :mod:`~explain.batch.decoding`: decoding beside the model, the preprocessing split;
- :mod:`~explain.batch.explainers`, :mod:`~explain.batch.preparation`: the options checked against the model;
- :mod:`~explain.batch.loop`: the one loader loop (progress, Ctrl-C, out-of-memory halving);
- :mod:`~explain.batch.explaining`, :mod:`~explain.batch.task_outputs`, :mod:`~explain.batch.method_results`,
  :mod:`~explain.batch.outputs`, :mod:`~explain.batch.scoring`: a group of images explained into
  manifest records and files to write, per task by a strategy that returns what it made;
- :mod:`~explain.batch.writing`: drawing and saving one image's outputs;
- :mod:`~explain.batch.manifest`, :mod:`~explain.batch.planning`: the manifest's records
  (:class:`~explain.batch.manifest.RecordMaker`), planning and resume;
- :mod:`~explain.batch.local_run`, :mod:`~explain.batch.ray_driver`, :mod:`~explain.batch.ray_stages`:
  ``explain run`` here and on Ray Data; :mod:`~explain.batch.evaluating`: ``explain evaluate``;
- :mod:`~explain.batch.guards`, :mod:`~explain.batch.outcome`: one job per folder, Pillow's limit,
  Ctrl-C; exit statuses.

Importing this package imports none of its modules (nor torch).
"""
