import { alignedData, chartOptions, suggestLog } from '../chart-options';
import type { IJob } from '../contracts';
import { firstLine, GPU_HINT, jobTitle, waitNote, WORKER_HINT } from '../job-text';
import { job, withGpus } from './fake-api';

function withSpec(j: IJob, spec: Partial<IJob['spec']>): IJob {
  return { ...j, spec: { ...j.spec, ...spec } };
}

const cell = (source: string, session: string | null = null) => ({
  source,
  session,
  push: null,
  push_blob: null,
  pull: []
});

describe('job titles', () => {
  it('names a cell job by its session and first line, not by its id', () => {
    const inSession = withSpec(job('c0ffee000001', 'running'), {
      kind: 'cell',
      command: null,
      cell: cell('\n\n# fine-tune the head\nmodel.fit(x)\n', 'train')
    });
    expect(jobTitle(inSession)).toBe('train: # fine-tune the head');
    const fresh = withSpec(job('c0ffee000002', 'queued'), {
      kind: 'cell',
      command: null,
      cell: cell('import torch\nprint(torch.cuda.is_available())')
    });
    expect(jobTitle(fresh)).toBe('cell: import torch');
  });

  it("prefers the job's own name, and cuts long titles with an ellipsis", () => {
    const named = withSpec(job('a1', 'queued'), {
      kind: 'cell',
      name: 'warm-up',
      cell: cell('x = 1')
    });
    expect(jobTitle(named)).toBe('warm-up');
    const long = withSpec(job('a2', 'queued'), { shell: 'echo ' + 'x'.repeat(100), command: null });
    expect(jobTitle(long)).toHaveLength(60);
    expect(jobTitle(long).endsWith('…')).toBe(true);
  });

  it('names commands, sessions and functions by what they run; the id only as a last resort', () => {
    expect(jobTitle(withSpec(job('a3', 'queued'), { command: ['python', 'train.py'] }))).toBe(
      'python train.py'
    );
    const session = withSpec(job('a4', 'running'), {
      kind: 'session',
      command: null,
      session: { name: 'train', idle_timeout: null, relay: false }
    });
    expect(jobTitle(session)).toBe('session train');
    const fn = withSpec(job('a5', 'running'), {
      kind: 'function',
      command: null,
      function: { name: 'square', format: 1, python: '3.11', payload: null, payload_blob: null, calls: 1, retry_exceptions: false }
    });
    expect(jobTitle(fn)).toBe('square()');
    expect(jobTitle(withSpec(job('a6', 'queued'), { command: null }))).toBe('a6');
  });

  it('skips blank lines and a magic line when it looks for the first line', () => {
    expect(firstLine('\n  \n%%gpulayer --gpus 1\n  x = 2  \n')).toBe('x = 2');
    expect(firstLine('   \n')).toBe('');
  });
});

describe('why a job waits', () => {
  it('says an unsatisfiable job cannot start, and what to do about it', () => {
    const never = withGpus(
      job('n1', 'queued', {
        unsatisfiable: true,
        reason: 'unsatisfiable: no registered worker could ever run this job'
      }),
      1
    );
    expect(waitNote(never)).toEqual({
      kind: 'unsatisfiable',
      text: `cannot start: unsatisfiable: no registered worker could ever run this job; ${GPU_HINT}`
    });
    const noGpu = job('n2', 'queued', { unsatisfiable: true, reason: 'unsatisfiable: x' });
    expect(waitNote(noGpu)?.text).toContain(WORKER_HINT);
  });

  it("gives any other queued job the control plane's reason, and no note once it left the queue", () => {
    expect(waitNote(job('q1', 'queued', { unsatisfiable: false, reason: 'waiting for placement' }))).toEqual({
      kind: 'queued',
      text: 'waiting for placement'
    });
    expect(waitNote(job('r1', 'running', { unsatisfiable: false, reason: 'placed on local-1' }))).toBeNull();
  });
});

describe('training chart scale', () => {
  const losses = (values: (number | null)[]) => ({
    x: values.map((_, i) => i),
    series: [{ label: 'train/loss', unit: '', values }]
  });

  it('suggests a log scale when positive values span two decades', () => {
    expect(suggestLog(losses([2.3, 0.5, 0.02, 0.004]))).toBe(true);
    expect(suggestLog(losses([1, 0.5, 0.33, 0.25]))).toBe(false);
    expect(suggestLog(losses([1, 0, 0.001]))).toBe(false); // a zero has no logarithm
  });

  it('draws a log10 y scale when asked, with the values it cannot draw as gaps', () => {
    const data = losses([1, 0.01, 0, null]);
    const log = chartOptions(data, { width: 400, time: false, log: true });
    expect(log.scales?.['']).toEqual({ distr: 3, log: 10 });
    expect(log.axes?.[1].label).toBe('log');
    expect(alignedData(data, true)).toEqual([[0, 1, 2, 3], [1, 0.01, null, null]]);
    const linear = chartOptions(data, { width: 400, time: false, log: false });
    expect(linear.scales?.['']).toEqual({});
    expect(alignedData(data, false)[1]).toEqual([1, 0.01, 0, null]);
  });
});
