"""Notebook widgets (stock ipywidgets): a job monitor, a workers table, progress over jobs.

* :class:`JobMonitor` shows a job's state, worker, GPUs, elapsed time, why it
  waits while queued, a live tail of its output, and a cancel button. With
  ``follow=True`` a background thread long-polls the job's logs and state and
  updates it until the job ends; it stays correct afterwards. A training job's
  metrics (``Trainer`` log points, or any program's ``$GPULAYER_METRICS_FILE``
  lines) draw a live chart over steps, one metric at a time, one line per rank
  where asked; a distributed job's log tail can be narrowed to one rank.
* :class:`WorkersTable` shows the workers: devices, GPU utilization, running tasks.
* :class:`JobsProgress` is a progress bar over many jobs.

State lives in traits (``state``, ``worker``, ``gpus``, ``elapsed``,
``pending_reasons``, ``log_tail``, ``ranks``, ``metric_names``, ``workers``,
``done``); the child widgets render it; charts come from
:mod:`gpulayer.notebook.charts`. :mod:`gpulayer.notebook.render` shows them as
the reprs of ``Job`` and ``Connection`` in a notebook.

Imported lazily (by displays and magics), never by ``import gpulayer``.
"""

import collections
import html
import threading
from collections.abc import Sequence
from typing import Any

import ipywidgets as w
from traitlets import Dict, Float, Int, List, Unicode

from gpulayer import contracts, errors
from gpulayer.client import Connection, Job, pending
from gpulayer.client.cells import MessageDecoder, log_text
from gpulayer.notebook.charts import Points, default_metric, svg_chart

_RUNNING_HOLD_SECONDS = 1.0  # while a job runs, the monitor refreshes at least this often
_KEPT_LINES = 2000  # lines kept for the rank filter (the tail shows the last tail_lines)
_KEPT_POINTS = 5000  # points kept per series; older ones are thinned out
_METRIC_KINDS = ("command", "distributed")  # the jobs whose tasks ship metric points
_ALL_RANKS = -1
_STATE_STYLE = {"succeeded": "success", "failed": "danger", "timed_out": "danger",
                "lost": "danger", "cancelled": "warning", "running": "info"}  # fmt: skip


class JobMonitor(w.VBox):
    """A live view of one job; see the module docstring."""

    state = Unicode("")
    worker = Unicode("")
    gpus = List(Int())
    elapsed = Float(0.0)
    pending_reasons = List(Unicode())
    log_tail = List(Unicode())
    ranks = List(Int())  #: the global ranks seen in the log (a distributed job)
    metric_names = List(Unicode())  #: the metrics seen so far, in first-seen order

    def __init__(self, job: Job, *, tail_lines: int = 20, follow: bool = False) -> None:
        self.job = job
        self.tail_lines = tail_lines
        self.header = w.HTML()
        self.reasons = w.HTML()
        self.log_pane = w.HTML()
        self.rank_select = w.Dropdown(options=[("all ranks", _ALL_RANKS)], value=_ALL_RANKS,
                                      description="log of", layout=_hidden())  # fmt: skip
        self.rank_select.observe(lambda _: self._render_tail(), "value")
        self.metric_select = w.Dropdown(options=[], description="metric")
        self.metric_select.observe(lambda _: self._render_chart(), "value")
        self.per_rank = w.Checkbox(value=False, description="per rank", indent=False)
        self.per_rank.observe(lambda _: self._render_chart(), "value")
        self.chart = w.HTML()
        self.chart_box = w.VBox([w.HBox([self.metric_select, self.per_rank]), self.chart],
                                layout=_hidden())  # fmt: skip
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="danger")
        self.cancel_button.on_click(lambda _: self.cancel())
        super().__init__([self.header, self.reasons, self.chart_box, self.rank_select,
                          self.log_pane, self.cancel_button])  # fmt: skip
        self._decoder = MessageDecoder()
        self._offset = 0
        self._lines: collections.deque[tuple[int | None, str]] = collections.deque(
            maxlen=_KEPT_LINES
        )
        # metric -> rank -> [(step, value)]
        self._series: dict[str, dict[int | None, Points]] = {}
        self._metrics_after = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.update(job.info)
        if follow:
            self.start()

    # --------------------------------------------------------------- feeding

    def update(self, info: contracts.Job) -> None:
        """Show the job as ``info`` says."""
        self.job.info = info
        task = info.tasks[-1] if info.tasks else None
        self.state = str(info.state)
        self.worker = info.worker_name or ""
        self.gpus = list(task.gpu_indices) if task is not None else []
        self.elapsed = info.duration or 0.0
        self.pending_reasons = list(info.pending_reasons) if info.state == "queued" else []
        self._render()

    def add_lines(self, lines: Sequence[contracts.LogLine]) -> None:
        """Append output lines (relayed cell messages as their text) to the tail;
        a gang's lines show as ``[rank] text``."""
        added = False
        ranks = set(self.ranks)
        for line in lines:
            if line.offset < self._offset:
                continue
            self._offset = line.offset + 1
            text = log_text(line, self._decoder)
            if text is not None:
                self._lines.extend((line.rank, t) for t in text.splitlines() or [""])
                added = True
                if line.rank is not None:
                    ranks.add(line.rank)
        if len(ranks) != len(self.ranks):
            self.ranks = sorted(ranks)
            chosen = self.rank_select.value
            self.rank_select.options = [("all ranks", _ALL_RANKS)] + [
                (f"rank {r}", r) for r in self.ranks
            ]
            self.rank_select.value = chosen  # a rank that shows up later keeps the choice
            self.rank_select.layout.display = None
        if added:
            self._render_tail()

    def add_points(self, points: Sequence[contracts.StoredMetricPoint]) -> None:
        """Add training metric points to the chart (a point seen twice counts once)."""
        names = list(self.metric_names)
        for p in points:
            if p.seq <= self._metrics_after:
                continue
            self._metrics_after = p.seq
            x = float(p.step if p.step is not None else p.seq)
            for name, value in p.metrics.items():
                if name not in self._series:
                    self._series[name] = {}
                    names.append(name)
                series = self._series[name].setdefault(p.rank, [])
                series.append((x, value))
                if len(series) > _KEPT_POINTS:
                    del series[1::2]  # thin out: keep the shape, bound the memory
        if names != list(self.metric_names):
            self.metric_names = names
            current = self.metric_select.value
            self.metric_select.options = names
            self.metric_select.value = current if current in names else default_metric(names)
            self.chart_box.layout.display = None
        self._render_chart()

    def series(self, metric: str, *, per_rank: bool = False) -> dict[str, Points]:
        """What the chart draws for ``metric``: label -> ``[(step, value)]``. The
        main line is the reduced one (points without a rank, from
        ``Trainer(log_rank_metrics=True)``), else rank 0's, else the lowest rank's;
        ``per_rank`` draws every rank that reported its own values."""
        by_rank = self._series.get(metric, {})
        if not by_rank:
            return {}
        ranked = sorted((r, pts) for r, pts in by_rank.items() if r is not None)
        if per_rank and ranked:
            return {f"rank {r}": pts for r, pts in ranked}
        main = None if None in by_rank else 0 if 0 in by_rank else ranked[0][0]
        return {metric: by_rank[main]}

    def cancel(self) -> None:
        """The cancel button: cancel the job (nothing happens once it ended)."""
        try:
            self.update(self.job.connection.cancel(self.job.id))
        except errors.InvalidTransition:
            self.update(self.job.connection.job(self.job.id))

    # ------------------------------------------------------------- following

    def start(self) -> None:
        """Follow the job in a background thread until it ends."""
        if self._thread is None and not self.job.info.state.terminal:
            self._thread = threading.Thread(target=self._follow, name="gpulayer-monitor",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop following (the view keeps what it showed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _follow(self) -> None:
        conn = self.job.connection
        charts = self.job.info.spec.kind in _METRIC_KINDS
        try:
            while not self._stop.is_set():
                page = conn.logs(self.job.id, self._offset, wait=_RUNNING_HOLD_SECONDS)
                self.add_lines(page.lines)
                self._offset = max(self._offset, page.next_offset)
                if charts:
                    self.add_points(self.job.metrics(self._metrics_after))
                self.update(conn.job(self.job.id))
                if page.complete and self.job.info.state.terminal:
                    if charts:  # the last points, stored before the end
                        self.add_points(self.job.metrics(self._metrics_after))
                    return
        except errors.GpulayerError as e:  # a background thread: show it, do not raise
            self.reasons.value = f"<i>monitor stopped: {html.escape(e.message)}</i>"

    def _render_tail(self) -> None:
        only = self.rank_select.value
        show_rank = bool(self.ranks) and only == _ALL_RANKS
        texts = [
            f"[{r}] {t}" if show_rank and r is not None else t
            for r, t in self._lines
            if only == _ALL_RANKS or r == only
        ]
        self.log_tail = texts[-self.tail_lines :]
        self.log_pane.value = "<pre style='margin:0'>" + html.escape("\n".join(self.log_tail))
        self.log_pane.value += "</pre>"

    def _render_chart(self) -> None:
        metric = self.metric_select.value
        self.chart.value = (
            ""
            if not metric
            else svg_chart(self.series(metric, per_rank=self.per_rank.value), title=metric)
        )

    def _render(self) -> None:
        info = self.job.info
        parts = [f"<b>{html.escape(info.name)}</b>", f"<code>{info.id}</code>",
                 f"<b>{html.escape(self.state)}</b>"]  # fmt: skip
        if self.worker:
            parts.append(f"on {html.escape(self.worker)}")
        if self.gpus:
            parts.append("GPU " + ",".join(map(str, self.gpus)))
        if self.elapsed:
            parts.append(contracts.format_duration(self.elapsed))
        if info.reason and info.state.terminal and info.state != "succeeded":
            parts.append(html.escape(info.reason))
        self.header.value = " · ".join(parts)
        self.reasons.value = (
            "<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in self.pending_reasons) + "</ul>"
            if self.pending_reasons
            else ""
        )
        if info.state == "queued" and info.unsatisfiable:  # it would wait for ever
            why = html.escape(info.reason or "no registered worker could ever run it")
            todo = html.escape(pending.hint(info))
            self.reasons.value = f"<b>cannot start</b>: {why}; {todo}{self.reasons.value}"
        self.cancel_button.disabled = info.state.terminal
        self.cancel_button.button_style = "" if info.state.terminal else "danger"
        style = _STATE_STYLE.get(self.state)
        self.add_class("gpulayer-job-monitor")
        for s in _STATE_STYLE.values():
            self.remove_class(f"gpulayer-{s}")
        if style:
            self.add_class(f"gpulayer-{style}")


def _hidden() -> w.Layout:
    return w.Layout(display="none")


class WorkersTable(w.VBox):
    """The workers with their devices, GPU use and running tasks; ``refresh()`` reloads."""

    workers = List(Dict())

    def __init__(self, conn: Connection) -> None:
        self.connection = conn
        self.table = w.HTML()
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(lambda _: self.refresh())
        super().__init__([self.table, self.refresh_button])
        self.refresh()

    def refresh(self) -> None:
        """Fetch the workers again."""
        self.workers = [_worker_row(x) for x in self.connection.workers()]
        head = ("name", "state", "devices", "GPU use", "running")
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(r[h]))}</td>" for h in head) + "</tr>"
            for r in self.workers
        )
        self.table.value = (
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + rows + "</table>"
        )

    def __repr__(self) -> str:
        return "\n".join(
            f"{r['name']}  {r['state']}  {r['devices']}  {r['GPU use']}  {r['running']} running"
            for r in self.workers
        )


def _worker_row(x: contracts.Worker) -> dict[str, Any]:
    devices = ", ".join(sorted({d.name for d in x.devices})) or "cpu"
    if x.devices:
        devices = f"{len(x.devices)} × {devices}"
    use = [g.utilization_percent for g in x.gpus if g.utilization_percent is not None]
    return {
        "name": x.name,
        "state": str(x.state),
        "devices": devices,
        "GPU use": f"{sum(use) / len(use):.0f}%" if use else "-",
        "running": len(x.running_tasks),
    }


class JobsProgress(w.HBox):
    """A progress bar over many jobs; :meth:`wait` blocks until all ended."""

    done = Int(0)
    failed = Int(0)

    def __init__(self, jobs: Sequence[Job], description: str = "jobs") -> None:
        self.jobs = list(jobs)
        self.bar = w.IntProgress(value=0, min=0, max=len(self.jobs), description=description)
        self.label = w.Label()
        super().__init__([self.bar, self.label])
        self._show()

    def mark(self, infos: Sequence[contracts.Job]) -> None:
        """Count jobs that ended."""
        by_id = {j.id: j for j in self.jobs}
        for info in infos:
            job = by_id.get(info.id)
            if job is not None and not job.info.state.terminal and info.state.terminal:
                job.info = info
                self.done += 1
                self.failed += info.state != "succeeded"
        self._show()

    def wait(self, timeout: float = 30.0) -> None:
        """Update until every job ended (each long poll holds up to ``timeout`` s)."""
        while True:
            pending = [j for j in self.jobs if not j.info.state.terminal]
            if not pending:
                return
            self.mark(pending[0].connection.wait_any([j.id for j in pending], timeout))

    def _show(self) -> None:
        self.bar.value = self.done
        self.label.value = f"{self.done}/{len(self.jobs)}" + (
            f" ({self.failed} failed)" if self.failed else ""
        )
        if self.done >= len(self.jobs):
            self.bar.bar_style = "danger" if self.failed else "success"
