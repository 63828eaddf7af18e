// The gpulayer panel in Lab's left area: workers, provider instances and jobs.

import { ReactWidget } from '@jupyterlab/ui-components';
import React from 'react';

import { InstanceList } from './components/instance-list';
import { JobList } from './components/job-list';
import { useChanged } from './components/use-changed';
import { WorkerList } from './components/worker-list';
import { ClusterModel } from './model';

function Problem(props: { code: string; message: string }) {
  const title =
    props.code === 'extension_missing'
      ? 'gpulayer server extension missing'
      : props.code === 'unreachable'
        ? 'Jupyter server unreachable'
        : 'gpulayer error';
  return (
    <div className="gpulayer-problem" data-code={props.code}>
      <strong>{title}</strong>
      <div>{props.message}</div>
    </div>
  );
}

function Panel(props: { sidebar: GpulayerSidebar }) {
  const { model } = props.sidebar;
  useChanged(model.changed);
  return (
    <div className="gpulayer-panel" data-loaded={String(model.loaded)}>
      <header className="gpulayer-panel-head">
        <span className="gpulayer-title">GPU layer</span>
        <span className="gpulayer-gpu-summary">
          GPUs {model.gpus.busy}/{model.gpus.total} busy
        </span>
      </header>
      {model.problem && <Problem {...model.problem} />}
      <section className="gpulayer-section">
        <h3>Workers</h3>
        <WorkerList model={model} />
      </section>
      {model.instances.length > 0 && (
        <section className="gpulayer-section gpulayer-instances-section">
          <h3>Instances</h3>
          <InstanceList model={model} />
        </section>
      )}
      <section className="gpulayer-section">
        <h3>Jobs</h3>
        <JobList
          model={model}
          onOpen={id => props.sidebar.options.openJob(id)}
          onCancel={id => void props.sidebar.cancel(id)}
        />
      </section>
    </div>
  );
}

/** The left-area panel. */
export class GpulayerSidebar extends ReactWidget {
  constructor(readonly options: GpulayerSidebar.IOptions) {
    super();
    this.model = options.model;
    this.id = 'gpulayer-sidebar';
    this.addClass('gpulayer-sidebar');
  }

  readonly model: ClusterModel;

  /** Cancel a job, then refresh the lists. */
  async cancel(id: string): Promise<void> {
    try {
      await this.model.api.cancel(id);
    } finally {
      await this.model.refreshNow().catch(() => undefined);
    }
  }

  render(): JSX.Element {
    return <Panel sidebar={this} />;
  }
}

export namespace GpulayerSidebar {
  export interface IOptions {
    model: ClusterModel;
    openJob: (id: string) => void;
  }
}
