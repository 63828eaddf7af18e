// The REST client: one typed method per route, all through requestAPI().
//
// Requests use Jupyter's own connection settings (base URL, token, XSRF cookie),
// so the sidebar is the logged-in Lab user; the server gives that user
// c.GpulayerApp.jupyter_user_role.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  API_PREFIX,
  IArtifactList,
  IErrorBody,
  IHealth,
  IInstance,
  IInstanceList,
  IJob,
  IJobList,
  ILogPage,
  IMetricPage,
  IPlacement,
  ITelemetry,
  IWorkerList,
  JobState
} from './contracts';

/** Why a request failed, in words a user can act on. */
export type ProblemCode =
  | 'extension_missing'
  | 'unreachable'
  | 'aborted'
  | string;

/** A failed request: the server's ErrorBody, or what went wrong on the way. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: ProblemCode,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** What the models need from the server (a fake implements it in tests). */
export interface IGpulayerAPI {
  health(): Promise<IHealth>;
  jobs(query?: IGpulayerAPI.IJobQuery): Promise<IJob[]>;
  job(id: string): Promise<IJob>;
  cancel(id: string): Promise<IJob>;
  logs(
    id: string,
    offset: number,
    waitSeconds: number,
    signal?: AbortSignal
  ): Promise<ILogPage>;
  artifacts(id: string): Promise<IArtifactList>;
  artifactUrl(id: string, name: string): string;
  placement(id: string): Promise<IPlacement>;
  workers(): Promise<IWorkerList>;
  telemetry(worker: string): Promise<ITelemetry>;
  /** Training metric points with `seq` after `after` (a page; ask again for more). */
  metrics(id: string, after: number): Promise<IMetricPage>;
  /** Provider instances: active ones, then recent ended ones (docs/providers.md). */
  instances(): Promise<IInstance[]>;
}

export namespace IGpulayerAPI {
  /** Filters of GET jobs. */
  export interface IJobQuery {
    state?: JobState | null;
    owner?: string | null;
    limit?: number;
  }
}

const MISSING =
  'The gpulayer server extension is not enabled in this Jupyter server. ' +
  'Install gpulayer in the environment that runs JupyterLab ' +
  '(pip install gpulayer) and restart it; `jupyter server extension list` ' +
  'should show jupyter_ext enabled.';

/**
 * Call a gpulayer route and parse its JSON answer.
 *
 * `path` is relative to the API prefix (`jobs/abc/logs`), or absolute from the
 * server's base URL when it starts with `/`. 204 answers resolve to null.
 *
 * @throws ApiError with the server's code and message, `extension_missing` when
 *   the route does not exist at all, `unreachable` when the server cannot be reached.
 */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T | null> {
  const url = path.startsWith('/')
    ? URLExt.join(settings.baseUrl, path)
    : URLExt.join(settings.baseUrl, API_PREFIX, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    if (init.signal?.aborted) {
      throw new ApiError(0, 'aborted', 'request aborted');
    }
    throw new ApiError(
      0,
      'unreachable',
      `Cannot reach the Jupyter server at ${settings.baseUrl}: ${String(error)}`
    );
  }
  if (response.status === 204) {
    return null;
  }
  const text = await response.text();
  let data: unknown = null;
  if (text && isJson(response)) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const body = data as IErrorBody | null;
    if (body && typeof body.code === 'string') {
      throw new ApiError(response.status, body.code, body.message);
    }
    if (response.status === 404) {
      throw new ApiError(404, 'extension_missing', MISSING);
    }
    throw new ApiError(
      response.status,
      'http_error',
      `${response.status} ${response.statusText} from ${url}`
    );
  }
  return data as T;
}

function isJson(response: Response): boolean {
  return (response.headers.get('Content-Type') ?? '').includes('json');
}

function query(params: Record<string, string | number | null | undefined>): string {
  const parts = Object.entries(params)
    .filter(([, v]) => v !== null && v !== undefined && v !== '')
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(String(v))}`);
  return parts.length ? `?${parts.join('&')}` : '';
}

function seg(value: string): string {
  return encodeURIComponent(value);
}

async function must<T>(p: Promise<T | null>): Promise<T> {
  const value = await p;
  if (value === null) {
    throw new ApiError(204, 'no_content', 'the server answered without a body');
  }
  return value;
}

/** The REST API of the gpulayer control plane inside this Jupyter server. */
export class GpulayerAPI implements IGpulayerAPI {
  constructor(
    readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  private get<T>(path: string, signal?: AbortSignal): Promise<T> {
    return must(requestAPI<T>(path, { method: 'GET', signal }, this.settings));
  }

  health(): Promise<IHealth> {
    return this.get<IHealth>('health');
  }

  async jobs(q: IGpulayerAPI.IJobQuery = {}): Promise<IJob[]> {
    const path = 'jobs' + query({ state: q.state, owner: q.owner, limit: q.limit ?? 200 });
    return (await this.get<IJobList>(path)).jobs;
  }

  job(id: string): Promise<IJob> {
    return this.get<IJob>(`jobs/${seg(id)}`);
  }

  cancel(id: string): Promise<IJob> {
    return must(
      requestAPI<IJob>(`jobs/${seg(id)}/cancel`, { method: 'POST' }, this.settings)
    );
  }

  logs(
    id: string,
    offset: number,
    waitSeconds: number,
    signal?: AbortSignal
  ): Promise<ILogPage> {
    const q = query({ offset, wait: waitSeconds, limit: 1000 });
    return this.get<ILogPage>(`jobs/${seg(id)}/logs${q}`, signal);
  }

  artifacts(id: string): Promise<IArtifactList> {
    return this.get<IArtifactList>(`jobs/${seg(id)}/artifacts`);
  }

  artifactUrl(id: string, name: string): string {
    const path = name.split('/').map(seg).join('/');
    return URLExt.join(this.settings.baseUrl, API_PREFIX, 'jobs', seg(id), 'artifacts', path);
  }

  placement(id: string): Promise<IPlacement> {
    return this.get<IPlacement>(`jobs/${seg(id)}/placement`);
  }

  workers(): Promise<IWorkerList> {
    return this.get<IWorkerList>('workers');
  }

  telemetry(worker: string): Promise<ITelemetry> {
    return this.get<ITelemetry>(`workers/${seg(worker)}/telemetry`);
  }

  metrics(id: string, after: number): Promise<IMetricPage> {
    return this.get<IMetricPage>(`jobs/${seg(id)}/metrics${query({ after })}`);
  }

  async instances(): Promise<IInstance[]> {
    return (await this.get<IInstanceList>('instances')).instances;
  }
}
