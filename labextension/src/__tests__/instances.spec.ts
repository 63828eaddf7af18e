import { ApiError } from '../api';
import { formatMoney, instanceFacts, instanceNote, provisioningText } from '../instances';
import { waitNote } from '../job-text';
import { ClusterModel } from '../model';
import { FakeAPI, instance, job, withGpus } from './fake-api';

const SLURM_PENDING = 'slurm job 1234 pending (Resources) in partition gpu';

describe('instances in the sidebar', () => {
  it('shows provider, offer, GPUs, age and cost the way `gpulayer instances` does', () => {
    const ready = instance('1a2b3c4d', {
      state: 'ready',
      gpus: 2,
      age_seconds: 245,
      cost: 0.245,
      price_per_hour: 3.6
    });
    expect(instanceFacts(ready)).toBe('hpc · gpu · 2 GPUs · 4m05s · $0.2450 ($3.60/h)');
    const gang = instance('5e6f', { nodes: 2, gpus: 1, age_seconds: 12.34 });
    expect(instanceFacts(gang)).toBe('hpc · gpu · 2 nodes · 1 GPU · 12.3s · free');
    expect([0.0123, 1.5, 12].map(formatMoney)).toEqual(['$0.0123', '$1.50', '$12.00']);
  });

  it("says the provider's word while an instance comes up, and why it ended once it has", () => {
    const pending = instance('a', { detail: SLURM_PENDING, reason: 'for jobs 9f8e7d' });
    expect(instanceNote(pending)).toBe(SLURM_PENDING);
    const gone = instance('b', {
      state: 'gone',
      detail: 'slurm job 1234 running in partition gpu',
      reason: 'idle for 601s (idle_timeout 600s)'
    });
    expect(instanceNote(gone)).toBe('idle for 601s (idle_timeout 600s)');
  });

  it("gives a queued job's card and view its provisioning progress, as explain says it", () => {
    const waiting = withGpus(
      job('j1', 'queued', {
        reason: 'no registered worker fits',
        provisioning: { instance_id: '1a2b3c4d', provider: 'hpc', state: 'provisioning', detail: SLURM_PENDING }
      }),
      1
    );
    const text = `provisioning: ${SLURM_PENDING} (instance 1a2b3c4d on hpc)`;
    expect(provisioningText(waiting)).toBe(text);
    expect(waitNote(waiting)).toEqual({ kind: 'provisioning', text });
    // once placed, the note goes: the instance did its part
    expect(waitNote({ ...waiting, state: 'running' })).toBeNull();
    expect(provisioningText(job('j2', 'queued', { provisioning: null }))).toBeNull();
  });

  it('polls instances with workers and jobs', async () => {
    const api = new FakeAPI();
    api.instanceList = [instance('1a2b3c4d', { state: 'booting' }), instance('0f0f0f0f', { state: 'gone' })];
    const model = new ClusterModel({ api, auto: false });
    await model.refresh();
    expect(model.instances.map(i => [i.id, i.state])).toEqual([
      ['1a2b3c4d', 'booting'],
      ['0f0f0f0f', 'gone']
    ]);
    expect(api.calls).toContain('instances');
    api.instanceList = [];
    await model.refresh();
    expect(model.instances).toEqual([]);
    model.dispose();
  });

  it('shows no instances, and no problem, with a control plane from before providers', async () => {
    const api = new FakeAPI();
    api.instanceList = null; // GET instances answers 404
    const model = new ClusterModel({ api, auto: false });
    await model.refresh();
    expect(model.problem).toBeNull();
    expect(model.loaded).toBe(true);
    expect(model.instances).toEqual([]);
    model.dispose();
  });

  it('reports any other failure to read instances as a problem', async () => {
    const api = new FakeAPI();
    const model = new ClusterModel({ api, auto: false });
    api.instances = async () => {
      throw new ApiError(403, 'forbidden', 'your token may not read instances');
    };
    await expect(model.refresh()).rejects.toThrow('may not read instances');
    expect(model.problem).toEqual({ code: 'forbidden', message: 'your token may not read instances' });
    model.dispose();
  });
});
