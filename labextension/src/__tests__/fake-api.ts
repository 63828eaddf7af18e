// A fake IGpulayerAPI over in-memory jobs, workers and log lines (for jest only).

import { ApiError, type IGpulayerAPI } from '../api';
import type {
  IArtifactList,
  IHealth,
  IInstance,
  IJob,
  ILogLine,
  ILogPage,
  IMetricPage,
  IPlacement,
  IStoredMetricPoint,
  ITelemetry,
  IWorker,
  IWorkerList,
  JobState
} from '../contracts';

// Built with `as`: fields that later contracts add need no change here.
export function job(id: string, state: JobState, extra: Partial<IJob> = {}): IJob {
  return {
    api_version: 'gpulayer.dev/v1alpha1',
    id,
    spec: {
      api_version: 'gpulayer.dev/v1alpha1',
      kind: 'command',
      name: null,
      command: ['true'],
      shell: null,
      env: {},
      bundle: null,
      resources: {
        profile: null,
        gpus: 0,
        gpu_memory: null,
        gpu_model: null,
        accelerator: null,
        min_compute_capability: null,
        gpu_memory_kind: null,
        cpus: 1,
        memory: null,
        selector: {},
        worker: null
      },
      timeout: null,
      retries: 0,
      priority: 0,
      labels: {}
    } as IJob['spec'],
    state,
    reason: null,
    owner: 'ada',
    exit_code: null,
    attempts: 0,
    worker_id: null,
    worker_name: null,
    created_at: '2026-12-02T10:00:00Z',
    updated_at: '2026-12-02T10:00:00Z',
    started_at: null,
    ended_at: null,
    tasks: [],
    pending_reasons: [],
    ...extra
  } as IJob;
}

export function withGpus(j: IJob, gpus: number): IJob {
  return { ...j, spec: { ...j.spec, resources: { ...j.spec.resources, gpus } } };
}

export function worker(name: string, gpus: number, extra: Partial<IWorker> = {}): IWorker {
  return {
    id: `id-${name}`,
    name,
    hostname: name,
    state: 'ready',
    cpus: 4,
    memory_bytes: 8 * 2 ** 30,
    devices: Array.from({ length: gpus }, (_, index) => ({
      index,
      kind: 'cuda' as const,
      name: 'NVIDIA A100 (simulated)',
      memory_bytes: 80 * 2 ** 30,
      memory_kind: 'dedicated' as const,
      uuid: null,
      compute_capability: '8.0',
      driver_version: null,
      runtime_version: null,
      simulated: true
    })),
    labels: {},
    slots: 4,
    version: 'test',
    registered_at: '2026-12-02T10:00:00Z',
    last_heartbeat: null,
    running_tasks: [],
    cpu_percent: null,
    memory_used_bytes: null,
    gpus: [],
    tasks: [],
    ...extra
  } as IWorker;
}

export function instance(id: string, extra: Partial<IInstance> = {}): IInstance {
  return {
    id,
    provider: 'hpc',
    offer: 'gpu',
    state: 'provisioning',
    external_id: null,
    workers: [`hpc-${id}`],
    nodes: 1,
    gpus: 1,
    job_ids: [],
    reason: null,
    detail: null,
    price_per_hour: 0,
    cost: 0,
    created_at: '2026-12-02T10:00:00Z',
    ready_at: null,
    ended_at: null,
    age_seconds: 0,
    ...extra
  } as IInstance;
}

export function line(offset: number, text: string, rank?: number): ILogLine {
  return {
    offset,
    stream: 'stdout',
    ts: '2026-12-02T10:00:01Z',
    text,
    task_id: 't1',
    rank: rank ?? null
  };
}

export class FakeAPI implements IGpulayerAPI {
  jobsById = new Map<string, IJob>();
  workerList: IWorker[] = [];
  /** null: a control plane older than providers (GET instances is 404) */
  instanceList: IInstance[] | null = [];
  lines: ILogLine[] = [];
  complete = false;
  telemetryOf: ITelemetry | null = null;
  calls: string[] = [];
  failNext: Error | null = null;

  async health(): Promise<IHealth> {
    return {
      api_version: 'gpulayer.dev/v1alpha1',
      status: 'ok',
      version: 'test',
      workers_ready: this.workerList.length,
      jobs_active: 0
    };
  }

  async jobs(q: IGpulayerAPI.IJobQuery = {}): Promise<IJob[]> {
    this.calls.push(`jobs state=${q.state ?? ''} owner=${q.owner ?? ''}`);
    this.maybeFail();
    return [...this.jobsById.values()]
      .filter(j => !q.state || j.state === q.state)
      .filter(j => !q.owner || j.owner === q.owner)
      .reverse();
  }

  async job(id: string): Promise<IJob> {
    const j = this.jobsById.get(id);
    if (!j) {
      throw new Error(`no job ${id}`);
    }
    return j;
  }

  async cancel(id: string): Promise<IJob> {
    this.calls.push(`cancel ${id}`);
    const j = { ...(await this.job(id)), state: 'cancelled' as JobState };
    this.jobsById.set(id, j);
    return j;
  }

  async logs(id: string, offset: number, wait: number): Promise<ILogPage> {
    this.calls.push(`logs ${id} offset=${offset} wait=${wait}`);
    this.maybeFail();
    const lines = this.lines.filter(l => l.offset >= offset).slice(0, 2);
    const next = lines.length ? lines[lines.length - 1].offset + 1 : offset;
    const done = this.complete && !this.lines.some(l => l.offset >= next);
    return { api_version: '', lines, next_offset: next, complete: done };
  }

  async artifacts(): Promise<IArtifactList> {
    return { api_version: '', artifacts: [] };
  }

  artifactUrl(id: string, name: string): string {
    return `/gpulayer/api/v1/jobs/${id}/artifacts/${name}`;
  }

  async placement(): Promise<IPlacement> {
    throw new Error('not used');
  }

  async workers(): Promise<IWorkerList> {
    this.maybeFail();
    return { api_version: '', workers: this.workerList };
  }

  points: IStoredMetricPoint[] = [];

  async metrics(id: string, after: number): Promise<IMetricPage> {
    this.calls.push(`metrics ${id} ${after}`);
    const points = this.points.filter(p => p.seq > after).slice(0, 2); // pages of two
    const next = points.length ? points[points.length - 1].seq : after;
    return { api_version: '', points, next_after: next, complete: false };
  }

  async instances(): Promise<IInstance[]> {
    this.calls.push('instances');
    if (this.instanceList === null) {
      throw new ApiError(404, 'extension_missing', 'no such route');
    }
    return this.instanceList;
  }

  async telemetry(name: string): Promise<ITelemetry> {
    return (
      this.telemetryOf ?? { api_version: '', worker_id: name, worker_name: name, samples: [] }
    );
  }

  private maybeFail(): void {
    if (this.failNext) {
      const e = this.failNext;
      this.failNext = null;
      throw e;
    }
  }
}
