"""What a person running streamgauge sees: the terminal of ``run``, ``status``, ``top``, tables.

Nothing here imports PySpark: ``status``, ``top`` and ``query`` must answer within a second on
a machine whose cores the window job is using. The modules read what the daemon already
exposes (``run.json``, the receivers' ``ingest/<receiver>.json``, the segment log, the
store's ``pipeline_state``) and compute nothing the pipeline does not.
"""
