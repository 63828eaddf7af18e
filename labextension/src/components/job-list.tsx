// Jobs: filter by state and owner, elapsed time, open, cancel.

import React from 'react';

import { IJob, JOB_STATES, JobState } from '../contracts';
import { jobTitle, waitNote } from '../job-text';
import { ClusterModel, elapsedSeconds, formatDuration, isTerminal } from '../model';
import { useTick } from './use-changed';

function JobRow(props: {
  job: IJob;
  now: number;
  onOpen: (id: string) => void;
  onCancel: (id: string) => void;
}) {
  const j = props.job;
  const gpus = j.spec.resources.gpus;
  // a leading space would be dropped at the start of a flex item: a no-break space is not
  const facts = [
    j.worker_name ? `\u00a0on ${j.worker_name}` : '',
    `\u00a0· ${formatDuration(elapsedSeconds(j, props.now))}`,
    gpus > 0 ? `\u00a0· ${gpus} GPU` : ''
  ].join('');
  const note = waitNote(j);
  const never = note?.kind === 'unsatisfiable';
  const title = jobTitle(j);
  return (
    <li
      className="gpulayer-job"
      data-job-id={j.id}
      data-state={j.state}
      data-unsatisfiable={String(never)}
    >
      <button
        className="gpulayer-job-open"
        title={`Open job ${j.id}: ${title}`}
        onClick={() => props.onOpen(j.id)}
      >
        <span className="gpulayer-job-name">{title}</span>
        <span className={`gpulayer-state gpulayer-state-${never ? 'unsatisfiable' : j.state}`}>
          {never ? 'unsatisfiable' : j.state}
        </span>
      </button>
      <div className="gpulayer-job-meta">
        <span className="gpulayer-job-owner" title={j.owner}>
          {j.owner}
        </span>
        <span className="gpulayer-job-facts">{facts}</span>
      </div>
      {note && (
        <div className={`gpulayer-job-reason gpulayer-mod-${note.kind}`}>{note.text}</div>
      )}
      {!isTerminal(j.state) && (
        <button className="gpulayer-cancel jp-mod-styled" onClick={() => props.onCancel(j.id)}>
          Cancel
        </button>
      )}
    </li>
  );
}

export function JobList(props: {
  model: ClusterModel;
  onOpen: (id: string) => void;
  onCancel: (id: string) => void;
}) {
  const { model } = props;
  const now = useTick(1000);
  const filter = model.filter;
  return (
    <div className="gpulayer-jobs">
      <div className="gpulayer-filters">
        <label className="gpulayer-filter-state-label">
          state{' '}
          <select
            className="gpulayer-filter-state"
            value={filter.state ?? ''}
            onChange={e => void model.setFilter({ state: (e.target.value || null) as JobState | null })}
          >
            <option value="">any</option>
            {JOB_STATES.map(s => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
        </label>
        <label className="gpulayer-filter-owner-label">
          owner{' '}
          <select
            className="gpulayer-filter-owner"
            value={filter.owner ?? ''}
            title={filter.owner ?? 'anyone'}
            onChange={e => void model.setFilter({ owner: e.target.value || null })}
          >
            <option value="">anyone</option>
            {model.owners.map(o => (
              <option key={o} value={o} title={o}>
                {o}
              </option>
            ))}
          </select>
        </label>
      </div>
      {model.jobs.length === 0 ? (
        <div className="gpulayer-empty">No jobs{filter.state || filter.owner ? ' match' : ' yet'}.</div>
      ) : (
        <ul className="gpulayer-job-list">
          {model.jobs.map(j => (
            <JobRow key={j.id} job={j} now={now} onOpen={props.onOpen} onCancel={props.onCancel} />
          ))}
        </ul>
      )}
    </div>
  );
}
