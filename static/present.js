// Presentation mode and the guided lesson (explorer/lesson.py). `present=1` in the link, or the Present
// button, lays the open tab's main figure over the whole window in lecture fonts; the keys step the query
// row, the layer and the head (on the page where it holds them: explorer.stepQueryRow, stepLayer, stepHead; else
// one server round trip, several presses sent together), N / P walk the
// lesson's steps (each a link of the app), Esc leaves. The lesson's data comes from app.py as
// explorer.lessonData = {steps: [{story, title, link, claim, tab, figure}], main: {tab: figure id}}.
window.explorer = window.explorer || {};
(() => {
    const P = explorer.present = {on: false, queue: [], busy: false, pendingKey: ''};
    const BAR = 64;                     // px kept at the bottom for the claim and the key legend
    const FONT = 16, TITLE = 22;        // lecture fonts: tick labels 16 px at any window size
    const KEYS = {ArrowRight: 'query+', ArrowLeft: 'query-', ArrowDown: 'head+', ArrowUp: 'head-',
                  PageDown: 'layer+', PageUp: 'layer-'};
    const data = () => explorer.lessonData || {steps: [], main: {}};
    const params = () => new URLSearchParams(window.location.search);
    const stepIndex = () => {
        const s = params().get('step');
        const i = s === null ? -1 : parseInt(s, 10);
        return Number.isInteger(i) && i >= 0 && i < data().steps.length ? i : -1;
    };
    const tab = () => params().get('tab') || 'mask';

    // the page-only parameters explorer.writeUrl keeps in the address
    explorer.pageParams = () => (P.on ? '&present=1' : '') + (stepIndex() >= 0 ? '&step=' + stepIndex() : '');

    // the figure presented: the lesson step's own (when its tab is open), else the tab's main figure
    P.figureId = () => {
        const st = data().steps[stepIndex()];
        return st && st.tab === tab() ? st.figure : data().main[tab()];
    };
    const block = () => document.getElementById(P.figureId() || '');
    const plotOf = (el) => el && el.querySelector('.js-plotly-plot');

    const get = (obj, path) => path.split('.').reduce((o, k) => (o == null ? undefined : o[k]), obj);

    // The lecture look, as a relayout of the figure drawn: whole window, larger fonts, the title at the
    // top of the figure, a legend under it and the panel titles under that, never on top of each other.
    P.lectureLayout = (gd, width, height) => {
        const L = gd.layout || {};
        // room above the plot: the title, then a legend or column-group labels, then the panel titles
        const crowded = L.showlegend !== false || (L.annotations || []).some((a) => a.yshift);
        const top = crowded ? 118 : 76;
        const u = {width: width, height: height, autosize: false, 'font.size': FONT, 'title.font.size': TITLE,
                   'title.yref': 'container', 'title.y': 1, 'title.yanchor': 'top', 'title.pad.t': 8,
                   'margin.t': top, 'margin.b': 80, 'legend.font.size': 14};
        Object.keys(L).filter((k) => /^[xy]axis\d*$/.test(k)).forEach((k) => {
            u[k + '.tickfont.size'] = FONT;
            if (L[k] && L[k].title && typeof L[k].title === 'object') u[k + '.title.font.size'] = FONT;
        });
        (L.annotations || []).forEach((a, i) => { u['annotations[' + i + '].font.size'] = FONT; });
        spreadRows(L, u, height - top - 80);
        if (L.showlegend !== false) {
            const plotHeight = Math.max(100, height - top - 80);
            Object.assign(u, {'legend.orientation': 'h', 'legend.x': 1, 'legend.xanchor': 'right',
                              'legend.yanchor': 'bottom', 'legend.y': 1 + 30 / plotHeight});
        }
        return u;
    };

    // Rows of panels get room between them for the upper row's tick labels and the lower row's panel
    // titles in lecture fonts: a lower row gives up the top of its domain (its title annotations move along).
    const ROW_GAP = 84;
    const spreadRows = (L, u, plotHeight) => {
        const axes = Object.keys(L).filter((k) => /^yaxis\d*$/.test(k) && Array.isArray((L[k] || {}).domain));
        const tops = [...new Set(axes.map((k) => L[k].domain[1].toFixed(4)))].map(Number).sort((a, b) => b - a);
        const bottoms = {};
        axes.forEach((k) => { bottoms[L[k].domain[1].toFixed(4)] = L[k].domain[0]; });
        for (let i = 1; i < tops.length; i++) {
            const above = bottoms[tops[i - 1].toFixed(4)], top = tops[i], bottom = bottoms[top.toFixed(4)];
            const lack = (ROW_GAP - (above - top) * plotHeight) / plotHeight;
            if (lack <= 0) continue;
            const newTop = Math.max(bottom + 0.05, top - lack);
            axes.filter((k) => L[k].domain[1].toFixed(4) === top.toFixed(4))
                .forEach((k) => { u[k + '.domain'] = [L[k].domain[0], newTop]; });
            (L.annotations || []).forEach((a, j) => {
                if (a.yref === 'paper' && typeof a.y === 'number' && Math.abs(a.y - top) < 1e-3) {
                    u['annotations[' + j + '].y'] = newTop;
                }
            });
        }
    };

    const styled = (gd, w, h) => gd.layout && gd.layout.height === h && gd.layout.width === w
        && get(gd.layout, 'font.size') === FONT;

    P.apply = () => {
        document.querySelectorAll('.present-focus').forEach((el) => {
            if (el !== block()) el.classList.remove('present-focus');
        });
        const el = block();
        if (!P.on || !el) return;
        if (!el.classList.contains('present-focus')) el.classList.add('present-focus');
        const gd = plotOf(el);
        if (!gd || !window.Plotly || !gd.layout || !gd._fullLayout) return;
        const w = Math.floor(el.clientWidth - 16), h = Math.floor(window.innerHeight - BAR - 8);
        if (styled(gd, w, h)) return;
        const u = P.lectureLayout(gd, w, h);
        if (!gd.__presentSaved) {
            gd.__presentSaved = {};
            Object.keys(u).forEach((k) => { const v = get(gd.layout, k.replace(/\[(\d+)\]/g, '.$1'));
                                            gd.__presentSaved[k] = v === undefined ? null : v; });
        }
        window.Plotly.relayout(gd, u).catch((e) => console.warn('presentation layout:', e));
    };

    const restore = () => {
        document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
            if (gd.__presentSaved && window.Plotly) window.Plotly.relayout(gd, gd.__presentSaved).catch(() => {});
            delete gd.__presentSaved;
        });
        document.querySelectorAll('.present-focus').forEach((el) => el.classList.remove('present-focus'));
    };

    // the address follows (explorer.writeUrl keeps pageParams and mends plotly's url(#...) references)
    const rewriteUrl = () => {
        const box = document.querySelector('#query textarea, #query input');
        if (box && explorer.writeUrl) explorer.writeUrl(box.value, tab());
    };

    P.enter = () => {
        P.on = true;
        document.body.classList.add('presenting');
        rewriteUrl();
        P.bar();
        P.apply();
    };
    P.leave = () => {
        P.on = false;
        document.body.classList.remove('presenting');
        restore();
        rewriteUrl();
        P.bar();
    };

    // keys pressed while a step is on its way are sent together with the next one
    P.flush = () => {
        if (P.busy || !P.queue.length) return;
        const button = document.getElementById('present-key');
        if (!button) return;
        P.busy = true;
        P.pendingKey = P.queue.splice(0, P.queue.length).join(',');
        button.click();
    };
    P.done = () => { P.busy = false; P.flush(); };

    P.go = (delta) => {
        const steps = data().steps;
        const i = stepIndex() + delta;
        if (i < 0 || i >= steps.length) return;
        window.location.assign(steps[i].link + (P.on ? '&present=1' : ''));
    };

    document.addEventListener('keydown', (ev) => {
        if (!P.on || ev.altKey || ev.ctrlKey || ev.metaKey) return;
        const t = ev.target;
        if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
        if (ev.key === 'Escape') { ev.preventDefault(); P.leave(); return; }
        if (ev.key === 'n' || ev.key === 'N') { ev.preventDefault(); P.go(1); return; }
        if (ev.key === 'p' || ev.key === 'P') { ev.preventDefault(); P.go(-1); return; }
        if ((ev.key === 'r' || ev.key === 'R') && tab() === 'timing') {      // the Timing tab's Run, measured live
            const run = [...document.querySelectorAll('button')].find((b) => b.textContent.trim() === 'Run');
            if (run && !run.disabled) { ev.preventDefault(); run.click(); }
            return;
        }
        if (KEYS[ev.key]) {
            ev.preventDefault();
            const key = KEYS[ev.key], delta = key.endsWith('+') ? 1 : -1;     // drawn on the page where it can be
            const onPage = {query: explorer.stepQueryRow, layer: explorer.stepLayer, head: explorer.stepHead}[key.slice(0, -1)];
            if (!P.busy && !P.queue.length && onPage(delta)) return;
            P.queue.push(KEYS[ev.key]);
            P.flush();
        }
    }, true);

    // the bar under the figure: the lesson step's claim, previous / next, and (presenting) the keys
    const text = (tag, cls, s) => { const e = document.createElement(tag); e.className = cls; e.textContent = s;
                                    return e; };
    P.bar = () => {
        let bar = document.getElementById('present-bar');
        const i = stepIndex(), st = data().steps[i];
        if (!P.on && !st) { if (bar) bar.remove(); return; }
        if (!bar) {
            bar = document.createElement('div');
            bar.id = 'present-bar';
            document.body.appendChild(bar);
        }
        bar.replaceChildren();
        if (st) {
            const claim = text('div', 'present-claim', '');
            claim.id = 'lesson-claim';
            claim.append(text('span', 'present-story', st.story + ' · ' + (i + 1) + '/' + data().steps.length
                                                         + ' · ' + st.title + ': '), st.claim);
            bar.append(claim);
            for (const [label, delta] of [['◀ P', -1], ['N ▶', 1]]) {
                const b = text('button', 'present-nav', label);
                b.disabled = !data().steps[i + delta];
                b.onclick = () => P.go(delta);
                bar.append(b);
            }
        }
        if (P.on) {
            const keys = text('div', 'present-keys', '← → query row · ↑ ↓ head · PgUp PgDn layer');
            keys.append(document.createElement('br'), (tab() === 'timing' ? 'R run · ' : '')
                        + (data().steps.length ? 'N P lesson step · ' : '') + 'Esc leave');
            bar.append(keys);
        } else {
            const b = text('button', 'present-nav', 'Present');
            b.onclick = P.enter;
            bar.append(b);
        }
    };

    const start = () => {
        if (params().get('present') === '1' && !P.on) P.enter(); else P.bar();
        new MutationObserver(() => { if (P.on) P.apply(); }).observe(document.body, {childList: true, subtree: true});
        window.addEventListener('resize', () => P.apply());
    };
    if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
