/**
 * The panel words a card's occupancy as test/occupancy-cases.json says; the widgets'
 * Python test reads the same file, so panel and widgets cannot drift apart.
 */
import * as fs from 'fs';
import * as path from 'path';

import { count, fill } from '../src/glossary';
import { describeOccupancy, LeafGpu } from '../src/topology';

const cases = JSON.parse(fs.readFileSync(path.join(__dirname, 'occupancy-cases.json'), 'utf8')).cases as {
  gpu: LeafGpu;
  words: string;
}[];

describe('the shared glossary', () => {
  it.each(cases.map(c => [c.words, c.gpu] as const))('words a card as "%s"', (words, gpu) => {
    expect(describeOccupancy(gpu)).toBe(words);
  });

  it('says allocated, never a bare percentage', () => {
    for (const c of cases) {
      expect(/\d %$/.test(c.words)).toBe(false);
    }
  });

  it('fills placeholders and counts', () => {
    expect(fill('{a} and {b}', { a: 1 })).toBe('1 and {b}');
    expect([count('tenants', 1), count('tenants', 2), count('others', 1)]).toEqual(['1 tenant', '2 tenants', '1 other']);
  });
});
