/**
 * The notebook widgets' front end: an anywidget ES module (bundled by `npm run build:widget`
 * into jupyter_vgpu/widgets/static/, shipped in the wheel) that draws the Python model's facts
 * with FactsView, the lab panel's own renderer. anywidget needs only the standard ipywidgets
 * manager, so this runs in JupyterLab, Notebook 7, VS Code and Voilà alike.
 *
 * The model's traits (jupyter_vgpu/widgets/views.py) are the REST-shaped answers the panel
 * gets (docs/server-api.yaml): `allocation`, `topology`, `usage` (with its `history`), plus
 * the chart `window` in seconds and the `parts` to draw. The Python side pushes new samples
 * into `usage`; every change redraws.
 */

import { ALL_PARTS, FactsPart, FactsView } from './facts-view';
import { UsageSeries } from './series';
import { AllocationReply, TopologyReply, UsageReply } from './types';

/** The part of anywidget's model interface this module uses. */
export interface WidgetModel {
  get(name: string): unknown;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

const TRAITS = ['allocation', 'topology', 'usage', 'window', 'parts'];

/** Where a widget user asks for a GPU (the panel says "below", at its form). */
export const NONE_HINT = 'Ask for one with %vgpu request.';

/**
 * Draw one widget. Not exported by name: anywidget takes the module's default export (an object
 * with `render`), and warns that a module exporting `render` directly uses a deprecated shape.
 */
function render({ model, el }: { model: WidgetModel; el: HTMLElement }): () => void {
  const parts = ((model.get('parts') as FactsPart[] | null) ?? []).filter(p => ALL_PARTS.includes(p));
  const view = new FactsView({ parts: parts.length ? parts : ALL_PARTS, noneHint: NONE_HINT });
  el.classList.add('jp-vgpu-widget');
  el.append(view.node);
  const draw = () => {
    const usage = (model.get('usage') as UsageReply | null) ?? null;
    const windowSeconds = Number(model.get('window')) || 120;
    const series = new UsageSeries(windowSeconds);
    series.addMany(usage?.history ?? []);
    if (usage?.current) {
      series.add(usage.current);
    }
    view.render({
      allocation: (model.get('allocation') as AllocationReply | null) ?? null,
      topology: (model.get('topology') as TopologyReply | null) ?? null,
      usage,
      points: series.points,
      windowSeconds
    });
  };
  draw();
  for (const name of TRAITS) {
    model.on(`change:${name}`, draw);
  }
  return () => {
    for (const name of TRAITS) {
      model.off(`change:${name}`, draw);
    }
  };
}

/** anywidget's module shape since 0.9: `export default { render }` (no `initialize`: the model needs none). */
export default { render };
