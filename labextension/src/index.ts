/**
 * jupyter-vgpu's JupyterLab plugin: a sidebar panel (command, shortcut, palette entry),
 * a status-bar item, and settings for the refresh rate and the chart window.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { VgpuClient } from './api';
import { ReclaimBanner } from './reclaim';
import { DEFAULT_SETTINGS, VgpuModel, VgpuSettings } from './model';
import { VgpuPanel } from './panel';
import { VgpuStatus } from './statusbar';
import vgpuSvg from '../style/icons/vgpu.svg';

export const PLUGIN_ID = 'jupyter-vgpu:plugin';

export namespace CommandIDs {
  export const open = 'vgpu:open-panel';
}

export const vgpuIcon = new LabIcon({ name: 'jupyter-vgpu:chip', svgstr: vgpuSvg });

/** Settings from the registry, clamped to sane ranges. */
export function readSettings(composite: Partial<VgpuSettings>): VgpuSettings {
  const number = (value: unknown, fallback: number, min: number, max: number) =>
    typeof value === 'number' && Number.isFinite(value) ? Math.min(max, Math.max(min, value)) : fallback;
  return {
    refreshSeconds: number(composite.refreshSeconds, DEFAULT_SETTINGS.refreshSeconds, 0.25, 60),
    chartWindowSeconds: number(composite.chartWindowSeconds, DEFAULT_SETTINGS.chartWindowSeconds, 10, 3600),
    idleSeconds: number(composite.idleSeconds, DEFAULT_SETTINGS.idleSeconds, 1, 600),
    useStream: typeof composite.useStream === 'boolean' ? composite.useStream : DEFAULT_SETTINGS.useStream
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Your GPU share: allocation, topology, live usage and requests.',
  autoStart: true,
  // no ILabShell: any shell with a right area (JupyterLab, Notebook 7) hosts the panel
  optional: [ILayoutRestorer, ICommandPalette, ISettingRegistry, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null
  ) => {
    const shell = app.shell;
    const model = new VgpuModel(new VgpuClient(app.serviceManager.serverSettings));
    const panel = new VgpuPanel(model);
    const banner = new ReclaimBanner(app.serviceManager.serverSettings);
    panel.node.prepend(banner.node);
    banner.start();
    panel.title.icon = vgpuIcon;
    shell.add(panel, 'right', { rank: 600 });
    if (restorer) {
      restorer.add(panel, 'jupyter-vgpu-panel');
    }

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show vGPU Panel',
      caption: 'Your GPU share: allocation, topology, live usage and requests',
      icon: vgpuIcon,
      execute: () => {
        shell.activateById(panel.id);
        // put the keyboard where the person can act: the reclaim banner's button when it
        // warns, else the panel's first control (the banner's is hidden without a warning)
        const target =
          banner.node.querySelector<HTMLElement>('.jp-vgpu-mod-warned button') ??
          Array.from(panel.node.querySelectorAll<HTMLElement>('input, button')).find(
            element => !banner.node.contains(element)
          );
        target?.focus({ preventScroll: true });
      }
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.open, category: 'vGPU' });
    }
    if (statusBar) {
      statusBar.registerStatusItem('jupyter-vgpu:status', {
        item: new VgpuStatus(model, () => void app.commands.execute(CommandIDs.open)),
        align: 'left',
        rank: 5
      });
    }

    const started = model.start();
    if (settingRegistry) {
      void Promise.all([settingRegistry.load(PLUGIN_ID), app.restored, started])
        .then(([settings]) => {
          const apply = () => {
            model.settings = readSettings(settings.composite as Partial<VgpuSettings>);
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.error('jupyter-vgpu: cannot load settings', reason));
    }
  }
};

export default plugin;
