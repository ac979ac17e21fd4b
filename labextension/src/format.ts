/**
 * Words and numbers for the panel and the status bar. Pure: no DOM, no network.
 */

import { fill, GLOSSARY } from './glossary';
import { CORES_PER_CARD, formatMib } from './request';
import { Allocation, AllocationReply, Limits, UsageCurrent, UsageReply } from './types';

export { formatMib };

/** '25 %' — rounded to a whole percent. */
export function formatPercent(value: number): string {
  return `${Math.round(value)} %`;
}

/** A number of GiB with at most one decimal and no trailing '.0': '3.1', '4', '0'. */
function gibNumber(mib: number): string {
  const gib = Math.round((mib / 1024) * 10) / 10;
  return Number.isInteger(gib) ? `${gib}` : gib.toFixed(1);
}

/** Used out of a limit in the limit's unit: '3.1/4 GiB', '300/768 MiB'. */
export function formatUsedOf(usedMib: number | null, limitMib: number): string {
  if (limitMib >= 1024) {
    return `${usedMib === null ? '–' : gibNumber(usedMib)}/${gibNumber(limitMib)} GiB`;
  }
  return `${usedMib === null ? '–' : Math.round(usedMib)}/${Math.round(limitMib)} MiB`;
}

/** '25 % of a card', '1 whole card', '2 whole cards'. */
export function describeShare(cores: number): string {
  if (cores < CORES_PER_CARD) {
    return `${cores} % of a card`;
  }
  const cards = Math.floor(cores / CORES_PER_CARD);
  return `${cards} whole card${cards > 1 ? 's' : ''}`;
}

/** The short compute label the status bar starts with: '25 %' or '2 cards'. */
export function shortShare(cores: number): string {
  if (cores < CORES_PER_CARD) {
    return `${cores} %`;
  }
  const cards = Math.floor(cores / CORES_PER_CARD);
  return `${cards} card${cards > 1 ? 's' : ''}`;
}

/** 'card 1' or 'cards 0, 3'. */
export function describeCards(indices: (number | null)[]): string {
  const shown = indices.map(i => (i === null ? '?' : String(i))); // a source may not know a card's index
  return shown.length === 1 ? `card ${shown[0]}` : `cards ${shown.join(', ')}`;
}

/** The model names of an allocation, deduplicated: 'A100-SXM4-80GB'. */
export function describeModels(allocation: Allocation): string {
  const models = Array.from(new Set(allocation.cards.map(c => c.model).filter(Boolean)));
  return models.join(', ') || 'GPU';
}

/**
 * "MIG 2g.10gb on GPU 0 (isolated)" when the allocation is a hardware-isolated MIG slice, else null
 * (the glossary's words, as the widgets say it).
 */
export function describeIsolation(allocation: Allocation): string | null {
  const slice = allocation.cards.find(c => c.migProfile);
  if (!slice) {
    return null;
  }
  const gpu = slice.index === null ? 'a GPU' : `GPU ${slice.index}`;
  return fill(GLOSSARY.isolation.title, { profile: slice.migProfile ?? '', gpu });
}

/**
 * "the whole slice: 28 % of the card's compute, 10 GiB" — a MIG slice's real size (the holder
 * gets all of it, whatever share it asked for), else null.
 */
export function describeSliceSize(allocation: Allocation): string | null {
  const slice = allocation.cards.find(c => c.migProfile);
  if (!slice) {
    return null;
  }
  return fill(GLOSSARY.isolation.size, { cores: slice.cores, memory: formatMib(slice.memoryMib) });
}

/**
 * Fractions (0..1) of the cards' compute and memory the allocation holds, for the
 * allocation card's bars. Whole cards hold everything of each card.
 */
export function allocationFractions(allocation: Allocation): { compute: number; memory: number } {
  const cards = allocation.cards.length || 1;
  const totalMemory = allocation.cards.reduce((sum, c) => sum + (c.memoryTotalMib || 0), 0);
  return {
    compute: clamp01(allocation.cores / (CORES_PER_CARD * cards)),
    memory: totalMemory > 0 ? clamp01(allocation.memoryMib / totalMemory) : 0
  };
}

/**
 * The status bar's one line: what is used against the share, for compute and memory alike
 * ('vGPU 19/25 % · 3.1/4 GiB'; '–' before a sample). Whole cards and a MIG slice (whose compute
 * nobody measures) are named instead of a compute share: 'vGPU 2 cards · …', 'vGPU MIG 2g.10gb · …'.
 */
export function statusSummary(
  allocation: AllocationReply | null,
  usage: Pick<UsageReply, 'state' | 'limits' | 'current'> | null
): string {
  if (allocation === null) {
    return 'vGPU …';
  }
  if (allocation.state === 'none') {
    return 'vGPU: none';
  }
  if (allocation.state === 'unreachable' || allocation.allocation === null) {
    return 'vGPU: unreachable';
  }
  const mine = allocation.allocation;
  const limits: Limits = usage?.limits ?? { cores: mine.cores, memoryMib: mine.memoryMib };
  const live = usage && (usage.state === 'live' || usage.state === 'stale') ? usage.current : null;
  const memory = formatUsedOf(live ? live.memoryUsedMib : null, limits.memoryMib);
  const slice = mine.cards.find(c => c.migProfile)?.migProfile;
  if (slice) {
    return `vGPU MIG ${slice} · ${memory}`;
  }
  if (limits.cores >= CORES_PER_CARD) {
    return `vGPU ${shortShare(limits.cores)} · ${memory}`;
  }
  const used = live && live.utilizationMeasured !== false ? `${Math.round(live.utilizationPercent)}` : '–';
  return `vGPU ${used}/${limits.cores} % · ${memory}`;
}

/** What holds the notebook to its share, in words: the backend, or why there is none to name. */
export function describeEnforcement(enforcement: string): string {
  const words = GLOSSARY.enforcement;
  if (enforcement === 'none' || enforcement === 'mig') {
    return words[enforcement];
  }
  return fill(words.backend, { backend: enforcement });
}

/** The status bar's tooltip: the long form of the summary. */
export function statusTooltip(
  allocation: AllocationReply | null,
  usage: Pick<UsageReply, 'state' | 'limits' | 'current' | 'message'> | null
): string {
  if (allocation === null) {
    return 'vGPU: loading';
  }
  if (allocation.state !== 'allocated' || allocation.allocation === null) {
    return allocation.message || (allocation.state === 'none' ? 'No vGPU in this session' : 'vGPU metrics unreachable');
  }
  const mine = allocation.allocation;
  const where = `${describeModels(mine)} ${describeCards(mine.cards.map(c => c.index))} on ${mine.node}`;
  const current: UsageCurrent | null = usage?.current ?? null;
  const now = !current
    ? ''
    : current.utilizationMeasured === false
      ? `; now ${formatMib(current.memoryUsedMib)} memory, compute ${formatCompute(current)}`
      : `; now ${formatCompute(current)} compute, ${formatMib(current.memoryUsedMib)} memory`;
  const stale = usage && usage.state === 'stale' ? ' (stale)' : '';
  return `vGPU: ${describeShare(mine.cores)} with ${formatMib(mine.memoryMib)}, ${where}${now}${stale}`;
}

/** The compute in use now: a percentage, or "not available" where it is not measured (a MIG slice). */
export function formatCompute(current: UsageCurrent): string {
  return current.utilizationMeasured === false ? GLOSSARY.charts.notMeasured : formatPercent(current.utilizationPercent);
}

export function clamp01(value: number): number {
  if (!Number.isFinite(value)) {
    return 0;
  }
  return Math.min(1, Math.max(0, value));
}
