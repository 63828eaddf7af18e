"""The ``gpulayer`` command line.

::

    gpulayer up                       control plane + a local worker on this machine
    gpulayer status | down            is it up (exit 0) | stop what `up` started
    gpulayer join URL                 run a worker that serves URL
    gpulayer submit [-f] -- CMD ...   submit a command; -f streams its output
    gpulayer jobs | job ID | logs ID [-f] | cancel ID | artifacts ID [--download DIR]
    gpulayer delete ID ...            delete finished jobs with their logs and artifacts
    gpulayer gc [--older-than 30d]    delete old finished jobs and unused blobs now (admin)
    gpulayer workers [forget NAME]
    gpulayer providers | instances | instance terminate ID   capacity on demand (up --providers)
    gpulayer sessions | session end NAME   persistent remote kernels (%%gpulayer --session)
    gpulayer kernel install --name N --gpus G | kernel list | kernel remove N
                                      Jupyter kernels that run on a worker (the launcher)
    gpulayer token create NAME --role ROLE [--expires 30d] | token list | token revoke NAME
    gpulayer demo                     a tour on a throw-away local cluster
    gpulayer completion bash|zsh      the shell code of tab completion

The connection comes from ``--url``/``--token``, else ``GPULAYER_URL`` /
``GPULAYER_TOKEN``, else the file ``gpulayer up`` saved. Listings and details take
``-o json``. Every error is one line ``gpulayer: error: ...`` on stderr: exit 2 for
bad usage, 1 otherwise, 130 on Ctrl-C (``parser.EXIT_CODES``; docs/cli.md).

* :mod:`~gpulayer.cli.parser`: :func:`main` and the parser
* :mod:`~gpulayer.cli.options`: the parser class, connection options, the connection
* :mod:`~gpulayer.cli.output`: the one table printer, ``-o json``, times, sizes, notes, errors
* :mod:`~gpulayer.cli.jobs`, :mod:`~gpulayer.cli.logs`, :mod:`~gpulayer.cli.workers`,
  :mod:`~gpulayer.cli.sessions`, :mod:`~gpulayer.cli.kernels`, :mod:`~gpulayer.cli.tokens`,
  :mod:`~gpulayer.cli.up`,
  :mod:`~gpulayer.cli.status`, :mod:`~gpulayer.cli.providers`: one module per command group
* :mod:`~gpulayer.cli.pidfile`: which ``gpulayer up`` runs for a data dir
* :mod:`~gpulayer.cli.cluster`: :class:`LocalCluster`, what ``up`` and ``demo`` run
* :mod:`~gpulayer.cli.demo`: the ``gpulayer demo`` tour
"""

from gpulayer.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
