"""The notebook side: the only package that imports IPython and ipywidgets, and only
when a submodule is imported (by ``%load_ext gpulayer``, a display, a progress bar).

* :mod:`~gpulayer.notebook.magics`: ``%%gpulayer`` (a cell in a remote kernel, or a
  gang) and loading the extension
* :mod:`~gpulayer.notebook.commands`: the ``%gpulayer`` line commands, the notebook's connection
* :mod:`~gpulayer.notebook.render`: relayed messages shown as the remote kernel showed
  them; the rich reprs of ``Job`` and ``Connection``
* :mod:`~gpulayer.notebook.widgets`: ``JobMonitor``, ``WorkersTable``, ``JobsProgress``
* :mod:`~gpulayer.notebook.charts`: training-metric charts as inline SVG
* :mod:`~gpulayer.notebook.progress`: the one progress display (tqdm.auto): ``.map``,
  start-up steps, transfer callbacks
"""
