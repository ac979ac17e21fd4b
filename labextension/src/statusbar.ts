/** The status-bar item: one line, used against the share, e.g. "vGPU 19/25 % · 3.1/4 GiB"; a click opens the panel. */

import { Widget } from '@lumino/widgets';

import { statusSummary, statusTooltip } from './format';
import { VgpuModel } from './model';

export class VgpuStatus extends Widget {
  constructor(
    readonly model: VgpuModel,
    onActivate: () => void
  ) {
    super({ node: document.createElement('button') });
    this.addClass('jp-vgpu-status');
    this.node.setAttribute('type', 'button');
    this.node.addEventListener('click', onActivate);
    model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const text = statusSummary(this.model.allocation, this.model.usage);
    const tooltip = statusTooltip(this.model.allocation, this.model.usage);
    this.node.textContent = text;
    this.node.title = `${tooltip} — click to open the vGPU panel`;
    this.node.setAttribute('aria-label', tooltip);
  }
}
