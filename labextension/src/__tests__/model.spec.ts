import { ApiError } from '../api';
import type { IStoredMetricPoint } from '../contracts';
import {
  ClusterModel,
  elapsedSeconds,
  formatBytes,
  formatDuration,
  gpuBars,
  gpuSummary,
  JobModel,
  jobSeries,
  LogFollower,
  trainingSeries
} from '../model';
import { FakeAPI, job, line, withGpus, worker } from './fake-api';

describe('formatting', () => {
  it('prints durations the way the CLI does', () => {
    expect([0.85, 12.34, 245, 7800, null].map(formatDuration)).toEqual([
      '850ms',
      '12.3s',
      '4m05s',
      '2h10m',
      '-'
    ]);
  });

  it('prints bytes in binary units', () => {
    expect([512, 1536, 80 * 2 ** 30, null].map(formatBytes)).toEqual([
      '512B',
      '1.5KiB',
      '80.0GiB',
      '-'
    ]);
  });

  it('measures a running job from its start and a queued one from its submission', () => {
    const now = Date.parse('2026-12-02T10:01:00Z');
    const running = job('a', 'running', { started_at: '2026-12-02T10:00:30Z' });
    const ended = job('b', 'succeeded', {
      started_at: '2026-12-02T10:00:10Z',
      ended_at: '2026-12-02T10:00:15Z'
    });
    expect(elapsedSeconds(running, now)).toBe(30);
    expect(elapsedSeconds(ended, now)).toBe(5);
    expect(elapsedSeconds(job('c', 'queued'), now)).toBe(60);
  });
});

describe('GPU summary and bars', () => {
  it('counts GPUs reserved by placed and running jobs against workers that are up', () => {
    const workers = [
      worker('a', 2),
      worker('b', 4, { state: 'offline' }),
      worker('c', 1, { state: 'draining' })
    ];
    const active = [withGpus(job('1', 'running'), 2), withGpus(job('2', 'scheduled'), 1)];
    const ended = withGpus(job('3', 'succeeded'), 1);
    expect(gpuSummary(workers, [...active, ended])).toEqual({ busy: 3, total: 3 });
  });

  it('joins devices with their latest readings, null where a device reports none', () => {
    const w = worker('a', 2, {
      gpus: [{ index: 1, utilization_percent: 40, memory_used_bytes: 2 ** 30, temperature_c: null, power_w: null }]
    });
    const bars = gpuBars(w);
    expect(bars.map(b => [b.index, b.utilizationPercent, b.memoryUsedBytes])).toEqual([
      [0, null, null],
      [1, 40, 2 ** 30]
    ]);
    expect(bars[0].memoryBytes).toBe(80 * 2 ** 30);
  });
});

describe('ClusterModel', () => {
  it('loads workers and jobs, and filters jobs by state and owner on the server', async () => {
    const api = new FakeAPI();
    api.workerList = [worker('local-1', 2)];
    api.jobsById.set('j1', withGpus(job('j1', 'running', { worker_name: 'local-1' }), 1));
    api.jobsById.set('j2', job('j2', 'queued', { owner: 'bob' }));
    const model = new ClusterModel({ api, auto: false });
    let changes = 0;
    model.changed.connect(() => changes++);
    await model.refresh();
    expect(model.loaded).toBe(true);
    expect(model.jobs.map(j => j.id)).toEqual(['j2', 'j1']);
    expect(model.owners).toEqual(['ada', 'bob']);
    expect(model.gpus).toEqual({ busy: 1, total: 2 });
    expect(model.jobsOn(api.workerList[0]).map(j => j.id)).toEqual(['j1']);
    expect(changes).toBe(1);

    model['_filter'] = { state: 'queued', owner: 'bob' };
    await model.refresh();
    expect(model.jobs.map(j => j.id)).toEqual(['j2']);
    expect(api.calls).toContain('jobs state=queued owner=bob');
    model.dispose();
  });

  it('turns a failure into a problem the view can show, and clears it on success', async () => {
    const api = new FakeAPI();
    const model = new ClusterModel({ api, auto: false });
    api.failNext = new ApiError(404, 'extension_missing', 'not enabled');
    await expect(model.refresh()).rejects.toThrow('not enabled');
    expect(model.problem).toEqual({ code: 'extension_missing', message: 'not enabled' });
    await model.refresh();
    expect(model.problem).toBeNull();
    model.dispose();
  });
});

describe('LogFollower', () => {
  it('follows from an offset and stops once the job ended and every line is in', async () => {
    const api = new FakeAPI();
    api.lines = [line(0, 'a'), line(1, 'b'), line(2, 'c')];
    api.complete = true;
    const f = new LogFollower({ api, jobId: 'j1', offset: 1, waitSeconds: 5 });
    await f.follow();
    expect(f.lines.map(l => l.text)).toEqual(['b', 'c']);
    expect(f.complete).toBe(true);
    expect(api.calls).toEqual([
      'logs j1 offset=1 wait=5',
      'logs j1 offset=3 wait=5'
    ]);
  });

  it('keeps going while the job runs and never asks twice for a line it has', async () => {
    const api = new FakeAPI();
    api.lines = [line(0, 'a')];
    const f = new LogFollower({ api, jobId: 'j1' });
    expect(await f.step()).toBe(true);
    expect(await f.step()).toBe(true); // the long poll came back empty
    api.lines.push(line(1, 'b'));
    api.complete = true;
    await f.step();
    expect(await f.step()).toBe(false);
    expect(f.lines.map(l => l.offset)).toEqual([0, 1]);
  });

  it('filters by rank when lines carry one', async () => {
    const api = new FakeAPI();
    api.lines = [line(0, 'r0', 0), line(1, 'r1', 1), line(2, 'r0 again', 0)];
    api.complete = true;
    const f = new LogFollower({ api, jobId: 'j1' });
    await f.follow();
    expect(f.ranks).toEqual([0, 1]);
    expect(f.visible(0).map(l => l.text)).toEqual(['r0', 'r0 again']);
    expect(f.visible(null)).toHaveLength(3);
  });

  it('keeps only the newest maxLines lines', async () => {
    const api = new FakeAPI();
    api.lines = [0, 1, 2, 3, 4].map(i => line(i, `l${i}`));
    api.complete = true;
    const f = new LogFollower({ api, jobId: 'j1', maxLines: 3 });
    await f.follow();
    expect(f.lines.map(l => l.text)).toEqual(['l2', 'l3', 'l4']);
  });

  it('retries after an error and reports it meanwhile', async () => {
    const api = new FakeAPI();
    api.lines = [line(0, 'a')];
    api.complete = true;
    api.failNext = new ApiError(0, 'unreachable', 'server gone');
    const f = new LogFollower({ api, jobId: 'j1', retryMs: 1 });
    const problems: (string | undefined)[] = [];
    f.changed.connect(() => problems.push(f.problem?.code));
    await f.follow();
    expect(problems[0]).toBe('unreachable');
    expect(f.problem).toBeNull();
    expect(f.lines.map(l => l.text)).toEqual(['a']);
  });
});

describe('job charts and JobModel', () => {
  const telemetry = {
    api_version: '',
    worker_id: 'w',
    worker_name: 'local-1',
    samples: [
      { ts: '2026-12-02T10:00:00Z', cpu_percent: 5, memory_used_bytes: 1, gpus: [], tasks: [] },
      {
        ts: '2026-12-02T10:00:05Z',
        cpu_percent: 5,
        memory_used_bytes: 1,
        gpus: [{ index: 0, utilization_percent: 90, memory_used_bytes: 1, temperature_c: null, power_w: null }],
        tasks: [{ task_id: 't1', cpu_percent: 99, rss_bytes: 2 ** 21, processes: 1 }]
      }
    ]
  };

  it('charts the job task readings and its GPUs, skipping series without values', () => {
    const set = jobSeries(telemetry, ['t1'], [0, 1]);
    expect(set.x).toEqual([Date.parse('2026-12-02T10:00:05Z') / 1000]);
    expect(set.series.map(s => [s.label, s.values])).toEqual([
      ['task CPU', [99]],
      ['task memory', [2]],
      ['GPU 0 utilization', [90]]
    ]);
    expect(jobSeries(telemetry, ['other'], [0]).series).toEqual([]);
  });

  it('reads the job, its artifacts and chart, and cancels through the API', async () => {
    const api = new FakeAPI();
    api.telemetryOf = telemetry;
    const task = {
      id: 't1', job_id: 'j1', attempt: 1, state: 'running' as const, worker_id: 'w',
      worker_name: 'local-1', node_rank: null, gpu_indices: [0], exit_code: null, reason: null,
      created_at: '2026-12-02T10:00:00Z', started_at: null, ended_at: null, environment: null
    };
    api.jobsById.set('j1', job('j1', 'running', { worker_name: 'local-1', tasks: [task] }));
    const model = new JobModel({ api, jobId: 'j1', auto: false });
    await model.refresh();
    expect(model.job?.state).toBe('running');
    expect(model.chart.series.map(s => s.label)).toContain('GPU 0 utilization');
    await model.cancel();
    expect(api.calls).toContain('cancel j1');
    expect(model.job?.state).toBe('cancelled');
    model.dispose();
  });
});

function point(
  seq: number,
  step: number,
  rank: number | null,
  metrics: Record<string, number>
): IStoredMetricPoint {
  return { seq, step, rank, metrics, epoch: 0, task_id: 't1', ts: '2026-12-02T10:00:01Z' };
}

describe('training metrics', () => {
  const points = [
    point(1, 10, 0, { 'train/loss': 2.0 }),
    point(2, 10, 1, { 'train/loss': 2.4 }),
    point(3, 20, 0, { 'train/loss': 1.0, 'val/loss': 1.5 }),
    point(4, 20, 1, { 'train/loss': 1.2 })
  ];

  it('draws rank 0 per metric over steps, or every rank of one metric', () => {
    const main = trainingSeries(points);
    expect(main.x).toEqual([10, 20]);
    expect(main.series).toEqual([
      { label: 'train/loss', unit: '', values: [2.0, 1.0] },
      { label: 'val/loss', unit: '', values: [null, 1.5] }
    ]);
    const perRank = trainingSeries(points, { perRank: true, metric: 'train/loss' });
    expect(perRank.series.map(s => [s.label, s.values])).toEqual([
      ['train/loss rank 0', [2.0, 1.0]],
      ['train/loss rank 1', [2.4, 1.2]]
    ]);
    // Reduced points (no rank) are the main line when a Trainer wrote both.
    const reduced = trainingSeries([...points, point(5, 30, null, { 'train/loss': 0.5 })]);
    expect(reduced.series).toEqual([{ label: 'train/loss', unit: '', values: [null, null, 0.5] }]);
  });

  it('reads a training job\'s points page by page, each once', async () => {
    const api = new FakeAPI();
    api.jobsById.set(
      'j1',
      job('j1', 'running', {
        spec: { ...job('j1', 'running').spec, kind: 'distributed', nodes: 2 }
      })
    );
    api.points = points.slice(0, 3);
    const model = new JobModel({ api, jobId: 'j1', auto: false });
    await model.refresh();
    expect(model.points.map(p => p.seq)).toEqual([1, 2, 3]);
    api.points = points;
    await model.refresh();
    expect(model.points.map(p => p.seq)).toEqual([1, 2, 3, 4]);
    expect(model.training.series[0].values).toEqual([2.0, 1.0]);
    expect(api.calls.filter(c => c.startsWith('metrics'))).toEqual([
      'metrics j1 0',
      'metrics j1 2',
      'metrics j1 3',
      'metrics j1 3',
      'metrics j1 4'
    ]);
    // A cell job has no metrics file: nothing is asked.
    const cellApi = new FakeAPI();
    cellApi.jobsById.set('j2', job('j2', 'running', { spec: { ...job('j2', 'running').spec, kind: 'cell' } }));
    const cell = new JobModel({ api: cellApi, jobId: 'j2', auto: false });
    await cell.refresh();
    expect(cellApi.calls.some(c => c.startsWith('metrics'))).toBe(false);
    model.dispose();
    cell.dispose();
  });
});
