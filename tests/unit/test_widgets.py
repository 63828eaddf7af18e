"""Widgets without a kernel: build them, feed them jobs and lines, and assert both
their traits and the comm messages a frontend would receive."""

from datetime import UTC, datetime, timedelta

import comm
import httpx
import pytest

from gpulayer import client, contracts
from gpulayer.client.jobs import Job

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class RecordingComm(comm.DummyComm):
    """A comm that keeps what it would send to the frontend."""

    sent: list[tuple[str, dict]] = []

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        RecordingComm.sent.append((msg_type, data or {}))


@pytest.fixture(autouse=True)
def recording(monkeypatch):
    RecordingComm.sent = []
    monkeypatch.setattr(comm, "create_comm", lambda *a, **kw: RecordingComm(*a, **kw))
    return RecordingComm.sent


def info(state="queued", **kw) -> contracts.Job:
    fields = dict(id="j1", spec=contracts.JobSpec(kind="cell", cell={"source": "1"}),
                  state=state, owner="ada", created_at=NOW, updated_at=NOW)  # fmt: skip
    fields.update(kw)
    return contracts.Job.model_validate(fields)


def conn_for(handler) -> client.Connection:
    return client.Connection("http://x/", "gl_t", transport=httpx.MockTransport(handler))


def updates(sent, widget) -> list[dict]:
    """State updates sent for ``widget``'s model."""
    return [d["state"] for t, d in sent if t == "comm_msg" and d.get("method") == "update"
            and widget.comm is not None]  # fmt: skip


def test_job_monitor_shows_state_reasons_tail_and_end(recording):
    from gpulayer.notebook.widgets import JobMonitor

    queued = info(pending_reasons=["gpu-box-1: needs 2 × GPU, has 1 free"])
    mon = JobMonitor(Job(conn_for(lambda r: None), queued))
    assert mon.state == "queued" and mon.pending_reasons == queued.pending_reasons
    assert "needs 2 × GPU" in mon.reasons.value and not mon.cancel_button.disabled

    task = contracts.Task(id="t1", job_id="j1", attempt=1, state="running", gpu_indices=[0, 1],
                          created_at=NOW)  # fmt: skip
    started = NOW - timedelta(seconds=3)
    mon.update(info("running", worker_name="gpu-box-1", tasks=[task], started_at=started))
    assert (mon.state, mon.worker, mon.gpus) == ("running", "gpu-box-1", [0, 1])
    assert mon.pending_reasons == [] and mon.elapsed >= 3
    assert "gpu-box-1" in mon.header.value and "GPU 0,1" in mon.header.value

    relayed = contracts.KernelMessage(
        msg_type="stream", content={"name": "stdout", "text": "a\nb\n"}
    )
    lines = [contracts.LogLine(offset=0, stream="iopub", ts=NOW, text=relayed.model_dump_json()),
             contracts.LogLine(offset=1, stream="system", ts=NOW, text="note")]  # fmt: skip
    mon.add_lines(lines)
    mon.add_lines(lines)  # a page seen twice adds nothing
    assert mon.log_tail == ["a", "b", "note"]
    assert "<pre" in mon.log_pane.value and "a\nb\nnote" in mon.log_pane.value

    ended = NOW
    mon.update(info("succeeded", worker_name="gpu-box-1", tasks=[task], started_at=started,
                    ended_at=ended))  # fmt: skip
    assert mon.state == "succeeded" and mon.elapsed == 3.0 and mon.cancel_button.disabled
    # What the frontend was told: the header, the log pane and the disabled button.
    sent = [d["state"] for t, d in recording if t == "comm_msg" and d.get("method") == "update"]
    assert any("succeeded" in s.get("value", "") for s in sent)
    assert any("a\nb\nnote" in s.get("value", "") for s in sent)
    assert {"disabled": True} in [{k: v} for s in sent for k, v in s.items() if k == "disabled"]


def test_cancel_button_cancels_the_job():
    from gpulayer.notebook.widgets import JobMonitor

    seen = []

    def handler(request):
        seen.append((request.method, request.url.path))
        body = info("cancelled", reason="cancelled by ada").model_dump_json()
        return httpx.Response(200, content=body.encode())

    mon = JobMonitor(Job(conn_for(handler), info("running")))
    mon.cancel_button.click()
    assert seen == [("POST", "/gpulayer/api/v1/jobs/j1/cancel")]
    assert mon.state == "cancelled" and mon.cancel_button.disabled
    assert "cancelled by ada" in mon.header.value


def test_follow_updates_until_the_job_ends():
    from gpulayer.notebook.widgets import JobMonitor

    relayed = contracts.KernelMessage(msg_type="stream", content={"text": "hi\n"})
    calls = {"logs": 0}

    def handler(request):
        if request.url.path.endswith("/logs"):
            calls["logs"] += 1
            done = calls["logs"] > 1
            lines = [] if done else [contracts.LogLine(offset=0, stream="iopub", ts=NOW,
                                                       text=relayed.model_dump_json())]  # fmt: skip
            page = contracts.LogPage(lines=lines, next_offset=1, complete=done)
            return httpx.Response(200, content=page.model_dump_json().encode())
        state = "succeeded" if calls["logs"] > 1 else "running"
        return httpx.Response(200, content=info(state).model_dump_json().encode())

    mon = JobMonitor(Job(conn_for(handler), info("running")), follow=True)
    mon._thread.join(10)
    assert not mon._thread.is_alive()
    assert mon.state == "succeeded" and mon.log_tail == ["hi"]


def test_workers_table_and_jobs_progress():
    from gpulayer.notebook.widgets import JobsProgress, WorkersTable

    dev = contracts.Device(index=0, kind="cuda", name="A100", memory_bytes=80 << 30)
    worker = contracts.Worker(
        id="w", name="gpu-box-1", hostname="h", state="ready", cpus=8, memory_bytes=1 << 34,
        devices=[dev], slots=4, version="0", registered_at=NOW, running_tasks=["t1"],
        gpus=[contracts.GpuSample(index=0, utilization_percent=75.0)],
    )  # fmt: skip

    def handler(request):
        if request.url.path.endswith("/workers"):
            body = contracts.WorkerList(workers=[worker])
        else:
            body = contracts.JobList(jobs=[info("succeeded"), info("failed", id="j2")])
        return httpx.Response(200, content=body.model_dump_json().encode())

    table = WorkersTable(conn_for(handler))
    assert table.workers == [{"name": "gpu-box-1", "state": "ready", "devices": "1 × A100",
                              "GPU use": "75%", "running": 1}]  # fmt: skip
    assert "<td>75%</td>" in table.table.value

    conn = conn_for(handler)
    bar = JobsProgress([Job(conn, info("running")), Job(conn, info("running", id="j2"))])
    assert (bar.done, bar.bar.max, bar.label.value) == (0, 2, "0/2")
    bar.wait()
    assert (bar.done, bar.failed, bar.bar.value) == (2, 1, 2)
    assert bar.label.value == "2/2 (1 failed)" and bar.bar.bar_style == "danger"


def test_plain_text_outside_a_notebook():
    job = Job(conn_for(lambda r: None), info("running", worker_name="gpu-box-1"))
    bundle = job._repr_mimebundle_()
    assert bundle == {"text/plain": "job j1 (cell) running, on gpu-box-1"}


def point(seq, step, rank, **metrics) -> contracts.StoredMetricPoint:
    return contracts.StoredMetricPoint(seq=seq, step=step, rank=rank, ts=NOW, metrics=metrics)


def test_a_gang_monitor_filters_the_log_by_rank_and_charts_metrics_per_rank(recording):
    from gpulayer.notebook.widgets import JobMonitor

    spec = contracts.JobSpec(kind="distributed", command=["python", "t.py"], nodes=2)
    mon = JobMonitor(Job(conn_for(lambda r: None), info("running", spec=spec)))
    assert mon.rank_select.layout.display == "none" and mon.chart_box.layout.display == "none"
    mon.add_lines([
        contracts.LogLine(offset=i, stream="stdout", ts=NOW, text=f"step {i // 2}", rank=i % 2)
        for i in range(4)
    ] + [contracts.LogLine(offset=4, stream="system", ts=NOW, text="started on w1")])  # fmt: skip
    assert mon.ranks == [0, 1] and mon.rank_select.layout.display is None
    assert mon.log_tail == ["[0] step 0", "[1] step 0", "[0] step 1", "[1] step 1",
                            "started on w1"]  # fmt: skip
    mon.rank_select.value = 1
    assert mon.log_tail == ["step 0", "step 1"]
    mon.add_lines([contracts.LogLine(offset=5, stream="stdout", ts=NOW, text="late", rank=2)])
    assert mon.ranks == [0, 1, 2] and mon.rank_select.value == 1  # the choice stays
    assert mon.log_tail == ["step 0", "step 1"]
    assert "step 1" in mon.log_pane.value and "[0]" not in mon.log_pane.value

    mon.add_points([point(1, 10, 0, **{"train/acc": 0.5, "train/loss": 2.0}),
                    point(2, 10, 1, **{"train/acc": 0.4, "train/loss": 2.2}),
                    point(3, 20, 0, **{"train/acc": 0.7, "train/loss": 1.0}),
                    point(4, 20, 1, **{"train/acc": 0.6, "train/loss": 1.2})])  # fmt: skip
    mon.add_points([point(3, 20, 0, **{"train/loss": 9.0})])  # seen already: ignored
    assert mon.metric_names == ["train/acc", "train/loss"]
    assert mon.metric_select.value == "train/loss"  # the loss first, whatever came first
    assert mon.chart_box.layout.display is None
    assert mon.series("train/loss") == {"train/loss": [(10.0, 2.0), (20.0, 1.0)]}  # rank 0
    assert mon.chart.value.count("<polyline") == 1 and "train/loss: 1" in mon.chart.value
    mon.per_rank.value = True
    assert list(mon.series("train/loss", per_rank=True)) == ["rank 0", "rank 1"]
    assert mon.chart.value.count("<polyline") == 2 and 'data-label="rank 1"' in mon.chart.value
    mon.metric_select.value = "train/acc"
    assert "train/acc" in mon.chart.value and "rank 1: 0.6" in mon.chart.value
    sent = [d["state"] for t, d in recording if t == "comm_msg" and d.get("method") == "update"]
    assert any("<svg" in s.get("value", "") for s in sent)  # the frontend got the chart
    # Trainer(log_rank_metrics=True): the reduced points (no rank) are the main line.
    mon.add_points(
        [point(5, 30, None, **{"train/acc": 0.8}), point(6, 30, 0, **{"train/acc": 0.9})]
    )
    assert mon.series("train/acc") == {"train/acc": [(30.0, 0.8)]}
    assert list(mon.series("train/acc", per_rank=True)) == ["rank 0", "rank 1"]


def test_follow_fetches_the_metrics_of_a_training_job():
    from gpulayer.notebook.widgets import JobMonitor

    spec = contracts.JobSpec(command=["python", "train.py"])
    served = {"logs": 0}

    def handler(request):
        path = request.url.path
        if path.endswith("/logs"):
            served["logs"] += 1
            page = contracts.LogPage(lines=[], next_offset=0, complete=served["logs"] > 1)
            return httpx.Response(200, content=page.model_dump_json().encode())
        if path.endswith("/metrics"):
            after = int(request.url.params["after"])
            pts = [point(s, s * 5, 0, **{"train/loss": 1 / s}) for s in (1, 2, 3) if s > after]
            page = contracts.MetricPage(points=pts, next_after=3, complete=True)
            return httpx.Response(200, content=page.model_dump_json().encode())
        state = "succeeded" if served["logs"] > 1 else "running"
        return httpx.Response(200, content=info(state, spec=spec).model_dump_json().encode())

    mon = JobMonitor(Job(conn_for(handler), info("running", spec=spec)), follow=True)
    mon._thread.join(10)
    assert not mon._thread.is_alive() and mon.state == "succeeded"
    assert mon.series("train/loss") == {"train/loss": [(5.0, 1.0), (10.0, 0.5), (15.0, 1 / 3)]}
    assert "<polyline" in mon.chart.value
