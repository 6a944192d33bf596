// The link box's copy icon copies the whole address of this view (with its tab), not the bare query
// string the box shows: Gradio's own copy runs first, this one replaces the clipboard's text after it.
window.explorer = window.explorer || {};
document.addEventListener('click', (ev) => {
    const button = ev.target && ev.target.closest && ev.target.closest('#query button');
    if (!button || !navigator.clipboard) return;
    setTimeout(() => navigator.clipboard.writeText(window.location.href).catch(() => {}), 50);
}, true);
