// How a job is named and why it waits, in words the sidebar, the job view and the
// tab title share (the CLI and notebooks say the same: gpulayer/client/pending.py).

import type { IJob } from './contracts';
import { provisioningText } from './instances';

/** Longest title before it is cut with an ellipsis. */
export const TITLE_CHARS = 60;

/** What to do about a job that needs GPUs no registered worker has (as pending.py says). */
export const GPU_HINT =
  'join a worker that has them (`gpulayer join URL` on that machine), or try it on' +
  ' simulated GPUs: `gpulayer up --simulated-gpus 1xA100-80GB`';
/** What to do about a job no registered worker could ever run for another reason. */
export const WORKER_HINT =
  'join a worker that has what it needs (`gpulayer join URL` on that machine)';

function clip(text: string, max: number = TITLE_CHARS): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length <= max ? flat : `${flat.slice(0, max - 1)}…`;
}

/** The first line of a cell with something on it (a comment counts: it is often the title). */
export function firstLine(source: string): string {
  const line = source.split('\n').find(l => l.trim() !== '' && !l.trim().startsWith('%%'));
  return line === undefined ? '' : line.trim();
}

/**
 * A job's readable name: its own name when it has one; a cell by its session (or
 * "cell") and its first line; a session by its name; a command by what it runs; a
 * function by the function's name; the id only when there is nothing else.
 */
export function jobTitle(job: IJob): string {
  const spec = job.spec;
  if (spec.name) {
    return clip(spec.name);
  }
  if (spec.cell) {
    const line = firstLine(spec.cell.source);
    return clip(`${spec.cell.session ?? 'cell'}: ${line || '(empty cell)'}`);
  }
  if (spec.session) {
    return clip(`session ${spec.session.name}`);
  }
  if (spec.shell) {
    return clip(spec.shell);
  }
  if (spec.command && spec.command.length) {
    return clip(spec.command.join(' '));
  }
  if (spec.function) {
    return clip(`${spec.function.name}()`);
  }
  return job.id;
}

/** What to do about an unsatisfiable job ('' for any other). */
export function hint(job: IJob): string {
  if (!job.unsatisfiable) {
    return '';
  }
  return job.spec.resources.gpus ? GPU_HINT : WORKER_HINT;
}

/** A job card's line about why it waits: `kind` says how to show it. */
export interface IWaitNote {
  kind: 'unsatisfiable' | 'provisioning' | 'queued';
  text: string;
}

/**
 * Why a queued job waits, in one line (null for any other state): a job a provider
 * is starting an instance for says how far that got; a job no
 * registered worker could ever run says so and what to do about it; any other
 * says the control plane's reason.
 */
export function waitNote(job: IJob): IWaitNote | null {
  if (job.state !== 'queued') {
    return null;
  }
  const provisioning = provisioningText(job);
  if (provisioning) {
    return { kind: 'provisioning', text: provisioning };
  }
  if (job.unsatisfiable) {
    const why = job.reason ?? 'no registered worker could ever run it';
    return { kind: 'unsatisfiable', text: `cannot start: ${why}; ${hint(job)}` };
  }
  return job.reason ? { kind: 'queued', text: job.reason } : null;
}
