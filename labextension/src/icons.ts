// gpulayer's own icon (a chip), so its tab is not mistaken for Lab's Running panel.

import { LabIcon } from '@jupyterlab/ui-components';

// `jp-icon3` lets Lab's themes recolour it, as its own icons do.
const CHIP_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path fill-rule="evenodd" d="M7.5 6h9A1.5 1.5 0 0 1 18 7.5v9a1.5 1.5 0 0 1-1.5 1.5h-9A1.5 1.5 0 0 1 6 16.5v-9A1.5 1.5 0 0 1 7.5 6zM9 9v6h6V9z"/>
    <path d="M8 2h2v3H8zM11 2h2v3h-2zM14 2h2v3h-2zM8 19h2v3H8zM11 19h2v3h-2zM14 19h2v3h-2zM2 8h3v2H2zM2 11h3v2H2zM2 14h3v2H2zM19 8h3v2h-3zM19 11h3v2h-3zM19 14h3v2h-3z"/>
  </g>
</svg>`;

/** The sidebar's and job views' icon; its SVG carries `data-icon="gpulayer:chip"`. */
export const chipIcon = new LabIcon({ name: 'gpulayer:chip', svgstr: CHIP_SVG });
