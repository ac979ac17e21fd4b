/** Tiny helpers to build HTML and SVG elements without a framework. */

type Attrs = Record<string, string | number | boolean | null | undefined>;
type Child = Node | string | null | undefined | false;

function apply(el: Element, attrs: Attrs, children: Child[]): void {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    el.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    el.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
}

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  apply(el, attrs, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

export function s(tag: string, attrs: Attrs = {}, ...children: Child[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag) as SVGElement;
  apply(el, attrs, children);
  return el;
}

/** A labelled horizontal bar with progressbar semantics. */
export function bar(label: string, fraction: number, text: string, extraClass = ''): HTMLElement {
  const percent = Math.round(Math.min(1, Math.max(0, fraction)) * 100);
  const fill = h('div', { class: 'jp-vgpu-bar-fill' });
  fill.style.width = `${percent}%`;
  return h(
    'div',
    { class: `jp-vgpu-bar-row ${extraClass}`.trim() },
    h('span', { class: 'jp-vgpu-bar-label' }, label),
    h(
      'div',
      {
        class: 'jp-vgpu-bar',
        role: 'progressbar',
        'aria-label': `${label}: ${text}`,
        'aria-valuemin': 0,
        'aria-valuemax': 100,
        'aria-valuenow': percent
      },
      fill
    ),
    h('span', { class: 'jp-vgpu-bar-text' }, text)
  );
}
