// Provider instances: state (provisioning, booting, ready, idle, terminating, and how
// it ended), provider and offer, age, cost, and the provider's word on it.

import React from 'react';

import type { IInstance } from '../contracts';
import { instanceFacts, instanceNote } from '../instances';
import { ClusterModel } from '../model';

function Instance(props: { instance: IInstance }) {
  const i = props.instance;
  const note = instanceNote(i);
  return (
    <li className="gpulayer-instance" data-instance-id={i.id} data-state={i.state}>
      <div className="gpulayer-instance-head">
        <span className="gpulayer-instance-name" title={i.external_id ?? undefined}>
          {i.workers.length === 1 ? i.workers[0] : `${i.provider}-${i.id}`}
        </span>
        <span className={`gpulayer-state gpulayer-state-${i.state}`}>{i.state}</span>
      </div>
      <div className="gpulayer-instance-meta">{instanceFacts(i)}</div>
      {note && <div className="gpulayer-instance-note">{note}</div>}
    </li>
  );
}

/** The instances the providers run or ran lately; nothing without providers. */
export function InstanceList(props: { model: ClusterModel }) {
  return (
    <ul className="gpulayer-instances">
      {props.model.instances.map(i => (
        <Instance key={i.id} instance={i} />
      ))}
    </ul>
  );
}
