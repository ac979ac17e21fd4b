/**
 * The shared glossary (glossary.json): the words the panel and the notebook
 * widgets both use, so "allocated" and "used" mean the same everywhere. Pure.
 */

import glossary from './glossary.json';

export const GLOSSARY = glossary;

/** Fill `{name}` placeholders. */
export function fill(template: string, values: Record<string, string | number>): string {
  return template.replace(/\{(\w+)\}/g, (whole, name: string) => (name in values ? String(values[name]) : whole));
}

/** '1 tenant', '2 tenants', '1 other', ... */
export function count(noun: keyof typeof glossary.counts, n: number): string {
  const [one, many] = glossary.counts[noun];
  return fill(n === 1 ? one : many, { n });
}
