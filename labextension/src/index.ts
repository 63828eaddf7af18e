// gpulayer's JupyterLab plugin: the sidebar, job views and the status-bar item.

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { MainAreaWidget, Notification } from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';

import { ApiError, GpulayerAPI } from './api';
import { JobView } from './components/job-view';
import { chipIcon } from './icons';
import { ClusterModel } from './model';
import { GpulayerSidebar } from './sidebar';
import { GpuStatus } from './status';

/** The sidebar tab's tooltip, as docs/user-guide.md names it. */
const SIDEBAR_CAPTION = 'GPU layer: workers and jobs';

namespace CommandIDs {
  export const openJob = 'gpulayer:open-job';
  export const showSidebar = 'gpulayer:show-sidebar';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulayer:plugin',
  description: 'gpulayer: workers, jobs, live logs and charts in a Lab sidebar.',
  autoStart: true,
  optional: [ILayoutRestorer, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null
  ) => {
    const api = new GpulayerAPI();
    const model = new ClusterModel({ api });
    const views = new Map<string, MainAreaWidget<JobView>>();

    app.commands.addCommand(CommandIDs.openJob, {
      label: 'Open gpulayer job',
      execute: args => {
        const id = String(args.id);
        let view = views.get(id);
        if (!view || view.isDisposed) {
          const content = new JobView({ api, jobId: id });
          view = new MainAreaWidget({ content });
          view.id = `${content.id}-area`;
          view.title.label = content.title.label;
          view.title.icon = chipIcon;
          view.title.closable = true;
          content.title.changed.connect(() => {
            view!.title.label = content.title.label;
            view!.title.caption = content.title.caption;
          });
          views.set(id, view);
          app.shell.add(view, 'main');
        }
        app.shell.activateById(view.id);
      }
    });

    const sidebar = new GpulayerSidebar({
      model,
      openJob: id => void app.commands.execute(CommandIDs.openJob, { id })
    });
    sidebar.title.icon = chipIcon;
    sidebar.title.caption = SIDEBAR_CAPTION;
    app.shell.add(sidebar, 'left', { rank: 300 });
    restorer?.add(sidebar, 'gpulayer-sidebar');

    app.commands.addCommand(CommandIDs.showSidebar, {
      label: 'Show gpulayer sidebar',
      execute: () => app.shell.activateById(sidebar.id)
    });

    if (statusBar) {
      statusBar.registerStatusItem('gpulayer:gpus', {
        item: new GpuStatus(model, () => app.shell.activateById(sidebar.id)),
        align: 'left',
        rank: 100
      });
    }

    // Say once, clearly, when the server side is missing or unreachable.
    api.health().catch((error: unknown) => {
      const e = error as ApiError;
      Notification.error(`gpulayer: ${e.message ?? String(error)}`, { autoClose: false });
    });
  }
};

export default plugin;
