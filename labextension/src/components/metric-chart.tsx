// Charts (uPlot) of a job's readings over time, or of its training metrics over steps.

import React, { useEffect, useRef } from 'react';
import uPlot from 'uplot';

import type { ISeriesSet } from '../model';

const COLORS = ['#1976d2', '#e65100', '#2e7d32', '#6a1b9a', '#c62828', '#00838f'];

function options(data: ISeriesSet, width: number, time: boolean): uPlot.Options {
  // One y scale per unit: the first on the left, the second (if any) on the right.
  const units = [...new Set(data.series.map(s => s.unit))];
  const axes: uPlot.Axis[] = [{}];
  units.slice(0, 2).forEach((unit, i) =>
    axes.push({ scale: unit, side: i === 0 ? 3 : 1, size: 50, label: unit, grid: { show: i === 0 } })
  );
  return {
    width,
    height: 200,
    scales: { x: { time } },
    series: [
      time ? {} : { label: 'step' },
      ...data.series.map((s, i) => ({
        label: s.unit ? `${s.label} (${s.unit})` : s.label,
        scale: s.unit,
        stroke: COLORS[i % COLORS.length],
        width: 1.5,
        spanGaps: true
      }))
    ],
    axes
  };
}

function aligned(data: ISeriesSet): uPlot.AlignedData {
  return [data.x, ...data.series.map(s => s.values)] as uPlot.AlignedData;
}

export function MetricChart(props: { data: ISeriesSet; time?: boolean; empty?: string }) {
  const time = props.time ?? true;
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const labels = props.data.series.map(s => s.label).join('|');
  useEffect(() => {
    if (!host.current || !props.data.series.length) {
      return;
    }
    const width = Math.max(300, host.current.clientWidth || 500);
    plot.current = new uPlot(options(props.data, width, time), aligned(props.data), host.current);
    return () => {
      plot.current?.destroy();
      plot.current = null;
    };
    // A new set of series needs a new chart; new points only need setData below.
  }, [labels]);
  useEffect(() => {
    plot.current?.setData(aligned(props.data));
  }, [props.data]);
  if (!props.data.series.length) {
    return (
      <div className="gpulayer-empty gpulayer-no-metrics">
        {props.empty ?? 'No metrics for this job yet.'}
      </div>
    );
  }
  return <div className="gpulayer-chart" ref={host} />;
}
