import { chartGeometry, formatWindow, niceCeiling, UsageSeries } from '../src/series';
import { UsagePoint } from '../src/types';

const point = (t: number, memoryUsedMib = 100, utilizationPercent = 10): UsagePoint => ({ t, memoryUsedMib, utilizationPercent });

describe('UsageSeries', () => {
  it('keeps only the window, ending at the newest sample', () => {
    const series = new UsageSeries(10);
    for (let t = 0; t <= 30; t++) {
      series.add(point(t));
    }
    expect(series.points.map(p => p.t)).toEqual([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]);
    series.windowSeconds = 3;
    expect(series.points.map(p => p.t)).toEqual([27, 28, 29, 30]);
  });

  it('ignores replayed, out-of-order and malformed samples', () => {
    const series = new UsageSeries(60);
    expect(series.add(point(5))).toBe(true);
    expect(series.add(point(5))).toBe(false);
    expect(series.add(point(4))).toBe(false);
    expect(series.add({ t: NaN, memoryUsedMib: 1, utilizationPercent: 1 })).toBe(false);
    expect(series.add(null as unknown as UsagePoint)).toBe(false);
    expect(series.points).toHaveLength(1);
  });

  it('merges an unsorted history', () => {
    const series = new UsageSeries(60);
    expect(series.addMany([point(3), point(1), point(2), point(2)])).toBe(3);
    expect(series.latest?.t).toBe(3);
  });
});

describe('chartGeometry', () => {
  it('maps time to x and value to y with the limit in view', () => {
    const points = [point(90, 0), point(95, 2048), point(100, 4096)];
    const g = chartGeometry(points, p => p.memoryUsedMib, { windowSeconds: 10, width: 100, height: 50, limit: 4096 });
    // limit * 1.1 = 4505.6 -> nice ceiling 5000
    expect(g.yMax).toBe(5000);
    expect(g.t0).toBe(90);
    expect(g.t1).toBe(100);
    expect(g.path).toBe('M0,50 L50,29.5 L100,9');
    expect(g.limitY).toBe(9);
  });

  it('rescales when usage goes over the limit', () => {
    const g = chartGeometry([point(1, 0, 70), point(2, 0, 40)], p => p.utilizationPercent, {
      windowSeconds: 1,
      width: 10,
      height: 10,
      limit: 25
    });
    expect(g.yMax).toBe(80);
    expect(g.path).toBe('M0,1.3 L10,5');
  });

  it('tops a chart read in GiB at a round number of GiB', () => {
    // a 10 GiB MIG slice: 11 GiB with headroom -> 12 GiB, not 20,000 MiB (19.5 GiB)
    const points = [point(1, 3072), point(2, 3072)];
    const gib = chartGeometry(points, p => p.memoryUsedMib, { windowSeconds: 1, width: 10, height: 10, limit: 10240, unit: 1024 });
    expect(gib.yMax).toBe(12 * 1024);
    const mib = chartGeometry(points, p => p.memoryUsedMib, { windowSeconds: 1, width: 10, height: 10, limit: 10240 });
    expect(mib.yMax).toBe(12000);
  });

  it('draws nothing without samples', () => {
    const g = chartGeometry([], p => p.t, { windowSeconds: 60, width: 10, height: 10, limit: null });
    expect(g.path).toBe('');
    expect(g.limitY).toBeNull();
  });
});

describe('scales and words', () => {
  it.each([
    [0.3, 0.3],
    [1, 1],
    [1.3, 1.5],
    [2.2, 2.5],
    [4505.6, 5000],
    [110, 120],
    [27.5, 30],
    [7, 8],
    [0, 1]
  ])('niceCeiling(%p) = %p', (value, nice) => {
    expect(niceCeiling(value)).toBeCloseTo(nice);
  });

  it('formats the window', () => {
    expect(formatWindow(120)).toBe('2 min');
    expect(formatWindow(90)).toBe('90 s');
    expect(formatWindow(3600)).toBe('1 h');
  });
});
