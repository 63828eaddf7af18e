import { ServerConnection } from '@jupyterlab/services';

import { ApiError, GpulayerAPI, requestAPI } from '../api';

interface ISeen {
  url: string;
  method: string;
  headers: Headers;
}

/** Jupyter's connection settings over a fetch that answers from `reply`. */
function settings(reply: (req: Request) => Response | Promise<Response>, seen: ISeen[] = []) {
  return ServerConnection.makeSettings({
    baseUrl: 'http://lab.test/a%40b/',
    token: 'jupyter-token',
    appendToken: false,
    fetch: async (input: RequestInfo | URL, init?: RequestInit) => {
      const req = new Request(input as RequestInfo, init);
      // ServerConnection appends a cache-busting timestamp to every URL.
      seen.push({ url: req.url.replace(/[?&]\d{10,}$/, ''), method: req.method, headers: req.headers });
      return reply(req);
    },
    Request,
    Headers
  } as Partial<ServerConnection.ISettings>);
}

const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });

describe('requestAPI', () => {
  it("joins the API prefix to Jupyter's base URL and sends Jupyter's token", async () => {
    const seen: ISeen[] = [];
    const s = settings(() => json(200, { api_version: 'x', workers: [] }), seen);
    const got = await requestAPI<{ workers: unknown[] }>('workers', {}, s);
    expect(got).toEqual({ api_version: 'x', workers: [] });
    expect(seen[0].url).toBe('http://lab.test/a%40b/gpulayer/api/v1/workers');
    expect(seen[0].headers.get('Authorization')).toBe('token jupyter-token');
  });

  it('raises the server error body as an ApiError with its code', async () => {
    const s = settings(() => json(409, { code: 'invalid_transition', message: 'already ended', field: null }));
    await expect(requestAPI('jobs/x/cancel', { method: 'POST' }, s)).rejects.toMatchObject({
      status: 409,
      code: 'invalid_transition',
      message: 'already ended'
    });
  });

  it('says the server extension is missing when the route is not there at all', async () => {
    const s = settings(() => new Response('<html>404 : Not Found</html>', { status: 404, headers: { 'Content-Type': 'text/html' } }));
    const err = (await requestAPI('health', {}, s).catch(e => e)) as ApiError;
    expect(err).toBeInstanceOf(ApiError);
    expect(err.code).toBe('extension_missing');
    expect(err.message).toMatch(/server extension is not enabled/);
  });

  it('says the server is unreachable when fetch itself fails', async () => {
    const s = settings(() => {
      throw new TypeError('fetch failed');
    });
    await expect(requestAPI('health', {}, s)).rejects.toMatchObject({ code: 'unreachable' });
  });

  it('answers null for 204', async () => {
    const s = settings(() => new Response(null, { status: 204 }));
    expect(await requestAPI('jobs/x/wait', {}, s)).toBeNull();
  });
});

describe('GpulayerAPI', () => {
  it('builds each route with its query and escapes ids', async () => {
    const seen: ISeen[] = [];
    const s = settings(req => {
      if (req.url.includes('/logs')) {
        return json(200, { lines: [], next_offset: 7, complete: false });
      }
      return json(200, { jobs: [], id: 'x', state: 'cancelled' });
    }, seen);
    const api = new GpulayerAPI(s);
    await api.jobs({ state: 'queued', owner: 'ada lovelace' });
    await api.logs('j/1', 7, 25);
    await api.cancel('j1');
    expect(seen.map(r => `${r.method} ${r.url.replace('http://lab.test/a%40b/gpulayer/api/v1/', '')}`)).toEqual([
      'GET jobs?state=queued&owner=ada%20lovelace&limit=200',
      'GET jobs/j%2F1/logs?offset=7&wait=25&limit=1000',
      'POST jobs/j1/cancel'
    ]);
    expect(api.artifactUrl('j1', 'plots/loss.png')).toBe(
      'http://lab.test/a%40b/gpulayer/api/v1/jobs/j1/artifacts/plots/loss.png'
    );
  });
});
