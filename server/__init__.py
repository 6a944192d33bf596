"""The server floor: what serves many visitors at once, between explorer/ (plain functions of Settings)
and app.py (the page's layout and wiring). Who is asking (visitors.py, browsers.py), the front door and
the disk it guards (front_door.py, disk.py), the refused's wait (backoff.py), the lanes and their admission
(admission.py, lanes.py, fair_queue.py, shares.py), the
event handlers by job (guard.py, links.py, endpoints.py, timing_events.py with timing_runs.py), where
the app meets Gradio's internals (gradio_patches.py), each visitor's uploaded weights (uploads.py),
the process model views are drawn in beside the server's (drawing.py, its entry point
drawing_process.py), and the process's memory budget and thread policy (memory.py). The localhost
launcher the tests and benchmarks drive the app with is harness.localhost, off this floor."""
