// Perceptual colour maps as 256-entry lookup tables (RGB bytes), built from evenly spaced
// anchors of matplotlib's maps (the same anchors Plotly uses) by linear interpolation.

const ANCHORS = {
  viridis: ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"],
  inferno: ["#000004", "#1b0c41", "#4a0c6b", "#781c6d", "#a52c60", "#cf4446", "#ed6925", "#fb9b06", "#f7d13d", "#fcffa4"],
  magma: ["#000004", "#180f3d", "#440f76", "#721f81", "#9e2f7f", "#cd4071", "#f1605d", "#fd9668", "#feca8d", "#fcfdbf"],
  plasma: ["#0d0887", "#46039f", "#7201a8", "#9c179e", "#bd3786", "#d8576b", "#ed7953", "#fb9f3a", "#fdca26", "#f0f921"],
  cividis: ["#00224e", "#123570", "#3b496c", "#575d6d", "#707173", "#8a8678", "#a59c74", "#c3b369", "#e1cc55", "#fee838"],
  grey: ["#000000", "#ffffff"],
};

export const COLORMAPS = Object.keys(ANCHORS);

const cache = new Map();

function hexToRgb(hex) {
  const v = parseInt(hex.slice(1), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
}

/** A Uint8Array of 256 * 3 bytes: the colour of level i at [3i, 3i+1, 3i+2]. */
export function lut(name) {
  if (cache.has(name)) return cache.get(name);
  const stops = (ANCHORS[name] || ANCHORS.viridis).map(hexToRgb);
  const out = new Uint8Array(256 * 3);
  const segs = stops.length - 1;
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * segs;
    const k = Math.min(segs - 1, Math.floor(t));
    const f = t - k;
    for (let c = 0; c < 3; c++) {
      out[3 * i + c] = Math.round(stops[k][c] + (stops[k + 1][c] - stops[k][c]) * f);
    }
  }
  cache.set(name, out);
  return out;
}

/** The map as a Plotly colorscale ([[0, "rgb(...)"], ..., [1, ...]]). */
export function plotlyScale(name) {
  const stops = ANCHORS[name] || ANCHORS.viridis;
  return stops.map((hex, i) => [i / (stops.length - 1), hex]);
}

/** Paint the colour bar canvas (width 256, height 1) with the map. */
export function paintColorbar(canvas, name) {
  const table = lut(name);
  canvas.width = 256;
  canvas.height = 1;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(256, 1);
  for (let i = 0; i < 256; i++) {
    img.data[4 * i] = table[3 * i];
    img.data[4 * i + 1] = table[3 * i + 1];
    img.data[4 * i + 2] = table[3 * i + 2];
    img.data[4 * i + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}
