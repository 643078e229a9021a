"""The training harness of attn-zoo: everything that trains, tracks and records runs, apart from the attention library.

Three rooms with one-way doors: :mod:`attn_zoo` (the library: spec, variants, masks, functional, backends, decode,
cost model, model) imports neither Lightning, Hydra nor W&B; :mod:`harness` (this package) imports the library and
the training stack; ``train.py`` (the Hydra entry point) and :mod:`eval` import both.

* :mod:`harness.lit`: the LightningModule (:class:`~harness.lit.LitLM`), optimizer and schedule.
* :mod:`harness.callbacks`: Lightning and Hydra callbacks (resume state, stop-at, progress, multirun summary, recall).
* :mod:`harness.data`: the MQAR and text data modules.
* :mod:`harness.runs`: run directories, resume, finished/failed markers, stored configs, resolvers.
* :mod:`harness.tracking`: the W&B mode rule and run ids.
* :mod:`harness.errors`: the config errors Hydra prints as their message alone (shared with the ``eval`` apps).
"""
