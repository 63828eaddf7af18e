// Provider instances as the sidebar shows them (the CLI's `gpulayer instances` says
// the same: gpulayer/cli/providers.py): state, age, cost and the provider's own word.

import type { IInstance, IJob } from './contracts';
import { formatDuration } from './model';

/** `$0.0123`: a cost or price in dollars (four decimals below a dollar). */
export function formatMoney(dollars: number): string {
  return dollars < 1 ? `$${dollars.toFixed(4)}` : `$${dollars.toFixed(2)}`;
}

/** Whether an instance still exists (or is on its way) at its provider. */
export function isActive(instance: IInstance): boolean {
  return !['gone', 'lost', 'failed'].includes(instance.state);
}

/** The line under an instance's name: provider and offer, nodes, GPUs, age, cost. */
export function instanceFacts(i: IInstance): string {
  const parts = [`${i.provider} · ${i.offer}`];
  if (i.nodes > 1) {
    parts.push(`${i.nodes} nodes`);
  }
  parts.push(`${i.gpus} GPU${i.gpus === 1 ? '' : 's'}`, formatDuration(i.age_seconds));
  parts.push(i.price_per_hour > 0 ? `${formatMoney(i.cost)} (${formatMoney(i.price_per_hour)}/h)` : 'free');
  return parts.join(' · ');
}

/** What the provider says of it while it comes up; why it ended once it has. */
export function instanceNote(i: IInstance): string {
  const word = isActive(i) ? i.detail ?? i.reason : i.reason ?? i.detail;
  return word ?? '';
}

/**
 * A queued job's provisioning progress, in the words `gpulayer explain` uses:
 * "provisioning: slurm job 1234 pending (Resources) in partition gpu (instance
 * 1a2b3c4d on hpc)"; null for a job no instance is being started for.
 */
export function provisioningText(job: IJob): string | null {
  const p = job.state === 'queued' ? job.provisioning : null;
  if (!p) {
    return null;
  }
  return `provisioning: ${p.detail} (instance ${p.instance_id} on ${p.provider})`;
}
