// The page's own scripts, loaded once into the page's <head> by app.py; Gradio events call them by
// name (js="(q, tab) => explorer.writeUrl(q, tab)"). No server round trip in here. What the figures tell
// these scripts (the `meta` of their layout and traces) is declared in explorer/page_contract.py, and checked
// against both sides by tests/test_page_contract.py: read no other key without declaring it there.
window.explorer = window.explorer || {};

// The page's ports (app.page_port): each an event the page sends the server with its payload, registered in
// window.explorerPorts as it mounts. send: false (nothing sent) while the port is not on the page.
explorer.ported = (name) => !!(window.explorerPorts && window.explorerPorts[name]);
explorer.send = (name, payload) => {
    if (!explorer.ported(name)) return false;
    window.explorerPorts[name](String(payload));
    return true;
};

// The address bar follows the controls and the open tab, so a copied link reopens the same view; each change
// is an entry of the browser's history, so Back undoes it (the page's first address, and one Back or Forward
// went to, replace theirs: explorer.restoring). Every event that moves the link ends here, so here too the
// Timing tab's check follows the sidebar while that tab is open: a new link there sends the recheck port (a
// change drawn in the browser on another tab sends nothing; opening the tab checks on its own).
// Plotly writes colour-bar gradients and clip paths as url('<page address>#id') when the page has a
// <base> element (Gradio's has), and keeps that address for later redraws: once the address changes
// they point into another document and draw nothing (a blank colour bar). Both are moved to the new
// address here.
explorer.writeUrl = (q, tab) => {
    if (tab === 'timing' && q !== explorer.linkWritten) explorer.send('recheck', '');
    explorer.linkWritten = q;
    const before = window.location.href.split('#')[0];
    const u = new URL(window.location);
    u.search = q + (tab && tab !== 'mask' ? '&tab=' + encodeURIComponent(tab) : '')
        + (explorer.pageParams ? explorer.pageParams() : '');     // presentation mode's (static/present.js)
    const replace = !explorer.addressWritten || explorer.restoring;
    explorer.addressWritten = true;
    explorer.restoring = false;
    if (u.href.split('#')[0] === before) return [q, tab];
    if (replace) window.history.replaceState(null, '', u); else window.history.pushState(null, '', u);
    const now = u.href.split('#')[0];
    if (now !== before) {
        document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
            if (gd._context && gd._context._baseUrl) gd._context._baseUrl = now;
            gd.querySelectorAll('[style*="url("], [clip-path], [fill^="url("]').forEach((el) => {
                for (const prop of ['fill', 'stroke', 'clip-path']) {
                    const v = el.style.getPropertyValue(prop);
                    if (v && v.includes(before)) el.style.setProperty(prop, v.split(before).join(now));
                    const a = el.getAttribute(prop);
                    if (a && a.includes(before)) el.setAttribute(prop, a.split(before).join(now));
                }
            });
        });
    }
    return [q, tab];
};

// Point and see: a click on a cell of the attention or mask heatmap picks its query row and, in a panel
// of one head, that layer and head. gr.Plot has no click event, so plotly's own plotly_click is heard on
// each plot as it is drawn; the trace's meta (rows: each row's first sequence position; layer, head;
// written by explorer.figures) goes as `layer=1&head=3&query=7` through the pick port, whose event runs
// server.endpoints.pick_on_page: those controls set together, the view redrawn (the row outlined) and the link
// moved.
explorer.pickRow = () => {
    const listen = () => {
        for (const id of ['attention-plot', 'mask-plot']) {
            const gd = document.querySelector('#' + id + ' .js-plotly-plot');
            if (!gd || !gd.on || gd.__pickRow) continue;
            gd.__pickRow = true;
            gd.on('plotly_click', (ev) => {
                const pt = ev && ev.points && ev.points[0];
                const meta = pt && pt.data && pt.data.meta;
                const row = pt && (Array.isArray(pt.pointNumber) ? pt.pointNumber[0] : pt.pointNumber);
                if (!meta || !meta.rows || meta.rows[row] === undefined) return;
                // the same head's another row: drawn on the page where it holds it (explorer.setQueryBox)
                if (id === 'attention-plot' && meta.head !== undefined
                    && explorer.setQueryBox(meta.rows[row], meta.layer, meta.head)) return;
                const pick = new URLSearchParams();
                if (meta.layer !== undefined) pick.set('layer', meta.layer);
                if (meta.head !== undefined) pick.set('head', meta.head);
                pick.set('query', meta.rows[row]);
                explorer.send('pick', pick.toString());
            });
        }
    };
    new MutationObserver(listen).observe(document.body, {childList: true, subtree: true});
    listen();
};

explorer.copyLink = () => { navigator.clipboard && navigator.clipboard.writeText(window.location.href); };

// The Export tab's preview is the slide itself, at the slide's size (1600 x 900 at 16:9): shown scaled down
// to its box, the whole slide in view as the file will hold it.
explorer.fitPreview = () => {
    const box = document.getElementById('export-preview');
    const gd = box && box.querySelector('.js-plotly-plot');
    if (!gd || !gd.layout || !gd.layout.width || !box.clientWidth) return;
    const k = Math.min(1, (box.clientWidth - 16) / gd.layout.width);
    gd.style.transform = `scale(${k})`;
    gd.style.transformOrigin = 'top left';
    gd.parentElement.style.height = Math.ceil(gd.layout.height * k) + 'px';
    gd.parentElement.style.overflow = 'hidden';
};
new MutationObserver(() => explorer.fitPreview()).observe(document.documentElement, {childList: true, subtree: true});
window.addEventListener('resize', () => explorer.fitPreview());

// Back and Forward within the app: the address they went to goes through the history port, whose event
// (server.endpoints.link_on_page) sets every control and the tab from it and redraws; the address then stays
// as it is. Presentation mode follows the address's `present`.
window.addEventListener('popstate', () => {
    if (!explorer.ported('history')) return;
    const P = explorer.present;
    const presenting = new URLSearchParams(window.location.search).get('present') === '1';
    if (P && presenting !== P.on) { if (presenting) P.enter(true); else P.leave(true); }
    if (P) P.bar();
    explorer.restoring = true;
    explorer.send('history', window.location.search);
});

// --- display changes drawn in the browser: the data is on the page, the server is not asked -----------

// q with `key` set to `value` (left out when it is its default), in the order of the Settings fields, as the
// server writes it, so the link reads the same either way (explorer.fields and explorer.linkDefaults, written
// by app.py from explorer.page_contract).
explorer.withParam = (q, key, value) => {
    const params = new URLSearchParams(q);
    if (String(value) === explorer.linkDefaults[key]) params.delete(key); else params.set(key, String(value));
    const order = explorer.fields || [];
    const rank = (k) => (order.indexOf(k) < 0 ? order.length : order.indexOf(k));
    const entries = [...params.entries()].sort((a, b) => rank(a[0]) - rank(b[0]));
    return new URLSearchParams(entries).toString();
};

// Python's rounding of a value printed to `d` decimals: JS rounds an exact tie (0.03125 to 4 places) up,
// Python to the even digit; float32 weights such as 1/32 are such ties.
const towardZeroIfEvenTie = (v, d) => {
    if (!isFinite(v) || v === 0 || d < 0 || d > 90) return v;
    const s = Math.abs(v).toFixed(100), dot = s.indexOf('.');
    if (!/^50*$/.test(s.slice(dot + 1 + d))) return v;
    const digits = s.slice(0, dot) + s.slice(dot + 1, dot + 1 + d);
    if (Number(digits[digits.length - 1]) % 2) return v;
    const b = new Float64Array([v]);
    new BigInt64Array(b.buffer)[0] -= 1n;               // one step toward zero
    return b[0];
};
explorer.fmtF = (v, d) => towardZeroIfEvenTie(v, d).toFixed(d);

// Python's format(v, '.Ng') (and 'g': 6 digits), ties rounded as Python rounds them, so the colour bar reads
// as the server writes it
explorer.fmtG = (v, digits = 6) => {
    if (v === 0) return '0';
    if (!isFinite(v)) return String(v);
    const rounded = towardZeroIfEvenTie(v, digits - 1 - Number(Math.abs(v).toExponential(digits - 1).split('e')[1]));
    const [mant, exp] = rounded.toExponential(digits - 1).split('e');
    const e = Number(exp);
    const strip = (s) => (s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s);
    if (e < -4 || e >= digits) return strip(mant) + 'e' + (e < 0 ? '-' : '+') + String(Math.abs(e)).padStart(2, '0');
    return strip(rounded.toFixed(Math.max(0, digits - 1 - e)));
};

// numpy's quantile (linear interpolation) of sorted values
const quantile = (sorted, q) => {
    const h = (sorted.length - 1) * q, lo = Math.floor(h), hi = Math.ceil(h);
    return sorted[lo] + (h - lo) * (sorted[hi] - sorted[lo]);
};

// The colour scale of explorer.figures.ColourScale, in the browser: fit over every panel's finite
// values, the transform of a value to its colour coordinate, the colour bar's ticks and the note.
explorer.colourScale = (kind, values, zmin, zmax) => {
    const finite = values.filter((v) => isFinite(v));
    if (!finite.length) finite.push(0);
    if (kind === 'quantile') {
        const sorted = Float64Array.from(finite).sort();
        const rank = (v) => {                     // searchsorted(sorted, v, 'left') / (n - 1)
            let a = 0, b = sorted.length;
            while (a < b) { const m = (a + b) >> 1; if (sorted[m] < v) a = m + 1; else b = m; }
            return Math.min(1, Math.max(0, a / Math.max(sorted.length - 1, 1)));
        };
        const values3 = [...new Set([0, 0.25, 0.5, 0.75, 0.9, 0.99, 1].map(
            (q) => Number(explorer.fmtG(quantile(sorted, q), 3))))].sort((x, y) => x - y);
        const ticks = [];
        for (const v of [values3[0], values3[values3.length - 1], ...values3.slice(1, -1)]) {
            const pos = rank(v);
            if (ticks.every(([p]) => Math.abs(pos - p) >= 0.07)) ticks.push([pos, v]);
        }
        return {lo: 0, hi: 1, transform: (v) => (isFinite(v) ? rank(v) : NaN), suffix: ' (quantile)',
                tickvals: ticks.map(([p]) => p), ticktext: ticks.map(([, v]) => explorer.fmtG(v, 3)),
                note: 'colour: quantile — the share of cells with a smaller value (shows structure when a few cells '
                      + 'hold most weight); the bar\'s ticks give the values'};
    }
    let min = Infinity, max = -Infinity;
    for (const v of finite) { if (v < min) min = v; if (v > max) max = v; }
    if (kind === 'log' && min < 0) {
        let big = 0;
        for (const v of finite) big = Math.max(big, Math.abs(v));
        big = big || 1;
        const nonzero = finite.filter((v) => v !== 0).map(Math.abs).sort((x, y) => x - y);
        const c = Math.max(nonzero.length ? quantile(nonzero, 0.05) : big, big * 1e-6);
        const top = Math.log10(1 + big / c);
        const mags = [];
        for (let e = Math.ceil(Math.log10(c)); e <= Math.floor(Math.log10(10 ** top * (1 - 1e-9))); e++) mags.push(10 ** e);
        const shown = mags.slice(-4);
        const ticks = [...shown.map((m) => -m).reverse(), 0, ...shown];
        const f = (v) => Math.sign(v) * Math.log10(1 + Math.abs(v) / c);
        const t = explorer.fmtG(c, 2);
        return {lo: -top, hi: top, transform: f, suffix: ' (symmetric log)', tickvals: ticks.map(f),
                ticktext: ticks.map((v) => explorer.fmtG(v)),
                note: `colour: symmetric log, sign(x)·log10(1 + |x|/${t}) — negative values keep their side, `
                      + `linear within ±${t}`};
    }
    if (kind === 'log') {
        let floor = Infinity;
        for (const v of finite) if (v > 0 && v < floor) floor = v;
        floor = Math.max(isFinite(floor) ? floor : 1e-12, 1e-12);
        const lo = Math.log10(floor), hi = Math.log10(Math.max(max, floor * 10));
        const ticks = [];
        for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) ticks.push(e);
        return {lo, hi, transform: (v) => Math.log10(Math.max(v, 10 ** lo)), suffix: ' (log)',
                tickvals: ticks, ticktext: ticks.map((e) => `1e${e}`), note: 'colour: log10 of the value'};
    }
    const lo = zmin !== null && zmin !== undefined ? zmin : min;
    const hi = zmax !== null && zmax !== undefined ? zmax : max;
    return {lo, hi: hi > lo ? hi : lo + 1, transform: null, suffix: '', note: ''};
};

// A 2-D array as plotly keeps it: rows of numbers, or numpy's base64 typed array as sent
// ({dtype: 'f4', bdata, shape: '9, 9'}), as rows of numbers.
const TYPED = {f4: Float32Array, f8: Float64Array, u1: Uint8Array, i1: Int8Array, u2: Uint16Array,
               i2: Int16Array, u4: Uint32Array, i4: Int32Array};
const rowsOf = (z) => {
    if (Array.isArray(z)) return z.map((r) => Array.from(r, (v) => (v === null ? NaN : v)));
    const bytes = Uint8Array.from(atob(z.bdata), (ch) => ch.charCodeAt(0));
    const flat = new TYPED[z.dtype.replace(/[<>|=]/, '')](bytes.buffer);
    const [n, m] = typeof z.shape === 'string' ? z.shape.split(',').map(Number) : z.shape;
    return Array.from({length: n}, (_, r) => Array.from(flat.subarray(r * m, (r + 1) * m)));
};

// The colour scale of `kind` fitted to the heatmap traces `traces` ([trace, index]) of the attention figure
// `gd`, whose layout meta `colour` names the title and colour bar: the colour coordinates, the colour bar,
// the title's note and the hover's value, as the arguments of one Plotly.update.
const colourUpdate = (gd, kind, traces) => {
    const meta = gd.layout.meta.colour;
    const raws = traces.map(([t]) => rowsOf(t.customdata !== undefined && t.customdata !== null ? t.customdata : t.z));
    const all = [];
    for (const raw of raws) for (const row of raw) for (const v of row) all.push(v);
    const scale = explorer.colourScale(kind, all, meta.zmin, meta.zmax);
    const z = raws.map((raw) => (scale.transform ? raw.map((row) => row.map(scale.transform)) : raw));
    const first = traces.length ? traces[0][0] : null;
    const bar = {...((first && first.colorbar) || {}), title: {text: meta.bar + scale.suffix, side: 'right'}};
    if (scale.tickvals) Object.assign(bar, {tickvals: scale.tickvals, ticktext: scale.ticktext, tickmode: 'array'});
    else Object.assign(bar, {tickvals: null, ticktext: null, tickmode: 'auto'});
    // the hover's value: the raw one (customdata) under a transformed colour, else z (explorer.figureText)
    const text = explorer.figureText;
    const [was, now] = scale.transform ? [text.hover_raw, text.hover_customdata] : [text.hover_customdata, text.hover_raw];
    const hover = traces.map(([t]) => t.hovertemplate.replace(was, now));
    // a small panel's printed values (meta.text: their format) while the colour is the value itself
    const printed = traces.map(([t]) => (t.meta && t.meta.text
                                         ? (scale.transform ? '' : explorer.fill(text.cell_text, {format: t.meta.text}))
                                         : undefined));
    return [{z, customdata: scale.transform ? raws : traces.map(() => null), zmin: scale.lo, zmax: scale.hi,
             hovertemplate: hover, texttemplate: printed, colorbar: traces.map(() => bar)},
            {'title.text': meta.title + (scale.note ? `<br><sup>${scale.note}</sup>` : '')},
            traces.map(([, i]) => i)];
};

// The heatmap traces the attention figure shows now, as [trace, index]; the masked pairs drawn over them
// (meta.overlay, explorer.figures) are no values to recolour.
const shownHeatmaps = (gd) => gd.data.map((t, i) => [t, i])
    .filter(([t]) => t.type === 'heatmap' && t.visible !== false && !(t.meta && t.meta.overlay));

// The colour radio: the attention figure recoloured from the raw values it already holds (one redraw), and
// the query string for the link.
explorer.recolour = (kind, q) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    if (gd && gd.data && gd.layout && gd.layout.meta && gd.layout.meta.colour) {
        Plotly.update(gd, ...colourUpdate(gd, kind, shownHeatmaps(gd)));
    }
    return explorer.withParam(q, 'color', kind);
};

// A template of the figure text (explorer.figureText: explorer.page_contract.FIGURE_TEXT) with its {name}s set, as
// page_contract.fill sets them; `templated`: the pattern of its text at the start of a string, each {name} matching
// the pattern `wild` gives it.
explorer.fill = (template, values) => Object.entries(values).reduce((t, [k, v]) => t.split(`{${k}}`).join(String(v)),
                                                                     template);
const templated = (template, wild) => new RegExp('^' + template.split(/(\{\w+\})/).map(
    (part, i) => (i % 2 ? wild[part.slice(1, -1)] : part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))).join(''));

const escapeHtml = (s) => String(s).replace(/[&<>"]/g, (ch) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[ch]));

// The query row drawn on the page from what the attention tab holds (layout meta `query`, written by
// explorer.views.attention.query_meta): every panel's row outline moved, the bar chart and its sentence redrawn from
// the panel's own weights, as explorer.views.attention.query_row_view draws them. `v` is the query box's value
// (-1: the first candidate). The sequence position drawn, or null where the page does not hold that row
// (another tab, pooled rows, logits shown, a control marked invalid): then the server redraws. `layer`
// (the bars' layer; in the every-head grid another layer's head-0 panel is on the page too) is kept
// unless given; `outline` false leaves the row outline as it is (a redraw saved where it cannot move).
explorer.drawQueryRow = (v, layer, outline = true) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const bars = document.querySelector('#query-bars-plot .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta && gd.layout.meta.query;
    if (!meta || !bars || !bars.data || !bars.data[0] || !gd.getClientRects().length
        || document.querySelector('.invalid') || !Number.isInteger(v) || v < -1) return null;
    const labels = bars.data[0].x, T = labels.length, L = layer === undefined ? meta.layer : layer;
    const pos = v < 0 ? meta.offset : v;
    const heat = gd.data.filter((t) => t.type === 'heatmap' && t.meta && t.meta.rows);
    const src = heat.find((t) => t.meta.layer === L && t.meta.head === meta.head
                                 && (t.meta.values === undefined || t.meta.values === 'probabilities'));
    if (pos >= T || !src || heat.some((t) => t.meta.rows.length !== T || t.x.length !== T)) return null;
    const raw = rowsOf(src.customdata !== undefined && src.customdata !== null ? src.customdata : src.z);
    const probs = raw[pos];
    const shapes = (gd.layout.shapes || []).filter((s) => s.name !== 'query-outline');
    for (const t of heat) {
        const i = t.meta.rows.indexOf(pos);
        if (i < 0 || t.visible === false) continue;         // a head the one-head view holds hidden
        const box = {type: 'rect', x0: -0.5, x1: t.x.length - 0.5, y0: i - 0.5, y1: i + 0.5, xref: t.xaxis || 'x',
                     yref: t.yaxis || 'y', fillcolor: 'rgba(0,0,0,0)', layer: 'above', name: 'query-outline'};
        shapes.push({...box, line: {color: '#FFFFFF', width: 5}}, {...box, line: {color: '#000000', width: 2}});
    }
    if (outline) Plotly.relayout(gd, {shapes});
    const title = (bars.layout.title && bars.layout.title.text) || '';
    Plotly.update(bars, {y: [probs], text: [bars.data[0].text ? probs.map((p) => explorer.fmtG(p, 3)) : null]},
                  {'title.text': title.replace(
                      templated(explorer.figureText.bars_title, {label: '.*?', layer: '\\d+', head: '\\d+'}),
                      explorer.fill(explorer.figureText.bars_title, {label: labels[pos], layer: L, head: meta.head}))},
                  [0]);
    meta.layer = L;
    const top = probs.map((p, i) => i).sort((a, b) => probs[b] - probs[a]).slice(0, 3);   // stable: ties by position
    let masked = 0;
    [...meta.masked[pos]].forEach((ch, i) => { if (ch === '1') masked += probs[i]; });
    const text = document.querySelector('#query-text .prose') || document.querySelector('#query-text');
    if (text) {
        text.innerHTML = `<p>Query <strong>${escapeHtml(labels[pos])}</strong> puts `
            + top.map((i) => `${explorer.fmtF(probs[i], 4)} on ${escapeHtml(labels[i])}`).join(', ')
            + `; weights over masked keys sum to ${explorer.fmtG(masked, 3)}.</p>`;
    }
    return pos;
};

// A control's change the page tried to draw (`drawn`: null where it could not): the link `q` with `key` set
// as the server writes it; else the link as it was, and the redraw port sent: the server redraws.
const drawnOrServer = (drawn, key, value, q) => {
    if (drawn !== null) return explorer.withParam(q, key, value);
    explorer.send('redraw', key);
    return q;
};

// The query box's change (typed, a click, presentation mode's keys).
explorer.queryRow = (v, q) => drawnOrServer(explorer.drawQueryRow(v), 'query', v, q);

// The layer box's change: in the every-head grid the bars are drawn from that layer's head-0 panel on the
// page (nothing else in the view depends on the layer), in a one-head view that holds it the layer's panel
// is shown (explorer.drawPanel); elsewhere the server redraws, as for queryRow.
explorer.layerPick = (layer, v, q) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const query = gd && gd.layout && gd.layout.meta && gd.layout.meta.query;
    const drawn = query && query.selected >= 0 ? explorer.drawPanel({layer}, v, q) : explorer.drawQueryRow(v, layer);
    return drawnOrServer(drawn, 'layer', layer, q);
};

// A pick of the values radio, the layer or the head in a one-head view that holds the model's other panels
// hidden (explorer.views.attention.panels_on_page): the panel of `want` ({values, layer, head}, the rest as shown)
// shown, its colour scale fitted (the colour radio's kind, from the link `q`) in its own look (trace meta
// `colour`), the title, the bars and their sentence redrawn. Returns true, or null where the page does not
// hold it (the grid, to or from it, another tab, long sequences): then the server redraws.
explorer.drawPanel = (want, v, q) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta;
    const query = meta && meta.query;
    if (!query || !meta.colour || query.selected < 0 || !Number.isInteger(v) || v < -1
        || !gd.getClientRects().length || document.querySelector('.invalid')) return null;
    const w = {values: query.values, layer: query.layer, head: query.selected, ...want};
    if (!Number.isInteger(w.head) || w.head < 0 || !Number.isInteger(w.layer)) return null;
    const find = (values) => gd.data.map((t, i) => [t, i]).find(([t]) => t.type === 'heatmap' && t.meta && t.meta.colour
        && t.meta.values === values && t.meta.layer === w.layer && t.meta.head === w.head);
    const next = find(w.values);
    if (!next || !find('probabilities')) return null;           // the bars are that panel's probabilities
    const shown = shownHeatmaps(gd).filter(([, i]) => i !== next[1]);
    Object.assign(query, {values: w.values, layer: w.layer, head: w.head, selected: w.head});
    meta.colour = next[0].meta.colour;
    // one redraw: the panel recoloured and shown, the one shown before hidden (its data unchanged); the row
    // outline stays (every panel has the same rows, in the same place)
    const [data, layout, indices] = colourUpdate(gd, new URLSearchParams(q).get('color') || 'linear', [next]);
    // the masked pairs (and their legend entry) shown with a panel that carries them (not capped logits)
    const overlays = gd.data.map((t, i) => [t, i]).filter(([t]) => t.meta && t.meta.overlay).map(([, i]) => i);
    const keep = [...shown, ...overlays].map(() => undefined);
    for (const k of ['z', 'customdata', 'hovertemplate', 'texttemplate', 'colorbar']) data[k] = [...data[k], ...keep];
    data.visible = [true, ...shown.map(() => false), ...overlays.map(() => !!next[0].meta.masked)];
    Plotly.update(gd, data, layout, [...indices, ...shown.map(([, i]) => i), ...overlays]);
    return explorer.drawQueryRow(v, undefined, false) === null ? null : true;
};

// The head dropdown's and the values radio's change.
explorer.headPick = (head, v, q) => drawnOrServer(explorer.drawPanel({head: Number(head)}, v, q), 'head', head, q);
explorer.valuesPick = (values, v, q) => drawnOrServer(explorer.drawPanel({values}, v, q), 'values', values, q);

// presentation mode's ↑ ↓ drawn by the page (stepHead): the head sent through the head port, written into the link
explorer.headKey = (head, q) => explorer.withParam(q, 'head', head);

// presentation mode's PgUp PgDn in the every-head grid or a one-head view that holds the other layers: the
// layer stepped on the page (stops at the ends)
explorer.stepLayer = (delta) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta && gd.layout.meta.query;
    const box = document.querySelector('#layer-box input');
    if (!meta || !box || !gd.getClientRects().length) return false;
    const layers = gd.data.filter((t) => t.type === 'heatmap' && t.meta && t.meta.head === meta.head
                                  && (meta.selected === -1 || t.meta.values === meta.values)).map((t) => t.meta.layer);
    if (meta.selected !== -1 && new Set(layers).size < 2) return false;
    const next = Math.min(Math.max(...layers), Math.max(0, meta.layer + delta));
    box.value = String(next);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    return true;
};

// presentation mode's ↑ ↓ in a one-head view that holds the next head's panel: drawn on the page
// (explorer.drawPanel), the head sent through the head port (its event writes the link and sets the head
// dropdown); past the last head or to the every-head grid the server steps it. True when drawn.
explorer.stepHead = (delta) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta && gd.layout.meta.query;
    const row = document.querySelector('#query-row input');
    const link = document.querySelector('#query textarea, #query input');
    if (!meta || !row || !link || !explorer.ported('head') || meta.selected < 0) return false;
    const next = meta.selected + delta;                       // -1, the every-head grid: the server's
    if (explorer.drawPanel({head: next}, Number(row.value), link.value) === null) return false;
    explorer.send('head', String(next));
    return true;
};

// Sets the query box to sequence position `pos` as a visitor's typing would (its change runs queryRow);
// only where the attention tab shows one head and the page holds its rows. True when set.
explorer.setQueryBox = (pos, layer, head) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta && gd.layout.meta.query;
    const box = document.querySelector('#query-row input');
    if (!meta || !box || !gd.getClientRects().length || (head !== undefined && (meta.selected !== head || meta.layer !== layer))
        || pos < 0 || pos >= meta.masked.length) return false;
    box.value = String(pos);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    return true;
};

// presentation mode's ← →: the query row stepped on the page (stops at the ends, as controls.step_view)
explorer.stepQueryRow = (delta) => {
    const gd = document.querySelector('#attention-plot .js-plotly-plot');
    const meta = gd && gd.layout && gd.layout.meta && gd.layout.meta.query;
    const box = document.querySelector('#query-row input');
    if (!meta || !box || box.value === '' || !Number.isInteger(Number(box.value))) return false;
    const v = Number(box.value), cur = v < 0 ? meta.offset : v;
    return explorer.setQueryBox(Math.min(meta.masked.length - 1, Math.max(0, cur + delta)));
};
