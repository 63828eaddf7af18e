// Models behind the sidebar: what the views show, kept apart from React.
//
// ClusterModel polls workers and jobs (a lumino Poll with backoff that stands by
// while Lab is hidden), JobModel follows one job, LogFollower follows its log
// from an offset with the server's long poll. They depend on IGpulayerAPI only,
// so the jest tests drive them with a fake.

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import type { ApiError, IGpulayerAPI } from './api';
import type {
  IArtifact,
  IInstance,
  IJob,
  ILogLine,
  IStoredMetricPoint,
  ITelemetry,
  IWorker,
  JobState
} from './contracts';

const ACTIVE: readonly JobState[] = ['scheduled', 'running'];
const TERMINAL: readonly JobState[] = [
  'succeeded',
  'failed',
  'cancelled',
  'timed_out',
  'lost'
];

/** True once nothing more will happen to a job in this state. */
export function isTerminal(state: JobState): boolean {
  return TERMINAL.includes(state);
}

/** Short human form of a duration, as the CLI prints it: 850ms, 12.3s, 4m05s, 2h10m. */
export function formatDuration(seconds: number | null): string {
  if (seconds === null || !isFinite(seconds)) {
    return '-';
  }
  if (seconds < 1) {
    return `${Math.round(seconds * 1000)}ms`;
  }
  if (seconds < 60) {
    return `${seconds.toFixed(1)}s`;
  }
  if (seconds < 3600) {
    const s = Math.floor(seconds % 60);
    return `${Math.floor(seconds / 60)}m${String(s).padStart(2, '0')}s`;
  }
  const m = Math.floor((seconds % 3600) / 60);
  return `${Math.floor(seconds / 3600)}h${String(m).padStart(2, '0')}m`;
}

/** Bytes in binary units: 512B, 1.5KiB, 80.0GiB. */
export function formatBytes(bytes: number | null): string {
  if (bytes === null) {
    return '-';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let i = 0;
  while (value >= 1024 && i < units.length - 1) {
    value /= 1024;
    i++;
  }
  return i === 0 ? `${value}B` : `${value.toFixed(1)}${units[i]}`;
}

/**
 * How long a job has been going: running from its start, ended from start to end,
 * waiting (queued or scheduled) since it was submitted.
 */
export function elapsedSeconds(job: IJob, now: number = Date.now()): number {
  const t = (s: string | null) => (s === null ? null : Date.parse(s));
  const start = t(job.started_at) ?? t(job.created_at) ?? now;
  const end = t(job.ended_at) ?? now;
  return Math.max(0, (end - start) / 1000);
}

/** GPUs held by jobs that are placed or running, out of the GPUs of workers that are up. */
export interface IGpuSummary {
  busy: number;
  total: number;
}

/** Count reserved GPUs from the active jobs' requests, capacity from the workers. */
export function gpuSummary(workers: IWorker[], active: IJob[]): IGpuSummary {
  const total = workers
    .filter(w => w.state !== 'offline')
    .reduce((n, w) => n + w.devices.length, 0);
  const busy = active
    .filter(j => ACTIVE.includes(j.state))
    .reduce((n, j) => n + j.spec.resources.gpus, 0);
  return { busy, total };
}

/** One GPU of a worker as the worker list draws it. */
export interface IGpuBar {
  index: number;
  name: string;
  memoryBytes: number;
  /** null when the device reports no readings (simulated, AMD, Apple) */
  utilizationPercent: number | null;
  memoryUsedBytes: number | null;
}

/** A worker's devices joined with its latest readings. */
export function gpuBars(worker: IWorker): IGpuBar[] {
  const readings = new Map(worker.gpus.map(g => [g.index, g]));
  return worker.devices.map(d => {
    const g = readings.get(d.index);
    return {
      index: d.index,
      name: d.name,
      memoryBytes: d.memory_bytes,
      utilizationPercent: g?.utilization_percent ?? null,
      memoryUsedBytes: g?.memory_used_bytes ?? null
    };
  });
}

/** Filters of the job list; null means any. */
export interface IJobFilter {
  state: JobState | null;
  owner: string | null;
}

/** A connection problem the views show instead of data. */
export interface IProblem {
  code: string;
  message: string;
}

function problemOf(error: unknown): IProblem {
  const e = error as Partial<ApiError>;
  return {
    code: typeof e.code === 'string' ? e.code : 'error',
    message: typeof e.message === 'string' ? e.message : String(error)
  };
}

/** Workers, jobs and the GPU summary, refreshed by polling. */
export class ClusterModel {
  constructor(options: ClusterModel.IOptions) {
    this.api = options.api;
    this._poll = new Poll({
      auto: options.auto ?? true,
      factory: () => this.refresh(),
      frequency: {
        interval: options.intervalMs ?? 3000,
        backoff: true,
        max: 30000
      },
      name: 'gpulayer:cluster',
      standby: 'when-hidden'
    });
  }

  readonly api: IGpulayerAPI;
  workers: IWorker[] = [];
  jobs: IJob[] = [];
  /** Provider instances (empty without providers, or from a control plane without them). */
  instances: IInstance[] = [];
  /** Owners seen in the newest jobs, for the owner filter. */
  owners: string[] = [];
  gpus: IGpuSummary = { busy: 0, total: 0 };
  problem: IProblem | null = null;
  loaded = false;

  /** Emitted after every refresh (with new data or a new problem). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get filter(): IJobFilter {
    return this._filter;
  }

  /** Change the job filters and refresh at once. */
  async setFilter(filter: Partial<IJobFilter>): Promise<void> {
    this._filter = { ...this._filter, ...filter };
    await this._poll.refresh();
  }

  /** Ask for fresh data now (after a cancel, say). */
  async refreshNow(): Promise<void> {
    await this._poll.refresh();
    await this._poll.tick;
  }

  /** One round of requests; a failure becomes `problem` and the poll backs off. */
  async refresh(): Promise<void> {
    try {
      const [workers, jobs, running, scheduled, everyone, instances] = await Promise.all([
        this.api.workers(),
        this.api.jobs({ state: this._filter.state, owner: this._filter.owner }),
        this.api.jobs({ state: 'running', limit: 10000 }),
        this.api.jobs({ state: 'scheduled', limit: 10000 }),
        this.api.jobs({ limit: 200 }),
        // a control plane from before providers has no such route: no instances, no problem
        this.api.instances().catch((e: Partial<ApiError>) =>
          e.status === 404 ? [] : Promise.reject(e)
        )
      ]);
      this.workers = workers.workers;
      this.instances = instances;
      this.jobs = jobs;
      this.gpus = gpuSummary(this.workers, [...running, ...scheduled]);
      const owners = new Set(everyone.map(j => j.owner));
      if (this._filter.owner) {
        owners.add(this._filter.owner);
      }
      this.owners = [...owners].sort();
      this.problem = null;
      this.loaded = true;
      this._changed.emit();
    } catch (error) {
      this.problem = problemOf(error);
      this._changed.emit();
      throw error;
    }
  }

  /** Active jobs placed on `worker`, for its "running" line. */
  jobsOn(worker: IWorker): IJob[] {
    return this.jobs.filter(
      j => j.worker_name === worker.name && ACTIVE.includes(j.state)
    );
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  private _filter: IJobFilter = { state: null, owner: null };
  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
}

export namespace ClusterModel {
  export interface IOptions {
    api: IGpulayerAPI;
    /** Start polling at once (default true; tests call refresh themselves). */
    auto?: boolean;
    intervalMs?: number;
  }
}

/** A log line; a gang job's lines carry the global `rank` that wrote them. */
export type IRankedLine = ILogLine;

/**
 * Follows a job's log from an offset with the server's long poll
 * (`GET jobs/{id}/logs?offset=N&wait=S`), never re-reading what it has.
 */
export class LogFollower {
  constructor(options: LogFollower.IOptions) {
    this.api = options.api;
    this.jobId = options.jobId;
    this.offset = options.offset ?? 0;
    this.waitSeconds = options.waitSeconds ?? 25;
    this.maxLines = options.maxLines ?? 20000;
    this.retryMs = options.retryMs ?? 1000;
  }

  readonly api: IGpulayerAPI;
  readonly jobId: string;
  readonly waitSeconds: number;
  readonly maxLines: number;
  readonly retryMs: number;
  /** The next line to ask for. */
  offset: number;
  lines: IRankedLine[] = [];
  /** True once the job ended and every line it will have is here. */
  complete = false;
  problem: IProblem | null = null;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Ranks seen so far, ascending (empty for jobs whose lines carry none). */
  get ranks(): number[] {
    return [...this._ranks].sort((a, b) => a - b);
  }

  /** The lines of one rank, or all lines for null. */
  visible(rank: number | null): IRankedLine[] {
    return rank === null ? this.lines : this.lines.filter(l => l.rank === rank);
  }

  /** Fetch one page; returns false once the log is complete. */
  async step(): Promise<boolean> {
    const page = await this.api.logs(
      this.jobId,
      this.offset,
      this.waitSeconds,
      this._abort.signal
    );
    const lines = page.lines as IRankedLine[];
    for (const line of lines) {
      if (typeof line.rank === 'number') {
        this._ranks.add(line.rank);
      }
    }
    if (lines.length) {
      this.lines = this.lines.concat(lines);
      if (this.lines.length > this.maxLines) {
        this.lines = this.lines.slice(this.lines.length - this.maxLines);
      }
    }
    this.offset = page.next_offset;
    this.complete = page.complete && lines.length === 0;
    this.problem = null;
    this._changed.emit();
    return !this.complete;
  }

  /** Follow until the log is complete or `stop()`; errors retry after `retryMs`. */
  async follow(): Promise<void> {
    while (!this._stopped) {
      try {
        if (!(await this.step())) {
          return;
        }
      } catch (error) {
        if (this._stopped) {
          return;
        }
        this.problem = problemOf(error);
        this._changed.emit();
        await new Promise(resolve => setTimeout(resolve, this.retryMs));
      }
    }
  }

  /** Stop following (aborts an open long poll). */
  stop(): void {
    this._stopped = true;
    this._abort.abort();
  }

  private _ranks = new Set<number>();
  private _stopped = false;
  private _abort = new AbortController();
  private _changed = new Signal<this, void>(this);
}

export namespace LogFollower {
  export interface IOptions {
    api: IGpulayerAPI;
    jobId: string;
    offset?: number;
    waitSeconds?: number;
    maxLines?: number;
    retryMs?: number;
  }
}

/** Time series for a chart: shared x (UNIX seconds) and one y array per series. */
export interface ISeriesSet {
  x: number[];
  series: { label: string; unit: string; values: (number | null)[] }[];
}

/**
 * The numeric readings that exist for a job today, from its worker's telemetry
 * window: the CPU and memory of each of its tasks' process trees, and the
 * utilization and memory of the GPUs it holds (when the devices report them).
 * Series without a single value are left out.
 */
export function jobSeries(
  telemetry: ITelemetry,
  taskIds: string[],
  gpuIndices: number[]
): ISeriesSet {
  const samples = telemetry.samples.filter(s =>
    s.tasks.some(t => taskIds.includes(t.task_id))
  );
  const x = samples.map(s => Date.parse(s.ts) / 1000);
  const pick = (f: (s: (typeof samples)[number]) => number | null | undefined) =>
    samples.map(s => f(s) ?? null);
  const task = (s: (typeof samples)[number]) =>
    s.tasks.find(t => taskIds.includes(t.task_id));
  const series: ISeriesSet['series'] = [
    { label: 'task CPU', unit: '%', values: pick(s => task(s)?.cpu_percent) },
    {
      label: 'task memory',
      unit: 'MiB',
      values: pick(s => {
        const rss = task(s)?.rss_bytes;
        return rss === undefined ? null : rss / 2 ** 20;
      })
    }
  ];
  for (const i of gpuIndices) {
    const gpu = (s: (typeof samples)[number]) => s.gpus.find(g => g.index === i);
    series.push({
      label: `GPU ${i} utilization`,
      unit: '%',
      values: pick(s => gpu(s)?.utilization_percent)
    });
  }
  return { x, series: series.filter(s => s.values.some(v => v !== null)) };
}

/** The jobs whose tasks ship training metric points. */
const METRIC_KINDS = ['command', 'distributed'];

/**
 * Training metrics over steps: one series per metric name. The line of each is
 * the reduced one (points without a rank, from `Trainer(log_rank_metrics=True)`),
 * else rank 0's, else the lowest rank's; with `perRank`, one series per rank of
 * `metric` instead. x is the step (the point's `seq` when it has none).
 */
export function trainingSeries(
  points: IStoredMetricPoint[],
  options: { perRank?: boolean; metric?: string } = {}
): ISeriesSet {
  const ranks = [...new Set(points.map(p => p.rank))];
  const numbered = ranks.filter((r): r is number => r !== null).sort((a, b) => a - b);
  const main = ranks.includes(null) ? null : numbered.includes(0) ? 0 : numbered[0] ?? null;
  const stepOf = (p: IStoredMetricPoint) => p.step ?? p.seq;
  const lines: { label: string; pick: (p: IStoredMetricPoint) => number | null }[] = [];
  if (options.perRank && options.metric) {
    const name = options.metric;
    for (const r of numbered) {
      lines.push({ label: `${name} rank ${r}`, pick: p => (p.rank === r ? p.metrics[name] ?? null : null) });
    }
  } else {
    const names: string[] = [];
    for (const p of points) {
      if (p.rank === main) {
        for (const k of Object.keys(p.metrics)) {
          if (!names.includes(k)) {
            names.push(k);
          }
        }
      }
    }
    for (const name of names) {
      lines.push({ label: name, pick: p => (p.rank === main ? p.metrics[name] ?? null : null) });
    }
  }
  // One x per step; a step's value is the last point of that step with one.
  const x = [...new Set(points.map(stepOf))].sort((a, b) => a - b);
  const at = new Map(x.map((s, i) => [s, i]));
  const series = lines.map(line => {
    const values: (number | null)[] = x.map(() => null);
    for (const p of points) {
      const v = line.pick(p);
      if (v !== null && v !== undefined) {
        values[at.get(stepOf(p))!] = v;
      }
    }
    return { label: line.label, unit: '', values };
  });
  return { x, series: series.filter(s => s.values.some(v => v !== null)) };
}

/** One job: its state, pending reasons, artifacts and charts, until it ends. */
export class JobModel {
  constructor(options: JobModel.IOptions) {
    this.api = options.api;
    this.jobId = options.jobId;
    this._poll = new Poll({
      auto: options.auto ?? true,
      factory: () => this.refresh(),
      frequency: {
        interval: options.intervalMs ?? 2000,
        backoff: true,
        max: 30000
      },
      name: `gpulayer:job:${options.jobId}`,
      standby: 'when-hidden'
    });
  }

  readonly api: IGpulayerAPI;
  readonly jobId: string;
  job: IJob | null = null;
  artifacts: IArtifact[] = [];
  chart: ISeriesSet = { x: [], series: [] };
  /** The training metrics over steps (a Trainer's log points), as they arrive. */
  training: ISeriesSet = { x: [], series: [] };
  /** Every training metric point read so far, oldest first. */
  points: IStoredMetricPoint[] = [];
  problem: IProblem | null = null;
  cancelling = false;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Read the job, then its artifacts and its worker's telemetry. */
  async refresh(): Promise<void> {
    try {
      const job = await this.api.job(this.jobId);
      this.job = job;
      this.artifacts = (await this.api.artifacts(this.jobId)).artifacts;
      const task = job.tasks[job.tasks.length - 1];
      if (job.worker_name && task) {
        const telemetry = await this.api.telemetry(job.worker_name);
        const fresh = jobSeries(
          telemetry,
          job.tasks.map(t => t.id),
          task.gpu_indices
        );
        // The worker's window rolls on: keep the last readings once it has moved past them.
        if (fresh.x.length || !this.chart.x.length) {
          this.chart = fresh;
        }
      }
      if (METRIC_KINDS.includes(job.spec.kind)) {
        await this._readPoints();
      }
      this.problem = null;
      this._changed.emit();
      if (isTerminal(job.state) && this._endedRefreshes++ > 0) {
        // One more round after the end picks up the last artifacts; then stop.
        this._poll.stop();
      }
    } catch (error) {
      this.problem = problemOf(error);
      this._changed.emit();
      throw error;
    }
  }

  /** Ask the server to cancel; the state follows on the next refresh. */
  async cancel(): Promise<void> {
    this.cancelling = true;
    this._changed.emit();
    try {
      this.job = await this.api.cancel(this.jobId);
      this.problem = null;
    } catch (error) {
      this.problem = problemOf(error);
    } finally {
      this.cancelling = false;
      this._changed.emit();
    }
    void this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
    Signal.clearData(this);
  }

  /** The points after the last one read (page by page), then the series again. */
  private async _readPoints(): Promise<void> {
    const before = this.points.length;
    for (;;) {
      const after = this.points.length ? this.points[this.points.length - 1].seq : 0;
      const page = await this.api.metrics(this.jobId, after);
      this.points.push(...page.points);
      if (!page.points.length || page.next_after <= after) {
        break;
      }
    }
    if (this.points.length !== before) {
      this.training = trainingSeries(this.points);
    }
  }

  private _endedRefreshes = 0;
  private _poll: Poll;
  private _changed = new Signal<this, void>(this);
}

export namespace JobModel {
  export interface IOptions {
    api: IGpulayerAPI;
    jobId: string;
    auto?: boolean;
    intervalMs?: number;
  }
}
