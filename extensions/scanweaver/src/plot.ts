/**
 * The timing plot: throughput (GB/s of bytes read and written) against the sequence length L,
 * one line per implementation, the copy roofline dashed. Drawn as a self-contained SVG string
 * from the measurements in the bundle (no plotting library).
 */
import type { Measurement } from './bundle';

export interface Series {
  name: string;
  kind: string;
  points: { length: number; gbps: number }[];
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];

/** Points grouped by implementation, in first-seen order; failed or skipped points left out. */
export function toSeries(measurements: readonly Measurement[]): Series[] {
  const byName = new Map<string, Series>();
  for (const m of measurements) {
    if ((m.status ?? 'ok') !== 'ok' || !(m.seconds > 0) || !(m.length > 0)) {
      continue;
    }
    let series = byName.get(m.name);
    if (!series) {
      series = { name: m.name, kind: m.kind ?? 'generated', points: [] };
      byName.set(m.name, series);
    }
    series.points.push({ length: m.length, gbps: m.bytes / m.seconds / 1e9 });
  }
  for (const series of byName.values()) {
    series.points.sort((a, b) => a.length - b.length);
  }
  return [...byName.values()];
}

export function escapeXml(text: string): string {
  return text.replace(/[<>&"']/g, c => `&#${c.charCodeAt(0)};`);
}

/** A round step for an axis from 0 to `max` with about `count` ticks. */
export function niceStep(max: number, count = 5): number {
  const raw = max / count;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const factor of [1, 2, 2.5, 5, 10]) {
    if (factor * power >= raw) {
      return factor * power;
    }
  }
  return 10 * power;
}

function lengthLabel(length: number): string {
  const k = Math.log2(length);
  return Number.isInteger(k) && length >= 1024 ? `2^${k}` : length.toLocaleString('en-US');
}

/** The SVG of the plot, or null when there is nothing to draw. */
export function throughputPlot(
  measurements: readonly Measurement[],
  options: { width?: number; height?: number; title?: string } = {}
): string | null {
  const series = toSeries(measurements);
  const all = series.flatMap(s => s.points);
  if (all.length === 0) {
    return null;
  }
  const width = options.width ?? 720;
  const legendRows = series.length;
  const plotHeight = options.height ?? 320;
  const margin = { left: 64, right: 20, top: 34, bottom: 46 + 18 * legendRows };
  const height = plotHeight + margin.top + margin.bottom;
  const innerW = width - margin.left - margin.right;
  const innerH = plotHeight;
  const logs = all.map(p => Math.log2(p.length));
  let xMin = Math.min(...logs);
  let xMax = Math.max(...logs);
  if (xMax - xMin < 1) {
    xMin -= 0.5;
    xMax += 0.5;
  }
  const yStep = niceStep(Math.max(...all.map(p => p.gbps)) || 1);
  const yMax = yStep * Math.ceil((Math.max(...all.map(p => p.gbps)) || 1) / yStep);
  const x = (length: number) => margin.left + ((Math.log2(length) - xMin) / (xMax - xMin)) * innerW;
  const y = (gbps: number) => margin.top + innerH - (gbps / yMax) * innerH;
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" class="sw-plot" width="${width}" height="${height}" ` +
      `viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="11">`
  );
  parts.push(`<rect x="0" y="0" width="${width}" height="${height}" fill="#fff"/>`);
  const title = options.title ?? 'throughput against sequence length';
  parts.push(
    `<text x="${width / 2}" y="18" text-anchor="middle" font-size="13">${escapeXml(title)}</text>`
  );
  // y grid and labels
  const ticks = Math.round(yMax / yStep);
  for (let k = 0; k <= ticks; k++) {
    const v = k * yStep;
    const yy = y(v).toFixed(1);
    parts.push(
      `<line x1="${margin.left}" x2="${margin.left + innerW}" y1="${yy}" y2="${yy}" stroke="#e6e6e6"/>`
    );
    parts.push(
      `<text x="${margin.left - 6}" y="${yy}" text-anchor="end" dominant-baseline="middle">` +
        `${Number(v.toPrecision(6))}</text>`
    );
  }
  // x ticks at the measured lengths
  const lengths = [...new Set(all.map(p => p.length))].sort((a, b) => a - b);
  const every = Math.max(1, Math.ceil(lengths.length / 10));
  lengths.forEach((length, index) => {
    if (index % every !== 0) {
      return;
    }
    const xx = x(length).toFixed(1);
    parts.push(
      `<line x1="${xx}" x2="${xx}" y1="${margin.top + innerH}" y2="${margin.top + innerH + 4}" stroke="#444"/>`
    );
    parts.push(
      `<text x="${xx}" y="${margin.top + innerH + 16}" text-anchor="middle">${lengthLabel(length)}</text>`
    );
  });
  parts.push(
    `<rect x="${margin.left}" y="${margin.top}" width="${innerW}" height="${innerH}" fill="none" stroke="#444"/>`
  );
  parts.push(
    `<text x="${margin.left + innerW / 2}" y="${margin.top + innerH + 34}" text-anchor="middle">` +
      'L (time steps, log scale)</text>'
  );
  parts.push(
    `<text transform="translate(16 ${margin.top + innerH / 2}) rotate(-90)" text-anchor="middle">` +
      'GB/s (bytes read + written)</text>'
  );
  series.forEach((s, index) => {
    const color = s.kind === 'roofline' ? '#555' : COLORS[index % COLORS.length];
    const dash = s.kind === 'roofline' ? ' stroke-dasharray="6 4"' : '';
    const path = s.points.map(p => `${x(p.length).toFixed(1)},${y(p.gbps).toFixed(1)}`).join(' ');
    parts.push(
      `<polyline class="sw-series" data-name="${escapeXml(s.name)}" points="${path}" fill="none" ` +
        `stroke="${color}" stroke-width="2"${dash}/>`
    );
    if (s.kind !== 'roofline') {
      for (const p of s.points) {
        parts.push(
          `<circle cx="${x(p.length).toFixed(1)}" cy="${y(p.gbps).toFixed(1)}" r="3" fill="${color}">` +
            `<title>${escapeXml(s.name)}: L=${p.length}, ${p.gbps.toFixed(2)} GB/s</title></circle>`
        );
      }
    }
    const ly = margin.top + innerH + 52 + 18 * index;
    parts.push(
      `<line x1="${margin.left}" x2="${margin.left + 24}" y1="${ly}" y2="${ly}" stroke="${color}" ` +
        `stroke-width="2"${dash}/>`
    );
    parts.push(
      `<text x="${margin.left + 30}" y="${ly}" dominant-baseline="middle">${escapeXml(s.name)}</text>`
    );
  });
  parts.push('</svg>');
  return parts.join('');
}
