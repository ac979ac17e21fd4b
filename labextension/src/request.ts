/**
 * Client-side validation of the request form, with the rules of
 * jupyter_vgpu/core/contract.py (`validate_request`, `parse_memory_size`), so the
 * person sees the same refusal before the round trip that the server would give.
 * Pure: no DOM, no network.
 */

import { Allocation, ShareRequestBody } from './types';

/** One vcuda-core is 1 % of one card's compute; a whole card is 100. */
export const CORES_PER_CARD = 100;
/** One vcuda-memory unit is 256 MiB. */
export const MEMORY_UNIT_MIB = 256;
/** No card has more than 512 GiB; a bigger ask is a typo. */
export const MAX_CARD_MEMORY_MIB = 512 * 1024;
const MAX_UNITS_PER_CARD = MAX_CARD_MEMORY_MIB / MEMORY_UNIT_MIB;

/** A request a person can act on, or the reason it can never be valid. */
export type Validation =
  | { ok: true; body: ShareRequestBody; cores: number; memoryUnits: number; summary: string }
  | { ok: false; field: 'cores' | 'memory'; message: string };

const SIZE = /^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$/;
/** MiB per unit; null means "a bare number of 256 MiB units". */
const SIZE_MIB: Record<string, bigint | null> = {
  '': null,
  units: null,
  mib: 1n,
  mi: 1n,
  m: 1n,
  gib: 1024n,
  gi: 1024n,
  g: 1024n,
  tib: 1024n * 1024n,
  ti: 1024n * 1024n
};

export class SizeError extends Error {}

/**
 * vcuda-memory units from '4GiB', '4096MiB', '4Gi' or a bare number of 256 MiB units.
 * Exact decimal arithmetic, as in contract.py: '1.5GiB' is 6 units, '0.1GiB' is refused.
 */
export function parseMemorySize(text: string): number {
  const match = SIZE.exec(text);
  if (!match) {
    throw new SizeError(
      `memory size '${text.trim()}': use e.g. 4GiB, 4096MiB or a number of ${MEMORY_UNIT_MIB} MiB units`
    );
  }
  const [whole, fraction = ''] = match[1].split('.');
  const unit = match[2].toLowerCase();
  if (!(unit in SIZE_MIB)) {
    throw new SizeError(`memory size '${text.trim()}': unknown unit '${match[2]}' (use MiB or GiB)`);
  }
  // number = digits / 10^decimals, exactly
  const digits = BigInt(whole + fraction);
  const denominator = 10n ** BigInt(fraction.length);
  const scale = SIZE_MIB[unit];
  let units: bigint;
  if (scale === null) {
    if (digits % denominator !== 0n) {
      throw new SizeError(
        `memory size '${text.trim()}': a bare number counts ${MEMORY_UNIT_MIB} MiB units and must be whole`
      );
    }
    units = digits / denominator;
  } else {
    const unitDenominator = BigInt(MEMORY_UNIT_MIB) * denominator;
    if ((digits * scale) % unitDenominator !== 0n) {
      throw new SizeError(`memory size '${text.trim()}' is not a multiple of ${MEMORY_UNIT_MIB} MiB`);
    }
    units = (digits * scale) / unitDenominator;
  }
  if (units <= 0n) {
    throw new SizeError(`memory size '${text.trim()}' must be more than zero`);
  }
  if (units > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw new SizeError(`memory size '${text.trim()}' is far more than any card has`);
  }
  return Number(units);
}

/** '4 GiB', '1.5 GiB', '768 MiB' — contract.format_mib. */
export function formatMib(mib: number): string {
  if (mib >= 1024) {
    const gib = mib / 1024;
    return Number.isInteger(gib) ? `${gib} GiB` : `${gib.toFixed(1)} GiB`;
  }
  return `${Math.round(mib)} MiB`;
}

/** A size as the form takes it: '4GiB', '1.5GiB', '768MiB'. */
export function sizeText(mib: number): string {
  return (mib * 10) % 1024 === 0 ? `${mib / 1024}GiB` : `${Math.round(mib)}MiB`;
}

/** What the form suggests (its placeholders): the share held now, else 25 % of a card with 4 GiB. */
export function suggestedShare(allocation: Allocation | null): { cores: string; memory: string } {
  if (!allocation || allocation.cores <= 0) {
    return { cores: '25', memory: '4GiB' };
  }
  if (allocation.cores >= CORES_PER_CARD) {
    return { cores: String(allocation.cores), memory: '' }; // whole cards come with their memory
  }
  return { cores: String(allocation.cores), memory: sizeText(allocation.memoryMib) };
}

/** What a valid request asks for, in words. */
export function describeRequest(cores: number, memoryUnits: number): string {
  if (cores === 0) {
    return 'release the GPU';
  }
  const memory = formatMib(memoryUnits * MEMORY_UNIT_MIB);
  if (cores < CORES_PER_CARD) {
    return `${cores} % of one card with ${memory}`;
  }
  const cards = cores / CORES_PER_CARD;
  const plural = cards > 1 ? 's' : '';
  return `${cards} whole card${plural}` + (memoryUnits ? ` (${memory} declared)` : '');
}

/**
 * Validate the form's two text fields. `cores` 1-99 is a share of one card and needs
 * memory; 100*n is n whole cards (memory optional, implies the whole card); 0 with no
 * memory releases the GPU.
 */
export function validateRequestForm(coresText: string, memoryText: string): Validation {
  const coresTrimmed = coresText.trim();
  const memoryTrimmed = memoryText.trim();
  if (coresTrimmed === '') {
    return {
      ok: false,
      field: 'cores',
      message: 'Enter the compute share: 1-99 (% of one card) or 100 per whole card.'
    };
  }
  if (!/^[0-9]+$/.test(coresTrimmed)) {
    return {
      ok: false,
      field: 'cores',
      message: `Compute '${coresTrimmed}' is not a whole number: use 1-99 (% of one card) or 100 per whole card.`
    };
  }
  const cores = Number(coresTrimmed);
  let memoryUnits = 0;
  if (memoryTrimmed !== '') {
    try {
      memoryUnits = parseMemorySize(memoryTrimmed);
    } catch (error) {
      return { ok: false, field: 'memory', message: capitalise((error as Error).message) + '.' };
    }
  }
  if (cores === 0) {
    if (memoryUnits > 0) {
      return {
        ok: false,
        field: 'memory',
        message:
          'Memory comes with a share of compute: ask for 1-99 % of a card or 100 per whole card, ' +
          'or clear the memory to release the GPU.'
      };
    }
    return ok(0, 0);
  }
  if (cores < CORES_PER_CARD) {
    if (memoryUnits === 0) {
      return {
        ok: false,
        field: 'memory',
        message: `A share of one card (${cores} %) needs memory too, e.g. 4GiB (1 unit = ${MEMORY_UNIT_MIB} MiB).`
      };
    }
    if (memoryUnits > MAX_UNITS_PER_CARD) {
      return {
        ok: false,
        field: 'memory',
        message:
          `${formatMib(memoryUnits * MEMORY_UNIT_MIB)} is more than any card has ` +
          `(at most ${formatMib(MAX_CARD_MEMORY_MIB)}).`
      };
    }
    return ok(cores, memoryUnits);
  }
  if (cores % CORES_PER_CARD !== 0) {
    const lower = Math.floor(cores / CORES_PER_CARD) * CORES_PER_CARD;
    return {
      ok: false,
      field: 'cores',
      message:
        `${cores} is neither a share of one card (1-99) nor whole cards (a multiple of ${CORES_PER_CARD}); ` +
        `did you mean ${lower} or ${lower + CORES_PER_CARD}?`
    };
  }
  const cards = cores / CORES_PER_CARD;
  if (memoryUnits > cards * MAX_UNITS_PER_CARD) {
    return {
      ok: false,
      field: 'memory',
      message:
        `${formatMib(memoryUnits * MEMORY_UNIT_MIB)} is more than ${cards} card(s) could have ` +
        `(at most ${formatMib(cards * MAX_CARD_MEMORY_MIB)}).`
    };
  }
  return ok(cores, memoryUnits);
}

function ok(cores: number, memoryUnits: number): Validation {
  return {
    ok: true,
    cores,
    memoryUnits,
    // the server takes memory in 256 MiB units as a bare int, or a size string
    body: { cores, memory: memoryUnits },
    summary: describeRequest(cores, memoryUnits)
  };
}

function capitalise(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}
