// The page's own scripts, loaded once into the page's <head> by app.py; Gradio events call them by
// name (js="(q, tab) => explorer.writeUrl(q, tab)"). No server round trip in here.
window.explorer = window.explorer || {};

// The address bar follows the controls and the open tab, so a copied link reopens the same view.
// Plotly writes colour-bar gradients and clip paths as url('<page address>#id') when the page has a
// <base> element (Gradio's has), and keeps that address for later redraws: once the address changes
// they point into another document and draw nothing (a blank colour bar). Both are moved to the new
// address here.
explorer.writeUrl = (q, tab) => {
    const before = window.location.href.split('#')[0];
    const u = new URL(window.location);
    u.search = q + (tab && tab !== 'mask' ? '&tab=' + encodeURIComponent(tab) : '')
        + (explorer.pageParams ? explorer.pageParams() : '');     // presentation mode's (static/present.js)
    window.history.replaceState(null, '', u);
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

// Point and see: a click on a cell of the attention or mask heatmap picks its query row. gr.Plot has no
// click event, so plotly's own plotly_click is heard on each plot as it is drawn; the row's first
// sequence position (the trace's meta.rows, written by explorer.figures) goes into the query control
// as if typed, and the usual control change validates it, redraws (the row outlined) and moves the link.
explorer.pickRow = () => {
    const listen = () => {
        for (const id of ['attention-plot', 'mask-plot']) {
            const gd = document.querySelector('#' + id + ' .js-plotly-plot');
            if (!gd || !gd.on || gd.__pickRow) continue;
            gd.__pickRow = true;
            gd.on('plotly_click', (ev) => {
                const pt = ev && ev.points && ev.points[0];
                const rows = pt && pt.data && pt.data.meta && pt.data.meta.rows;
                const row = pt && (Array.isArray(pt.pointNumber) ? pt.pointNumber[0] : pt.pointNumber);
                const box = document.querySelector('#query-row input');
                if (!rows || rows[row] === undefined || !box) return;
                box.value = String(rows[row]);
                box.dispatchEvent(new Event('input', {bubbles: true}));
            });
        }
    };
    new MutationObserver(listen).observe(document.body, {childList: true, subtree: true});
    listen();
};

explorer.copyLink = () => { navigator.clipboard && navigator.clipboard.writeText(window.location.href); };
