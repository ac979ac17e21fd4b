import { execFileSync } from 'child_process';
import * as path from 'path';

import {
  describeRequest,
  formatMib,
  MEMORY_UNIT_MIB,
  parseMemorySize,
  sizeText,
  suggestedShare,
  validateRequestForm
} from '../src/request';
import { Allocation } from '../src/types';

describe('parseMemorySize', () => {
  it.each([
    ['4GiB', 16],
    ['4096MiB', 16],
    ['4Gi', 16],
    ['4g', 16],
    [' 8 GiB ', 32],
    ['1.5GiB', 6],
    ['256MiB', 1],
    ['16', 16],
    ['16units', 16],
    ['1TiB', 4096]
  ])('%s is %i units', (text, units) => {
    expect(parseMemorySize(text)).toBe(units);
  });

  it.each([
    ['0.1GiB', /not a multiple of 256 MiB/],
    ['100MiB', /not a multiple of 256 MiB/],
    ['0.5', /must be whole/],
    ['0', /more than zero/],
    ['0GiB', /more than zero/],
    ['4XB', /unknown unit 'XB'/],
    ['-1', /use e.g. 4GiB/],
    ['lots', /use e.g. 4GiB/],
    ['', /use e.g. 4GiB/]
  ])('%s is refused', (text, message) => {
    expect(() => parseMemorySize(text)).toThrow(message);
  });
});

describe('validateRequestForm', () => {
  it('accepts a share with memory and sends units', () => {
    const result = validateRequestForm('25', '4GiB');
    expect(result).toEqual({
      ok: true,
      cores: 25,
      memoryUnits: 16,
      body: { cores: 25, memory: 16 },
      summary: '25 % of one card with 4 GiB'
    });
  });

  it('needs memory with a share', () => {
    const result = validateRequestForm('25', '');
    expect(result.ok).toBe(false);
    expect(result).toMatchObject({ field: 'memory' });
    expect(!result.ok && result.message).toMatch(/needs memory too/);
  });

  it('accepts whole cards with or without memory', () => {
    expect(validateRequestForm('100', '')).toMatchObject({ ok: true, cores: 100, memoryUnits: 0, summary: '1 whole card' });
    expect(validateRequestForm('200', '80GiB')).toMatchObject({
      ok: true,
      cores: 200,
      memoryUnits: 320,
      summary: '2 whole cards (80 GiB declared)'
    });
  });

  it('suggests the neighbouring whole-card counts', () => {
    const result = validateRequestForm('150', '');
    expect(result).toMatchObject({ ok: false, field: 'cores' });
    expect(!result.ok && result.message).toMatch(/did you mean 100 or 200\?/);
  });

  it('treats 0 without memory as a release and refuses 0 with memory', () => {
    expect(validateRequestForm('0', '')).toMatchObject({ ok: true, body: { cores: 0, memory: 0 }, summary: 'release the GPU' });
    expect(validateRequestForm('0', '4GiB')).toMatchObject({ ok: false, field: 'memory' });
  });

  it.each(['', ' ', '2.5', '-3', 'ten', '1e2'])('refuses compute %p', text => {
    expect(validateRequestForm(text, '4GiB')).toMatchObject({ ok: false, field: 'cores' });
  });

  it('refuses more memory than any card has', () => {
    expect(validateRequestForm('50', '600GiB')).toMatchObject({ ok: false, field: 'memory' });
    expect(validateRequestForm('200', '1000GiB')).toMatchObject({ ok: true });
    expect(validateRequestForm('200', '1100GiB')).toMatchObject({ ok: false, field: 'memory' });
  });

  it('passes a malformed size through with its reason', () => {
    const result = validateRequestForm('25', '3.3GiB');
    expect(!result.ok && result.message).toBe("Memory size '3.3GiB' is not a multiple of 256 MiB.");
  });
});

describe('words', () => {
  it('formats sizes like contract.format_mib', () => {
    expect(formatMib(4096)).toBe('4 GiB');
    expect(formatMib(1536)).toBe('1.5 GiB');
    expect(formatMib(768)).toBe('768 MiB');
  });

  it('describes requests', () => {
    expect(describeRequest(30, 8)).toBe('30 % of one card with 2 GiB');
    expect(describeRequest(300, 0)).toBe('3 whole cards');
  });
});

describe('the form suggests the share held now', () => {
  const held = (cores: number, memoryMib: number, migProfile?: string): Allocation => ({
    node: 'n', namespace: 'ns', pod: 'nb-v2', podUid: 'u', container: 'notebook', cores, memoryMib,
    enforcement: migProfile ? 'mig' : 'none',
    cards: [{ index: 0, uuid: 'x', model: 'A100', cores, memoryMib, memoryTotalMib: migProfile ? memoryMib : 40960,
              ...(migProfile ? { migProfile } : {}) }]
  });

  it('after a move, on a slice, with whole cards, and with none', () => {
    expect(suggestedShare(held(50, 8192))).toEqual({ cores: '50', memory: '8GiB' });
    expect(suggestedShare(held(28, 10240, '2g.10gb'))).toEqual({ cores: '28', memory: '10GiB' });
    expect(suggestedShare(held(200, 81920))).toEqual({ cores: '200', memory: '' });
    expect(suggestedShare(null)).toEqual({ cores: '25', memory: '4GiB' });
  });

  it('in sizes the form takes back', () => {
    for (const mib of [4096, 1536, 768, 10240]) {
      expect(parseMemorySize(sizeText(mib)) * MEMORY_UNIT_MIB).toBe(mib);
    }
    expect([sizeText(1536), sizeText(768)]).toEqual(['1.5GiB', '768MiB']);
  });
});

/**
 * The same inputs through jupyter_vgpu/core/contract.py (stdlib only): the form must
 * accept exactly what the server accepts, and count the same units.
 */
describe('parity with contract.py', () => {
  const repo = path.resolve(__dirname, '..', '..');
  const python = process.env.VGPU_PYTHON || 'python3';
  const sizes = [
    '4GiB', '4096MiB', '4Gi', '4g', '4G', ' 8 GiB ', '1.5GiB', '0.1GiB', '100MiB', '256MiB', '255MiB',
    '16', '16units', '0.5', '0', '0GiB', '4XB', '-1', 'lots', '1TiB', '2.25GiB', '1e3', '4 G i B',
    '0.00390625GiB', '1.0', '768m', '3mi', '512Ti'
  ];
  const pairs: [number, number][] = [];
  for (const cores of [1, 25, 99, 100, 101, 150, 199, 200, 300, 1000]) {
    for (const units of [0, 1, 16, 2048, 2049, 4096, 4097]) {
      pairs.push([cores, units]);
    }
  }
  const script = `
import json, sys
from jupyter_vgpu.core import contract
cases = json.load(sys.stdin)
def size(text):
    try:
        return contract.parse_memory_size(text)
    except contract.RequestError:
        return None
def valid(cores, units):
    try:
        contract.validate_request(cores, units)
        return True
    except contract.RequestError:
        return False
print(json.dumps({"sizes": [size(t) for t in cases["sizes"]], "pairs": [valid(c, u) for c, u in cases["pairs"]]}))
`;
  const reference = JSON.parse(
    execFileSync(python, ['-c', script], {
      input: JSON.stringify({ sizes, pairs }),
      env: { ...process.env, PYTHONPATH: repo },
      encoding: 'utf-8'
    })
  ) as { sizes: (number | null)[]; pairs: boolean[] };

  it('parses memory sizes to the same units or refuses them too', () => {
    const ours = sizes.map(text => {
      try {
        return parseMemorySize(text);
      } catch {
        return null;
      }
    });
    expect(ours).toEqual(reference.sizes);
  });

  it('accepts and refuses the same (cores, memory) pairs', () => {
    const ours = pairs.map(([cores, units]) => {
      const memory = units ? `${units * MEMORY_UNIT_MIB}MiB` : '';
      return validateRequestForm(String(cores), memory).ok;
    });
    expect(ours).toEqual(reference.pairs);
  });
});
