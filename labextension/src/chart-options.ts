// The uPlot options of a chart, apart from uPlot itself (so jest can check them).

import type uPlot from 'uplot';

import type { ISeriesSet } from './model';

const COLORS = ['#1976d2', '#e65100', '#2e7d32', '#6a1b9a', '#c62828', '#00838f'];

/** How a chart is drawn: time or step on x, a linear or log10 y. */
export interface IChartShape {
  width: number;
  time: boolean;
  log: boolean;
}

/**
 * Whether a log y reads better by default: every value is positive and they span
 * at least two decades (a loss falling from 2.3 to 0.004 is a flat line on a
 * linear scale).
 */
export function suggestLog(data: ISeriesSet): boolean {
  let min = Infinity;
  let max = -Infinity;
  for (const s of data.series) {
    for (const v of s.values) {
      if (v !== null) {
        min = Math.min(min, v);
        max = Math.max(max, v);
      }
    }
  }
  return min > 0 && min !== Infinity && max / min >= 100;
}

/** The data as uPlot takes it; on a log scale a value <= 0 (no logarithm) is a gap. */
export function alignedData(data: ISeriesSet, log: boolean): (number | null)[][] {
  const ys = data.series.map(s =>
    log ? s.values.map(v => (v !== null && v > 0 ? v : null)) : s.values
  );
  return [data.x, ...ys];
}

/** uPlot options: one y scale per unit (the first on the left, a second on the right). */
export function chartOptions(data: ISeriesSet, shape: IChartShape): uPlot.Options {
  const units = [...new Set(data.series.map(s => s.unit))];
  const axes: uPlot.Axis[] = [{}];
  units.slice(0, 2).forEach((unit, i) =>
    axes.push({
      scale: unit,
      side: i === 0 ? 3 : 1,
      size: 50,
      label: shape.log ? (unit ? `${unit}, log` : 'log') : unit,
      grid: { show: i === 0 }
    })
  );
  const scales: uPlot.Scales = { x: { time: shape.time } };
  for (const unit of units) {
    scales[unit] = shape.log ? { distr: 3, log: 10 } : {};
  }
  return {
    width: shape.width,
    height: 200,
    scales,
    series: [
      shape.time ? {} : { label: 'step' },
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
