/**
 * The live usage charts, drawn the same in the lab panel and the notebook widgets: one chart
 * per quantity (memory used in MiB/GiB, compute used in % of the card), each with its unit,
 * your share as a dashed line and a labelled time axis. DOM only; geometry from series.ts.
 */

import { h, s } from './dom';
import { formatCompute, formatMib, formatPercent, formatUsedOf } from './format';
import { fill, GLOSSARY } from './glossary';
import { chartGeometry, formatWindow } from './series';
import { UsagePoint, UsageReply } from './types';

type UsageFacts = Pick<UsageReply, 'state' | 'message' | 'limits' | 'current'>;

const CHART_WIDTH = 300;
const CHART_HEIGHT = 70;

/** The status line over the charts ('' when live). */
export function usageStatus(usage: UsageFacts | null): string {
  const words = GLOSSARY.charts;
  if (usage === null) {
    return words.waiting;
  }
  switch (usage.state) {
    case 'unreachable':
      return `${words.unreachable}${usage.message ? `: ${usage.message}` : ''}`;
    case 'stale':
      return `${words.stale}${usage.message ? ` (${usage.message})` : ''}`;
    case 'none':
      return usage.message || 'No usage data';
    default:
      return '';
  }
}

export function renderUsage(usage: UsageFacts | null, points: readonly UsagePoint[], windowSeconds: number): HTMLElement[] {
  const limits = usage?.limits ?? null;
  const current = usage?.current ?? null;
  const status = usageStatus(usage);
  // a MIG slice: nothing measures its compute (the history holds 0s nobody measured): said, not drawn
  const measured = current?.utilizationMeasured !== false;
  const children: HTMLElement[] = [h('h3', {}, 'Usage')];
  if (status) {
    children.push(
      h('p', { class: `jp-vgpu-usage-status jp-vgpu-usage-${usage?.state ?? 'loading'}`, role: 'status' }, status)
    );
  }
  const memoryLimit = limits?.memoryMib ?? null;
  const memoryPeak = points.reduce((max, p) => Math.max(max, p.memoryUsedMib), 0);
  children.push(
    chart(
      'memory',
      GLOSSARY.charts.memory,
      points,
      p => p.memoryUsedMib,
      memoryLimit,
      current && limits ? formatUsedOf(current.memoryUsedMib, limits.memoryMib) : current ? formatMib(current.memoryUsedMib) : '–',
      formatMib,
      windowSeconds,
      // the scale's top is a round number of GiB where the chart reads in GiB
      Math.max(memoryLimit ?? 0, memoryPeak) >= 1024 ? 1024 : 1
    ),
    measured
      ? chart(
          'utilization',
          GLOSSARY.charts.compute,
          points,
          p => p.utilizationPercent,
          limits?.cores ?? null,
          current ? fill(GLOSSARY.charts.computeNow, { value: formatCompute(current) }) : '–',
          formatPercent,
          windowSeconds,
          1
        )
      : notMeasured(current)
  );
  return children;
}

/**
 * The compute "chart" where nothing measures compute (a MIG slice): its title, "not available",
 * and why, in place of an empty frame with a share line.
 */
function notMeasured(current: UsageFacts['current']): HTMLElement {
  const why = GLOSSARY.charts.notMeasuredWhy;
  return h(
    'figure',
    { class: 'jp-vgpu-chart jp-vgpu-chart-utilization jp-vgpu-chart-not-measured' },
    h(
      'figcaption',
      {},
      h('span', { class: 'jp-vgpu-chart-title' }, GLOSSARY.charts.compute),
      h('span', { class: 'jp-vgpu-chart-now', title: why }, current ? formatCompute(current) : '–')
    ),
    h('p', { class: 'jp-vgpu-chart-note' }, why.charAt(0).toUpperCase() + why.slice(1) + '.')
  );
}

function chart(
  kind: string,
  title: string,
  points: readonly UsagePoint[],
  value: (p: UsagePoint) => number,
  limit: number | null,
  now: string,
  unit: (value: number) => string,
  windowSeconds: number,
  scaleUnit: number
): HTMLElement {
  const geometry = chartGeometry(points, value, {
    windowSeconds,
    width: CHART_WIDTH,
    height: CHART_HEIGHT,
    limit,
    unit: scaleUnit
  });
  const svg = s(
    'svg',
    {
      class: 'jp-vgpu-chart-svg',
      viewBox: `0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`,
      preserveAspectRatio: 'none',
      role: 'img',
      'aria-label': `${title} over the last ${formatWindow(windowSeconds)}: now ${now}`
    },
    s('rect', { class: 'jp-vgpu-chart-bg', width: CHART_WIDTH, height: CHART_HEIGHT }),
    geometry.limitY !== null
      ? s('line', { class: 'jp-vgpu-chart-limit', x1: 0, x2: CHART_WIDTH, y1: geometry.limitY, y2: geometry.limitY })
      : null,
    s('path', { class: 'jp-vgpu-chart-line', d: geometry.path, 'data-points': points.length })
  );
  return h(
    'figure',
    { class: `jp-vgpu-chart jp-vgpu-chart-${kind}` },
    h(
      'figcaption',
      {},
      h('span', { class: 'jp-vgpu-chart-title' }, title),
      h('span', { class: 'jp-vgpu-chart-now' }, now)
    ),
    svg,
    h(
      'div',
      { class: 'jp-vgpu-chart-axis' },
      h('span', {}, `−${formatWindow(windowSeconds)}`),
      h('span', {}, 'now')
    ),
    h(
      'div',
      { class: 'jp-vgpu-chart-scale' },
      fill(GLOSSARY.charts.top, { value: unit(geometry.yMax) }),
      limit !== null ? ` · ${fill(GLOSSARY.charts.limit, { value: unit(limit) })}` : ''
    )
  );
}
