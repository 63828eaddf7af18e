// Status-bar item: GPUs busy / total.

import { ReactWidget } from '@jupyterlab/ui-components';
import React from 'react';

import { useChanged } from './components/use-changed';
import { ClusterModel } from './model';

function Status(props: { model: ClusterModel; onClick: () => void }) {
  const { model } = props;
  useChanged(model.changed);
  const text = model.problem ? 'GPUs: -' : `GPUs ${model.gpus.busy}/${model.gpus.total}`;
  return (
    <span
      className="gpulayer-status-item"
      title="gpulayer: GPUs held by placed or running jobs / GPUs of workers that are up"
      onClick={props.onClick}
    >
      {text}
    </span>
  );
}

export class GpuStatus extends ReactWidget {
  constructor(
    private readonly model: ClusterModel,
    private readonly onClick: () => void
  ) {
    super();
    this.addClass('gpulayer-status');
  }

  render(): JSX.Element {
    return <Status model={this.model} onClick={this.onClick} />;
  }
}
