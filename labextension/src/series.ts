/**
 * The usage time series behind the charts: a sliding window of samples and the SVG
 * geometry of a line chart. Pure: no DOM, no network.
 */

import { UsagePoint } from './types';

/** Samples inside a sliding time window, ordered by time, one per timestamp. */
export class UsageSeries {
  private _points: UsagePoint[] = [];

  constructor(private _windowSeconds: number) {}

  get windowSeconds(): number {
    return this._windowSeconds;
  }

  set windowSeconds(value: number) {
    this._windowSeconds = value;
    this._trim();
  }

  get points(): readonly UsagePoint[] {
    return this._points;
  }

  get latest(): UsagePoint | null {
    return this._points.length ? this._points[this._points.length - 1] : null;
  }

  /** Add one sample; older or duplicate timestamps (a replayed message) are ignored. */
  add(point: UsagePoint): boolean {
    if (!isPoint(point)) {
      return false;
    }
    const latest = this.latest;
    if (latest && point.t <= latest.t) {
      return false;
    }
    this._points.push({ t: point.t, memoryUsedMib: point.memoryUsedMib, utilizationPercent: point.utilizationPercent });
    this._trim();
    return true;
  }

  /** Merge a history (e.g. from `GET usage?history=`) in time order. */
  addMany(points: readonly UsagePoint[]): number {
    const sorted = points.filter(isPoint).sort((a, b) => a.t - b.t);
    let added = 0;
    for (const point of sorted) {
      if (this.add(point)) {
        added += 1;
      }
    }
    return added;
  }

  clear(): void {
    this._points = [];
  }

  private _trim(): void {
    const latest = this.latest;
    if (!latest) {
      return;
    }
    const start = latest.t - this._windowSeconds;
    let drop = 0;
    while (drop < this._points.length && this._points[drop].t < start) {
      drop += 1;
    }
    if (drop) {
      this._points.splice(0, drop);
    }
  }
}

function isPoint(point: UsagePoint | null | undefined): point is UsagePoint {
  return (
    !!point &&
    Number.isFinite(point.t) &&
    Number.isFinite(point.memoryUsedMib) &&
    Number.isFinite(point.utilizationPercent)
  );
}

/** The steps of a chart's top edge within one power of ten: round numbers, none more than 1.5 times the last. */
const NICE_STEPS = [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];

/** The smallest NICE_STEPS times a power of ten that is >= value (value > 0): 11 -> 12, 4.4 -> 5, 27.5 -> 30. */
export function niceCeiling(value: number): number {
  if (!(value > 0) || !Number.isFinite(value)) {
    return 1;
  }
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of NICE_STEPS) {
    if (step * power >= value * (1 - 1e-9)) {
      return step * power;
    }
  }
  return 10 * power;
}

export interface ChartGeometry {
  /** SVG path of the series ('' when empty). */
  path: string;
  /** y of the limit line, null when there is no limit. */
  limitY: number | null;
  /** The value at the top edge. */
  yMax: number;
  /** Time at the left and right edges (unix seconds). */
  t0: number;
  t1: number;
}

/**
 * Geometry of one line chart of `value(point)` over the last `windowSeconds`, ending at
 * the newest sample (the server's clock, so browser clock skew does not matter). The
 * scale always shows the limit with headroom, and anything above it; its top is a round
 * number in the unit the chart is read in (`unit`: 1024 for MiB shown as GiB, so a 10 GiB
 * limit tops at 12 GiB, not at 20,000 MiB = 19.5 GiB).
 */
export function chartGeometry(
  points: readonly UsagePoint[],
  value: (point: UsagePoint) => number,
  options: { windowSeconds: number; width: number; height: number; limit: number | null; unit?: number }
): ChartGeometry {
  const { windowSeconds, width, height, limit } = options;
  const unit = options.unit && options.unit > 0 ? options.unit : 1;
  const t1 = points.length ? points[points.length - 1].t : 0;
  const t0 = t1 - windowSeconds;
  const peak = points.reduce((max, p) => Math.max(max, value(p)), 0);
  const yMax = niceCeiling(Math.max(peak, limit ? limit * 1.1 : 0, unit) / unit) * unit;
  const x = (t: number) => round1(((t - t0) / windowSeconds) * width);
  const y = (v: number) => round1(height - (Math.max(0, v) / yMax) * height);
  const path = points
    .filter(p => p.t >= t0)
    .map((p, i) => `${i === 0 ? 'M' : 'L'}${x(p.t)},${y(value(p))}`)
    .join(' ');
  return { path, limitY: limit ? y(limit) : null, yMax, t0, t1 };
}

function round1(value: number): number {
  return Math.round(value * 10) / 10;
}

/** '2 min', '90 s', '1 h' — the chart window in words. */
export function formatWindow(seconds: number): string {
  if (seconds >= 3600 && seconds % 3600 === 0) {
    return `${seconds / 3600} h`;
  }
  if (seconds >= 60 && seconds % 60 === 0) {
    return `${seconds / 60} min`;
  }
  return `${seconds} s`;
}
