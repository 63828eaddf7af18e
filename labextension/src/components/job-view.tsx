// One job in the main area: state, pending reasons, live logs, artifacts, charts.

import { ReactWidget } from '@jupyterlab/ui-components';
import React from 'react';

import type { IGpulayerAPI } from '../api';
import { jobTitle, waitNote } from '../job-text';
import {
  elapsedSeconds,
  formatBytes,
  formatDuration,
  isTerminal,
  JobModel,
  LogFollower
} from '../model';
import { LogView } from './log-view';
import { MetricChart } from './metric-chart';
import { useChanged, useTick } from './use-changed';

function JobDetails(props: { model: JobModel; follower: LogFollower }) {
  const { model } = props;
  useChanged(model.changed);
  const now = useTick(1000);
  const job = model.job;
  if (!job) {
    return (
      <div className="gpulayer-job-view-body">
        {model.problem ? <div className="gpulayer-problem">{model.problem.message}</div> : 'Loading…'}
      </div>
    );
  }
  const task = job.tasks[job.tasks.length - 1];
  const gpus = task?.gpu_indices.length ? ` (GPUs ${task.gpu_indices.join(', ')})` : '';
  const note = waitNote(job);
  const never = note?.kind === 'unsatisfiable';
  return (
    <div className="gpulayer-job-view-body" data-job-id={job.id} data-state={job.state}>
      <div className="gpulayer-job-view-head">
        <h2 title={`job ${job.id}`}>{jobTitle(job)}</h2>
        <span className={`gpulayer-state gpulayer-state-${never ? 'unsatisfiable' : job.state}`}>
          {never ? 'unsatisfiable' : job.state}
        </span>
        {!isTerminal(job.state) && (
          <button
            className="gpulayer-cancel jp-mod-styled jp-mod-warn"
            disabled={model.cancelling}
            onClick={() => void model.cancel()}
          >
            Cancel
          </button>
        )}
      </div>
      <div className="gpulayer-job-view-meta">
        job {job.id} · {job.owner} · {formatDuration(elapsedSeconds(job, now))}
        {job.worker_name && ` · on ${job.worker_name}${gpus}`}
        {job.exit_code !== null && ` · exit ${job.exit_code}`}
      </div>
      {note ? (
        <div className={`gpulayer-job-reason gpulayer-mod-${note.kind}`}>{note.text}</div>
      ) : (
        job.reason &&
        job.reason !== job.state && <div className="gpulayer-job-reason">{job.reason}</div>
      )}
      {model.problem && <div className="gpulayer-problem">{model.problem.message}</div>}
      {job.state === 'queued' && job.pending_reasons.length > 0 && (
        <section className="gpulayer-pending">
          <h3>Why it waits</h3>
          <ul>
            {job.pending_reasons.map((r, i) => (
              <li key={i} className="gpulayer-pending-reason">
                {r}
              </li>
            ))}
          </ul>
        </section>
      )}
      <section>
        <h3>Logs</h3>
        <LogView follower={props.follower} />
      </section>
      <section className="gpulayer-artifacts">
        <h3>Artifacts</h3>
        {model.artifacts.length === 0 ? (
          <div className="gpulayer-empty">None yet.</div>
        ) : (
          <ul>
            {model.artifacts.map(a => (
              <li key={a.name}>
                <a href={model.api.artifactUrl(job.id, a.name)} download>
                  {a.name}
                </a>{' '}
                <span className="gpulayer-dim">{formatBytes(a.size)}</span>
              </li>
            ))}
          </ul>
        )}
      </section>
      {model.training.series.length > 0 && (
        <section className="gpulayer-training">
          <h3>Training</h3>
          <MetricChart data={model.training} time={false} logToggle />
          <div className="gpulayer-dim">
            What the program logged (a Trainer's log points, or lines of $GPULAYER_METRICS_FILE),
            over steps.
          </div>
        </section>
      )}
      <section>
        <h3>Metrics</h3>
        <MetricChart data={model.chart} />
        <div className="gpulayer-dim">
          From the worker's heartbeat readings (task CPU and memory, GPU utilization where the
          device reports it).
        </div>
      </section>
    </div>
  );
}

/** The main-area widget of one job; it owns the job's poll and its log follower. */
export class JobView extends ReactWidget {
  constructor(options: JobView.IOptions) {
    super();
    this.jobId = options.jobId;
    this.id = JobView.idFor(options.jobId);
    this.addClass('gpulayer-job-view');
    this.title.label = `Job ${options.jobId}`;
    this.title.closable = true;
    this.model = new JobModel({ api: options.api, jobId: options.jobId });
    this.follower = new LogFollower({ api: options.api, jobId: options.jobId });
    void this.follower.follow();
    this.model.changed.connect(() => {
      const job = this.model.job;
      this.title.label = job ? jobTitle(job) : `Job ${options.jobId}`;
      this.title.caption = `gpulayer job ${options.jobId}`;
    });
  }

  readonly jobId: string;
  readonly model: JobModel;
  readonly follower: LogFollower;

  render(): JSX.Element {
    return <JobDetails model={this.model} follower={this.follower} />;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.follower.stop();
    this.model.dispose();
    super.dispose();
  }
}

export namespace JobView {
  export interface IOptions {
    api: IGpulayerAPI;
    jobId: string;
  }

  export function idFor(jobId: string): string {
    return `gpulayer-job-${jobId}`;
  }
}
