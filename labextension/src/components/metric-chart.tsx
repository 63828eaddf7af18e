// Charts (uPlot) of a job's readings over time, or of its training metrics over steps.

import React, { useEffect, useRef, useState } from 'react';
import uPlot from 'uplot';

import { alignedData, chartOptions, suggestLog } from '../chart-options';
import type { ISeriesSet } from '../model';

function Chart(props: { data: ISeriesSet; time: boolean; log: boolean }) {
  const { data, time, log } = props;
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const labels = data.series.map(s => s.label).join('|');
  useEffect(() => {
    if (!host.current) {
      return;
    }
    const width = Math.max(300, host.current.clientWidth || 500);
    const aligned = alignedData(data, log) as uPlot.AlignedData;
    plot.current = new uPlot(chartOptions(data, { width, time, log }), aligned, host.current);
    return () => {
      plot.current?.destroy();
      plot.current = null;
    };
    // A new set of series or a new scale needs a new chart; new points only setData below.
  }, [labels, log]);
  useEffect(() => {
    plot.current?.setData(alignedData(data, log) as uPlot.AlignedData);
  }, [data]);
  return <div className="gpulayer-chart" data-scale={log ? 'log' : 'linear'} ref={host} />;
}

/**
 * A chart, or a note when there is nothing to draw. With `logToggle`, a "log
 * scale" checkbox: on by default when the values span two decades or more
 * (`suggestLog`), until the user sets it.
 */
export function MetricChart(props: {
  data: ISeriesSet;
  time?: boolean;
  empty?: string;
  logToggle?: boolean;
}) {
  const [chosen, setChosen] = useState<boolean | null>(null);
  if (!props.data.series.length) {
    return (
      <div className="gpulayer-empty gpulayer-no-metrics">
        {props.empty ?? 'No metrics for this job yet.'}
      </div>
    );
  }
  const log = props.logToggle ? chosen ?? suggestLog(props.data) : false;
  return (
    <div className="gpulayer-chart-box">
      {props.logToggle && (
        <label className="gpulayer-log-scale">
          <input
            type="checkbox"
            checked={log}
            onChange={e => setChosen(e.target.checked)}
          />{' '}
          log scale
        </label>
      )}
      <Chart data={props.data} time={props.time ?? true} log={log} />
    </div>
  );
}
