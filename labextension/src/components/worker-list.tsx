// Workers: state, devices with utilization and memory bars, running jobs.

import React from 'react';

import type { IWorker } from '../contracts';
import { jobTitle } from '../job-text';
import { ClusterModel, formatBytes, gpuBars, IGpuBar } from '../model';

function Bar(props: { label: string; percent: number | null; text: string }) {
  const known = props.percent !== null;
  const width = known ? Math.max(0, Math.min(100, props.percent as number)) : 0;
  return (
    <div className="gpulayer-bar" title={`${props.label}: ${props.text}`}>
      <span className="gpulayer-bar-label">{props.label}</span>
      <span className={`gpulayer-bar-track${known ? '' : ' gpulayer-mod-unknown'}`}>
        <span className="gpulayer-bar-fill" style={{ width: `${width}%` }} />
      </span>
      <span className="gpulayer-bar-text">{props.text}</span>
    </div>
  );
}

function Gpu(props: { gpu: IGpuBar }) {
  const g = props.gpu;
  const util = g.utilizationPercent;
  const mem = g.memoryUsedBytes;
  const memPercent = mem === null || !g.memoryBytes ? null : (100 * mem) / g.memoryBytes;
  return (
    <li className="gpulayer-gpu" data-gpu-index={g.index}>
      <div className="gpulayer-gpu-name">
        GPU {g.index}: {g.name}
      </div>
      <Bar label="util" percent={util} text={util === null ? 'no reading' : `${util.toFixed(0)}%`} />
      <Bar
        label="mem"
        percent={memPercent}
        text={mem === null ? formatBytes(g.memoryBytes) : `${formatBytes(mem)} / ${formatBytes(g.memoryBytes)}`}
      />
    </li>
  );
}

function Worker(props: { worker: IWorker; model: ClusterModel }) {
  const w = props.worker;
  const running = props.model.jobsOn(w);
  return (
    <li className="gpulayer-worker" data-worker={w.name}>
      <div className="gpulayer-worker-head">
        <span className="gpulayer-worker-name">{w.name}</span>
        <span className={`gpulayer-state gpulayer-state-${w.state}`}>{w.state}</span>
      </div>
      <div className="gpulayer-worker-meta">
        {w.devices.length} GPU{w.devices.length === 1 ? '' : 's'} · {w.cpus} CPUs ·{' '}
        {formatBytes(w.memory_bytes)} · {w.running_tasks.length}/{w.slots} tasks
      </div>
      {w.devices.length > 0 && (
        <ul className="gpulayer-gpus">
          {gpuBars(w).map(g => (
            <Gpu key={g.index} gpu={g} />
          ))}
        </ul>
      )}
      {running.length > 0 && (
        <div className="gpulayer-worker-running">
          running: {running.map(jobTitle).join(', ')}
        </div>
      )}
    </li>
  );
}

export function WorkerList(props: { model: ClusterModel }) {
  const workers = props.model.workers;
  if (!workers.length) {
    return (
      <div className="gpulayer-empty">
        No workers yet. Start one with <code>gpulayer join URL --token T</code>.
      </div>
    );
  }
  return (
    <ul className="gpulayer-workers">
      {workers.map(w => (
        <Worker key={w.id} worker={w} model={props.model} />
      ))}
    </ul>
  );
}
