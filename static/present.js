// Presentation mode and the guided lesson (explorer/lesson.py). `present=1` in the link, or the Present
// button, lays the open tab's main figure (a lesson step's own figure) over the whole window in lecture fonts;
// the keys step the query row, the layer and the head (on the page where it holds them: explorer.stepQueryRow,
// stepLayer, stepHead; else one server round trip, several presses sent together), N / P walk the lesson's
// steps (each a link of the app), Esc leaves. Steps are numbered from 1 on screen and in links (`lesson=3`);
// an old link's 0-based `step=2` opens the same step. The lesson's data comes from app.py as
// explorer.lessonData = {steps: [{story, title, link, claim, tab, figure}], main: {tab: figure id}}.
window.explorer = window.explorer || {};
(() => {
    const P = explorer.present = {on: false, queue: [], busy: false};
    const BAR = 64;                     // px kept at the bottom for the claim and the key legend, at least
    // Lecture sizes: tick labels of 16 px and titles of 22 px in a 1280 x 720 window; a smaller window (a
    // browser zoomed to 150 % is 853 x 480 CSS px) scales them down, to three quarters at most, so that a
    // figure of several rows still fits — 12 px there, 18 screen pixels.
    const BASE = {font: 16, title: 22, rowGap: 84, titleGap: 34, top: 118, plainTop: 76, bottom: 80, line: 20,
                  groups: 32, legend: 14};
    let Z = BASE;
    const sizes = () => {
        const k = Math.max(0.75, Math.min(1, window.innerWidth / 1280, window.innerHeight / 720));
        return Object.fromEntries(Object.entries(BASE).map(([name, v]) => [name, Math.round(v * k)]));
    };
    const KEYS = {ArrowRight: 'query+', ArrowLeft: 'query-', ArrowDown: 'head+', ArrowUp: 'head-',
                  PageDown: 'layer+', PageUp: 'layer-'};
    const data = () => explorer.lessonData || {steps: [], main: {}};
    const params = () => new URLSearchParams(window.location.search);
    // the step shown (0-based here): `lesson` counts from 1 as the screen does, an old link's `step` from 0
    const stepIndex = () => {
        const p = params(), n = p.get('lesson'), old = p.get('step');
        const i = n !== null ? parseInt(n, 10) - 1 : old !== null ? parseInt(old, 10) : -1;
        return Number.isInteger(i) && i >= 0 && i < data().steps.length ? i : -1;
    };
    const tab = () => params().get('tab') || 'mask';

    // the page-only parameters explorer.writeUrl keeps in the address
    explorer.pageParams = () => (P.on ? '&present=1' : '') + (stepIndex() >= 0 ? '&lesson=' + (stepIndex() + 1) : '');

    // the figure presented: the lesson step's own (when its tab is open), else the tab's main figure
    P.figureId = () => {
        const st = data().steps[stepIndex()];
        return st && st.tab === tab() ? st.figure : data().main[tab()];
    };
    const block = () => document.getElementById(P.figureId() || '');
    const plotOf = (el) => el && el.querySelector('.js-plotly-plot');
    const barHeight = () => Math.max(BAR, (document.getElementById('present-bar') || {}).offsetHeight || 0);

    const get = (obj, path) => path.split('.').reduce((o, k) => (o == null ? undefined : o[k]), obj);

    // The lecture look, as a relayout of the figure drawn: whole window, larger fonts, the title at the
    // top of the figure (over two lines where one would run past the window), a legend under it and the panel
    // titles under that, never on top of each other; tick labels thinned where lecture fonts would stack them.
    P.lectureLayout = (gd, width, height) => {
        const L = gd.layout || {};
        const title = typeof L.title === 'object' && L.title ? String(L.title.text || '') : String(L.title || '');
        const folded = foldTitle(title, width);
        const lines = (folded.match(/<br>/g) || []).length;        // a <sup> note under the title is a line too
        // room above the plot: the title, then a legend or column-group labels, then the panel titles
        const crowded = L.showlegend !== false || (L.annotations || []).some((a) => a.yshift);
        const grouped = L.showlegend !== false && (L.annotations || []).some((a) => a.yshift);
        // panel titles of two lines (a kernel's tile counts under its name) take a line's room more each
        const extra = Z.line * Math.max(0, ...(L.annotations || []).map((a) => (String(a.text || '').match(/<br>/g) || []).length));
        const top = (crowded ? Z.top : Z.plainTop) + (grouped ? Z.groups : 0) + (crowded ? extra : 0)
            + Math.round(Z.title * 1.2) * Math.max(0, lines - (title.includes('<sup>') ? 1 : 0));
        const u = {width: width, height: height, autosize: false, 'font.size': Z.font, 'title.font.size': Z.title,
                   'title.yref': 'container', 'title.y': 1, 'title.yanchor': 'top', 'title.pad.t': 8,
                   'margin.t': top, 'margin.b': Z.bottom, 'legend.font.size': Z.legend};
        if (folded !== title) u['title.text'] = folded;
        Object.keys(L).filter((k) => /^[xy]axis\d*$/.test(k)).forEach((k) => {
            u[k + '.tickfont.size'] = Z.font;
            if (L[k] && L[k].title && typeof L[k].title === 'object') u[k + '.title.font.size'] = Z.font;
        });
        (L.annotations || []).forEach((a, i) => { u['annotations[' + i + '].font.size'] = Z.font; });
        fitPanelTitles(L, u, width - 150);
        spreadRows(L, u, height - top - Z.bottom, extra);
        thinTicks(L, gd._fullLayout, u, width - 150, height - top - Z.bottom);
        if (L.showlegend !== false) {       // over the panel titles, and over column-group labels where there are
            const plotHeight = Math.max(100, height - top - Z.bottom);
            const above = ((L.annotations || []).some((a) => a.yshift) ? 2 * Z.line + Z.groups - 10 : Z.line + 10) + extra;
            Object.assign(u, {'legend.orientation': 'h', 'legend.x': 1, 'legend.xanchor': 'right',
                              'legend.yanchor': 'bottom', 'legend.y': 1 + above / plotHeight});
        }
        return u;
    };

    // A title too long for the window at the title's size (about 0.55 em a character) breaks at its last ' — ', ': '
    // or ' · ' that leaves the first line short enough.
    const foldTitle = (title, width) => {
        const [head, ...rest] = title.split('<br>');
        const fits = (t) => t.replace(/<[^>]+>/g, '').length * Z.title * 0.55 <= width - 40;
        if (fits(head)) return title;
        for (const sep of [' — ', ': ', ' · ', ', ']) {
            for (let at = head.lastIndexOf(sep); at > 0; at = head.lastIndexOf(sep, at - 1)) {
                if (fits(head.slice(0, at + sep.length))) {
                    return [head.slice(0, at + sep.trimEnd().length), head.slice(at + sep.length), ...rest].join('<br>');
                }
            }
        }
        return title;
    };

    // A panel's title (an annotation centred over its x axis) wider than the panel at lecture size (about
    // 0.6 em a character) is set smaller, to fit: neighbouring titles never run into each other.
    const fitPanelTitles = (L, u, plotWidth) => {
        const axes = Object.keys(L).filter((k) => /^xaxis\d*$/.test(k) && Array.isArray((L[k] || {}).domain));
        (L.annotations || []).forEach((a, i) => {
            if (a.xref !== 'paper' || a.yshift || typeof a.x !== 'number') return;
            const ax = axes.find((k) => Math.abs((L[k].domain[0] + L[k].domain[1]) / 2 - a.x) < 1e-3);
            if (!ax) return;
            const room = (L[ax].domain[1] - L[ax].domain[0]) * plotWidth + 16;
            const chars = Math.max(...String(a.text || '').split('<br>').map((t) => t.replace(/<[^>]+>/g, '').length));
            if (chars * Z.font * 0.6 > room) u['annotations[' + i + '].font.size'] = Math.max(9, Math.floor(room / (chars * 0.6)));
        });
    };

    // Tick labels in lecture fonts need about 1.3 em each along their axis: of an axis that ticks a list of
    // categories (explorer.figures._sparse_ticks) a tick closer than that to the last one kept is dropped (the
    // categories' places are plotly's own, `full`); a numeric y axis asks plotly for fewer ticks.
    const thinTicks = (L, full, u, plotWidth, plotHeight) => {
        Object.keys(L).filter((k) => /^[xy]axis\d*$/.test(k)).forEach((k) => {
            const ax = L[k] || {}, vals = ax.tickvals, text = ax.ticktext;
            const domain = u[k + '.domain'] || ax.domain || [0, 1];
            const length = (domain[1] - domain[0]) * (k[0] === 'x' ? plotWidth : plotHeight);
            if (!Array.isArray(vals) && ax.type !== 'category' && ax.type !== 'log' && k[0] === 'y') {
                u[k + '.nticks'] = Math.max(2, Math.floor(length / (Z.font * 2.2)));   // plotly's own ticks, fewer
                return;
            }
            if (!Array.isArray(vals) || vals.length < 2 || ax.showticklabels === false) return;
            const cats = ((full || {})[k] || {})._categories;
            const place = (v, i) => (Array.isArray(cats) && cats.length && cats.indexOf(v) >= 0
                ? cats.indexOf(v) / cats.length : i / vals.length) * length;
            const kept = [];
            vals.forEach((v, i) => {
                if (!kept.length || place(v, i) - place(vals[kept[kept.length - 1]], kept[kept.length - 1]) >= Z.font * 1.3) kept.push(i);
            });
            if (kept.length === vals.length) return;
            u[k + '.tickvals'] = kept.map((i) => vals[i]);
            if (Array.isArray(text)) u[k + '.ticktext'] = kept.map((i) => text[i]);
        });
    };

    // Rows of panels get room between them for the upper row's tick labels (none where it shows none) and the
    // lower row's panel titles in lecture fonts: where a gap is short, the rows are laid out again, each as tall
    // as the others, with the room each gap needs (the panel titles move with their row).
    // what a row's x tick labels take below it (about 0.7 em a character, turned -60°), at least Z.rowGap
    const labelRoom = (x) => {
        const longest = Math.max(0, ...(x.ticktext || x.tickvals || []).map((t) => String(t).length));
        return Math.max(Z.rowGap, Math.ceil(longest * Z.font * 0.7 * Math.sin(Math.PI / 3)) + Z.titleGap + 8);
    };
    const spreadRows = (L, u, plotHeight, extra) => {
        const axes = Object.keys(L).filter((k) => /^yaxis\d*$/.test(k) && Array.isArray((L[k] || {}).domain));
        const key = (k) => L[k].domain[1].toFixed(4);
        const tops = [...new Set(axes.map(key))].map(Number).sort((a, b) => b - a);
        if (tops.length < 2) return;
        const bottoms = {}, room = {};
        axes.forEach((k) => {
            const x = L['xaxis' + k.slice(5)] || {};
            bottoms[key(k)] = L[k].domain[0];
            room[key(k)] = Math.max(room[key(k)] || Z.titleGap, x.showticklabels !== false ? labelRoom(x) : Z.titleGap);
        });
        const gaps = tops.slice(0, -1).map((t) => (room[t.toFixed(4)] + extra) / plotHeight);   // under each row
        const short = tops.slice(1).some((t, i) => bottoms[tops[i].toFixed(4)] - t < gaps[i]);
        if (!short) return;
        const h = Math.max(0.05, (1 - gaps.reduce((a, b) => a + b, 0)) / tops.length);
        let y = 1;
        tops.forEach((top, i) => {
            const domain = [Math.max(0, y - h), y];
            axes.filter((k) => key(k) === top.toFixed(4)).forEach((k) => { u[k + '.domain'] = domain; });
            (L.annotations || []).forEach((a, j) => {
                if (a.yref === 'paper' && typeof a.y === 'number' && Math.abs(a.y - top) < 1e-3) {
                    u['annotations[' + j + '].y'] = domain[1];
                }
            });
            y = domain[0] - (gaps[i] || 0);
        });
    };

    const styled = (gd, w, h) => gd.layout && gd.layout.height === h && gd.layout.width === w
        && get(gd.layout, 'font.size') === Z.font;

    P.apply = () => {
        document.querySelectorAll('.present-focus').forEach((el) => {
            if (el !== block()) el.classList.remove('present-focus');
        });
        const el = block();
        if (!P.on || !el) return;
        if (!el.classList.contains('present-focus')) el.classList.add('present-focus');
        const gd = plotOf(el);
        if (!gd || !window.Plotly || !gd.layout || !gd._fullLayout) return;
        Z = sizes();
        document.body.style.setProperty('--present-bar', barHeight() + 'px');
        const w = Math.floor(el.clientWidth - 16), h = Math.floor(window.innerHeight - barHeight() - 8);
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

    // `keepAddress`: the address already says so (the browser's Back or Forward went to it)
    P.enter = (keepAddress) => {
        P.on = true;
        document.body.classList.add('presenting');
        if (keepAddress !== true) rewriteUrl();
        P.bar();
        P.apply();
    };
    P.leave = (keepAddress) => {
        P.on = false;
        document.body.classList.remove('presenting');
        restore();
        if (keepAddress !== true) rewriteUrl();
        P.bar();
    };

    // keys pressed while a step is on its way are sent together with the next one
    P.flush = () => {
        if (P.busy || !P.queue.length || !explorer.ported('keys')) return;
        P.busy = true;
        explorer.send('keys', P.queue.splice(0, P.queue.length).join(','));     // app.page_port
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
            claim.append(text('span', 'present-story', st.story + ' · step ' + (i + 1) + ' of ' + data().steps.length
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

    // the lesson's steps under the title open in this tab (Gradio's Markdown opens its links in a new one):
    // a class follows one window, and Back returns to the step before
    document.addEventListener('click', (ev) => {
        const a = ev.target && ev.target.closest && ev.target.closest('#lesson-strip a');
        if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return;
        ev.preventDefault();
        window.location.assign(a.getAttribute('href'));
    }, true);

    // a step opened on the normal page: its figure scrolled into view once drawn (once: the visitor scrolls on)
    let stepShown = false;
    const showStep = () => {
        const st = data().steps[stepIndex()];
        const el = st && st.tab === tab() && !stepShown ? document.getElementById(st.figure) : null;
        if (!el || !el.querySelector('.js-plotly-plot .main-svg')) return;
        stepShown = true;
        el.scrollIntoView({block: 'start'});
    };

    const start = () => {
        // a link's present=1 is in the address already: the page's first write of it is the load's
        if (params().get('present') === '1' && !P.on) P.enter(true); else P.bar();
        new MutationObserver(() => { if (P.on) P.apply(); else showStep(); }).observe(document.body, {childList: true, subtree: true});
        window.addEventListener('resize', () => P.apply());
    };
    if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
