// A job's log, followed live from an offset; a rank filter appears for gang jobs.

import React, { useEffect, useRef, useState } from 'react';

import { LogFollower } from '../model';
import { useChanged } from './use-changed';

export function LogView(props: { follower: LogFollower }) {
  const f = props.follower;
  useChanged(f.changed);
  const [rank, setRank] = useState<number | null>(null);
  const [pinned, setPinned] = useState(true);
  const box = useRef<HTMLPreElement>(null);
  const lines = f.visible(rank);
  useEffect(() => {
    if (pinned && box.current) {
      box.current.scrollTop = box.current.scrollHeight;
    }
  }, [lines.length, pinned]);
  return (
    <div className="gpulayer-logs">
      <div className="gpulayer-logs-bar">
        <span className="gpulayer-logs-status" data-complete={String(f.complete)}>
          {f.complete ? `${f.lines.length} lines, complete` : `following… (${f.lines.length} lines)`}
        </span>
        {f.ranks.length > 0 && (
          <label>
            rank{' '}
            <select
              className="gpulayer-rank-filter"
              value={rank === null ? '' : String(rank)}
              onChange={e => setRank(e.target.value === '' ? null : Number(e.target.value))}
            >
              <option value="">all</option>
              {f.ranks.map(r => (
                <option key={r} value={r}>
                  {r}
                </option>
              ))}
            </select>
          </label>
        )}
        <label>
          <input type="checkbox" checked={pinned} onChange={e => setPinned(e.target.checked)} /> follow
        </label>
      </div>
      {f.problem && <div className="gpulayer-problem">{f.problem.message}</div>}
      <pre className="gpulayer-log-lines" ref={box}>
        {lines.map(l => (
          <div key={l.offset} className={`gpulayer-log-line gpulayer-stream-${l.stream}`}>
            {typeof l.rank === 'number' && <span className="gpulayer-log-rank">[{l.rank}] </span>}
            {l.text}
          </div>
        ))}
      </pre>
    </div>
  );
}
