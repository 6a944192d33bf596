"""The GPU session (benchmarks/gpu_session.sh) without a GPU: the wheels it carries are what pip resolves fresh
for the device's Python (3.12) less what the device image has; they install into a python3 that is itself a
venv (as the device's is) ahead of its own packages, with their .pth files run and nothing of it shadowed; the
preflight finds every API the GPU path calls; test outcomes reach $OUT as they finish; the compile caches
are kept under the parked folder; the stand-ins of FA4's call match the real 4.0.0b36 wheel."""
import ast
import base64
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_preflight

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "benchmarks" / "gpu-wheels.txt"
SESSION = ROOT / "benchmarks" / "gpu_session.sh"
PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                    "manylinux_2_17_x86_64", "manylinux2014_x86_64") for arg in ("--platform", tag)]
# the device image's Python packages (the device tool's KINDS.md, as read on a machine on 2026-11-17)
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
IMAGE_TORCH = "2.11.0+deviceimage"     # a metadata-only stand-in: the image's torch is not downloaded
# torch 2.11.0's own Linux requirement on a package the carried wheels need too (cuda-bindings>=12.8)
IMAGE_TORCH_REQUIRES = ["cuda-bindings<14,>=13.0.3"]
OFFLINE = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
           "Network is unreachable", "Max retries exceeded", "ConnectTimeout", "ReadTimeout")


def pins() -> dict[str, str]:
    carried, _ = gpu_preflight.lock_lines(LOCK)
    return {gpu_preflight.canonical(re.split(r"[\[=]", line, 1)[0]): line.split("==", 1)[1] for line in carried}


def stand_in_wheel(directory: Path, name: str, version: str, requires=(), files=None) -> Path:
    """A py3-none-any wheel with `files` ({path: text}) and `requires` as its dependencies; with no files it is
    metadata only, which pip resolves against as if it were installed."""
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {**(files or {}), f"{info}/METADATA": meta,
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()  # noqa: E731
    files[f"{info}/RECORD"] = "".join(f"{p},sha256={digest(c)},{len(c)}\n" for p, c in files.items()) + f"{info}/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, c in files.items():
            z.writestr(p, c)
    return path


def pip(*args, timeout=600) -> subprocess.CompletedProcess:
    """`python -m pip args`; skips the test when the package registry cannot be reached from here."""
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--timeout", "30", "--retries", "1"],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 and any(s in done.stderr for s in OFFLINE):
        pytest.skip("the package registry is unreachable from here: " + done.stderr.strip().splitlines()[-1][:200])
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def session(step: str, env: dict, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SESSION), step], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_lock_lists_each_carried_wheel_once_with_a_pin_and_nothing_the_image_has():
    carried, omitted = gpu_preflight.lock_lines(LOCK)
    assert all("==" in line for line in carried) and len(pins()) == len(carried), carried
    assert not set(pins()) & (IMAGE | set(omitted)), set(pins()) & (IMAGE | set(omitted))


def resolve(tmp_path, *requirements) -> dict[str, str]:
    """pip's resolve of `requirements` for the device's Python with the image's torch (a metadata stand-in):
    {name: version} of everything it would install."""
    stand_in_wheel(tmp_path, "torch", IMAGE_TORCH, requires=IMAGE_TORCH_REQUIRES)
    report = pip("install", "--dry-run", "--quiet", "--report", "-", "--ignore-installed",
                 "--target", str(tmp_path / "target"), "--find-links", str(tmp_path), *PLATFORM,
                 *requirements, f"torch=={IMAGE_TORCH}")
    return {gpu_preflight.canonical(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.stdout)["install"]}


@pytest.mark.slow
def test_the_lock_installs_beside_the_image_and_carries_all_it_needs(tmp_path):
    """pip resolves FA4 with the lock's versions pinned and the image's torch as given (which holds the image's
    cuda-bindings 13): it finds a resolution — a lock pinning a version the image's packages exclude, as
    cuda-bindings 12.9.4 once was, fails here — and what it installs, less the image and the lock's "not carried"
    lines, is exactly the lock: nothing the carried wheels need is missing, nothing is carried twice."""
    carried, omitted = gpu_preflight.lock_lines(LOCK)
    resolved = resolve(tmp_path, *carried)
    fresh = {n: v for n, v in resolved.items() if n not in IMAGE and n not in omitted}
    assert fresh == pins(), (f"benchmarks/gpu-wheels.txt does not install as it is: "
                             f"{ {n: v for n, v in fresh.items() if pins().get(n) != v} }, "
                             f"not resolved {sorted(set(pins()) - set(fresh))}")
    assert set(omitted) <= set(resolved), f"'not carried' lines name wheels pip no longer adds: {set(omitted) - set(resolved)}"


@pytest.mark.slow
def test_the_lock_carries_what_a_fresh_resolve_carries(tmp_path):
    """pip resolves the lock's roots alone (no pin but their own), as a new lock would be made: the wheels it
    adds, less the image, are the lock's wheels — a dependency added or dropped upstream fails here. A newer
    release of a wheel the lock already carries is reported (a warning naming the versions), not failed: the
    locked versions still install together (the test above), and CI must not turn red on someone else's upload."""
    carried, omitted = gpu_preflight.lock_lines(LOCK)
    resolved = resolve(tmp_path, *gpu_preflight.lock_roots(LOCK))
    fresh = {n: v for n, v in resolved.items() if n not in IMAGE and n not in omitted}
    assert set(fresh) == set(pins()), (f"benchmarks/gpu-wheels.txt is stale: pip now adds {sorted(set(fresh) - set(pins()))}"
                                       f" and no longer {sorted(set(pins()) - set(fresh))}")
    newer = {n: (pins()[n], v) for n, v in fresh.items() if v != pins()[n]}
    if newer:
        import warnings
        warnings.warn(f"newer releases than benchmarks/gpu-wheels.txt carries (locked, fresh): {newer}")


@pytest.mark.slow
def test_install_into_a_venv_python_puts_the_carried_wheels_first(tmp_path):
    """The device's python3 is itself a venv holding torch. Here: a venv made from this interpreter (itself a
    venv) holding a stand-in torch, an old copy of a carried package, a sitecustomize and a .pth. After
    `park` and `install`, that python3 (no PYTHONPATH) imports the carried copy, runs the carried .pth (as
    the CuTe DSL's puts `cutlass` on the path), and still sees its own torch, sitecustomize and .pth."""
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, timeout=120)    # with pip, as the image
    python3 = image / "bin" / "python3"
    own = Path(subprocess.run([str(python3), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip())
    (own / "torch").mkdir()
    (own / "torch" / "__init__.py").write_text("__version__ = '2.11.0+image'\n")
    (own / "carried").mkdir()
    (own / "carried" / "__init__.py").write_text("origin = 'image'\n")
    (own / "sitecustomize.py").write_text("import sys; sys.image_sitecustomize = True\n")
    (own / "image-extra.pth").write_text("import sys; sys.image_pth = True\n")
    wheels = tmp_path / "whl" / "all"
    wheels.mkdir(parents=True)
    stand_in_wheel(wheels, "carried", "2.0", files={"carried/__init__.py": "origin = 'carried'\n"})
    stand_in_wheel(wheels, "dsl", "1.0", files={
        "dsl_packages.pth": "import sys, os, dsl; sys.path.insert(0, os.path.join(dsl.__path__[0], 'packages'))\n",
        "dsl/__init__.py": "", "dsl/packages/cutlasslike.py": "found = True\n"})
    env = {**os.environ, "PATH": f"{image / 'bin'}:{os.environ['PATH']}", "WHL_DIR": str(tmp_path / "whl"),
           "GPU_SESSION_DIR": str(tmp_path / "park")}
    env.pop("PYTHONPATH", None)
    for step in ("pack", "install"):
        done = session(step, env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    probe = ("import json, sys, torch, carried, cutlasslike; print(json.dumps([torch.__version__, carried.origin, "
             "getattr(sys, 'image_sitecustomize', False), getattr(sys, 'image_pth', False)]))")
    seen = subprocess.run([str(python3), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert seen.returncode == 0, seen.stderr[-2000:]
    assert json.loads(seen.stdout) == ["2.11.0+image", "carried", True, True]


def test_the_views_wheel_travels_with_its_requirements_met():
    """plotly is a root of the lock (the device image has none, and reaches no registry), and each requirement of
    the plotly installed here (narwhals, packaging) is carried too or in the image, which keeps the image's copy;
    the lock's inline comments are no part of a requirement."""
    import importlib.metadata as metadata
    from packaging.requirements import Requirement
    assert [r.split("==")[0] for r in gpu_preflight.lock_roots(LOCK)] == ["flash-attn-4[cu13]", "plotly"]
    assert pins()["plotly"] == metadata.version("plotly")
    needs = [Requirement(r) for r in metadata.requires("plotly")]
    needs = {gpu_preflight.canonical(r.name) for r in needs if r.marker is None or r.marker.evaluate({"extra": ""})}
    assert needs == {"narwhals", "packaging"} and needs <= IMAGE | set(pins())
    assert all(" " not in line and "#" not in line for line in gpu_preflight.lock_lines(LOCK)[0])


def test_preflight_finds_every_api_here_and_names_what_is_missing(tmp_path):
    """Every torch API the GPU path calls resolves in this torch (the list has no typo or stale name), and an
    absent API, a missing keyword and an unmet or missing requirement of a carried wheel are each reported."""
    assert gpu_preflight.missing_apis(gpu_preflight.TORCH_APIS) == []
    assert gpu_preflight.missing_apis([("torch.no_such_api", ()), ("torch.compile", ("fullgraph", "no_such_kw"))]) == [
        "torch.no_such_api: missing (AttributeError: module 'torch' has no attribute 'no_such_api')",
        "torch.compile: takes no no_such_kw"]
    lock = tmp_path / "lock.txt"
    lock.write_text("pytest==0\nno-such-dist==1.0\n# not carried: pluggy (a test)\n")
    assert gpu_preflight.unmet_requirements(lock) == ["no-such-dist: not installed"]      # pytest's needs met


def test_streamed_outcomes_survive_a_killed_run(tmp_path):
    """pytest with benchmarks/pytest_stream.py: each finished test is one JSON line on disk at once, with its
    record_property values, though the run is then killed (a device call's time limit) before pytest exits."""
    (tmp_path / "test_three.py").write_text(
        "import time, pytest\n"
        "def test_measures(record_property):\n    record_property('softcap_tanh_rel_err', 4e-4)\n"
        "def test_fails():\n    assert 1 == 2, 'the reason'\n"
        "def test_skips():\n    pytest.skip('needs CUDA')\n"
        "def test_hangs():\n    time.sleep(600)\n")
    stream = tmp_path / "out.jsonl"
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.pytest_stream",
                            "--stream-jsonl", str(stream), "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not stream.exists() or len(stream.read_text().splitlines()) < 3):
            time.sleep(0.2)
    finally:
        run.kill()
        run.wait()
    lines = [json.loads(line) for line in stream.read_text().splitlines()]
    assert [(line["nodeid"].split("::")[1], line["outcome"]) for line in lines] == [
        ("test_measures", "passed"), ("test_fails", "failed"), ("test_skips", "skipped")]
    assert lines[0]["properties"] == {"softcap_tanh_rel_err": 4e-4} and "the reason" in lines[1]["message"]


@pytest.mark.slow
def test_gpu_session_writes_its_results_to_out_as_it_goes(tmp_path):
    """The device call, run here without a GPU (a stand-in nvidia-smi): it says why fa4 is not installed, runs
    the preflight (compile caches under the parked folder, FA4's switched on) and the GPU tests (skipped
    here), and leaves its log, the preflight, the streamed outcomes, the test log and the JUnit file in
    $OUT, within the call's budget."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'no GPU: a test stand-in'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')      # this interpreter
    (bin_dir / "python3").chmod(0o755)
    out, park = tmp_path / "out", tmp_path / "park"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "CALL_BUDGET_S": "240",
           "GPU_SESSION_DIR": str(park), "WHL_DIR": str(tmp_path / "no-wheels"), "EXPLORER_COMMIT": "c0ffee1"}
    done = session("tests", env)
    log = (out / "session.log").read_text()
    assert "NOT INSTALLED" in log and "fa4: " in log and "== done in" in log, log[-2000:]
    caches = json.loads((out / "preflight.json").read_text())["caches"]
    assert caches.pop("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1", caches
    assert set(caches) == set(gpu_preflight.CACHE_ENV) - {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"}
    assert all(Path(d).is_relative_to(park / "cache") for d in caches.values()), caches
    outcomes = [json.loads(line) for line in (out / "gpu-tests.jsonl").read_text().splitlines()]
    assert outcomes and {o["outcome"] for o in outcomes} == {"skipped"}
    assert (out / "gpu-tests.log").stat().st_size > 0 and "<testsuite" in (out / "gpu-tests.xml").read_text()
    session_json = json.loads((out / "session.json").read_text())      # what the Flash tab pairs the tests by
    assert session_json["commit"] == "c0ffee1" and session_json["device"] == "no GPU: a test stand-in"
    assert session_json["step"] == "tests"
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def fa4_wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The real flash-attn-4 4.0.0b36 wheel (pure Python, ~0.5 MB), read, never installed."""
    carried, _ = gpu_preflight.lock_lines(LOCK)
    fa4 = next(line for line in carried if line.startswith("flash-attn-4"))
    directory = tmp_path_factory.mktemp("fa4")
    pip("download", "--no-deps", "--quiet", "-d", str(directory), fa4.replace("[cu13]", ""))
    (wheel,) = directory.glob("flash_attn_4-*.whl")
    return zipfile.ZipFile(wheel)


def function_args(source: str, name: str) -> list[tuple[str, str]]:
    """(argument, its default as source text or '') of the top-level function `name` in `source`."""
    (fn,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name]
    args = fn.args.args
    defaults = [""] * (len(args) - len(fn.args.defaults)) + [ast.unparse(d) for d in fn.args.defaults]
    return [(a.arg, d) for a, d in zip(args, defaults)]


@pytest.mark.slow
def test_the_stand_ins_and_the_session_follow_the_real_fa4_wheel(fa4_wheel):
    """What the CPU tests assume of FA4 is what 4.0.0b36 ships: flash_attn_func's arguments and defaults are the
    stand-in's, lse is allocated only for return_lse or an input that requires grad, BlockSparseTensorsTorch
    has the stand-in's fields, and the compile cache reads the variables gpu_session.sh sets."""
    from test_attention import ReferenceBlockSparseTensorsTorch, reference_fa4_func
    interface = fa4_wheel.read("flash_attn/cute/interface.py").decode()
    stand_in = [(name, "" if p.default is p.empty else repr(p.default))
                for name, p in inspect.signature(reference_fa4_func).parameters.items()]
    assert function_args(interface, "flash_attn_func") == stand_in
    fwd = ast.get_source_segment(interface, [n for n in ast.parse(interface).body
                                             if isinstance(n, ast.FunctionDef) and n.name == "_flash_attn_fwd"][0])
    assert re.search(r"if requires_grad or return_lse\s+else None", fwd), "FA4's lse condition changed: see the stand-in"
    sparsity = ast.parse(fa4_wheel.read("flash_attn/cute/block_sparsity.py").decode())
    (cls,) = [n for n in sparsity.body if isinstance(n, ast.ClassDef) and n.name == "BlockSparseTensorsTorch"]
    assert [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)] == list(ReferenceBlockSparseTensorsTorch._fields)
    cache = fa4_wheel.read("flash_attn/cute/cache_utils.py").decode()
    script = SESSION.read_text()
    for name in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        assert f'os.getenv("{name}"' in cache and f"{name}=" in script, name


def session_plan(tmp_path, step="all", **env) -> list[tuple[int, list[str]]]:
    """`gpu_session.sh <step>` with DRY_RUN=1 here (a stand-in nvidia-smi, this interpreter as python3): the
    commands it would run on the device, in order, each with the seconds it would be given."""
    import shlex
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'no GPU: a test stand-in'\n")
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for tool in ("nvidia-smi", "python3"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "DRY_RUN": "1",
           "CALL_BUDGET_S": "540", "GPU_SESSION_DIR": str(tmp_path / "park"), "WHL_DIR": str(tmp_path / "no-wheels"), **env}
    done = session(step, env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    plan = [re.match(r"DRY RUN \((\d+) s\): (.*)", line) for line in done.stdout.splitlines()]
    return [(int(m[1]), shlex.split(m[2])) for m in plan if m]


def test_a_bench_call_can_time_one_trunk_preset_alone(tmp_path):
    """The seventh session's trunk step spent its 100 s on phoenix-prod and never reached phoenix-2026: a second
    call names the presets (TRUNK_PRESETS) and skips the steps it does not want (their seconds at 0)."""
    plan = session_plan(tmp_path, "bench", TRUNK_PRESETS="phoenix-2026", KERNELS_S="0", VIEWS_S="0",
                        VIEW_COST_S="0", TRUNK_S="150", CALL_BUDGET_S="250")
    (seconds, trunk), *rest = plan
    assert trunk[trunk.index("--parts") + 1] == "trunk" and seconds <= 250
    assert [a for a in trunk if a.startswith("--preset")] == ["--preset=phoenix-2026"]
    assert all(cmd[2] == "benchmarks.attention" and cmd[cmd.index("--parts") + 1] == "attention"      # what is left:
               and cmd[cmd.index("--preset") + 1] != "phoenix-prod" for _, cmd in rest)            # other presets


def view_cost_args(args: list[str], monkeypatch) -> dict:
    """benchmarks.view_cost run with `args` here, its processes and its file stubbed: what it would measure and
    where it would write."""
    import torch

    from benchmarks import view_cost
    seen = dict(presets=[], device=None, out=None, budget_s=None)

    def one(root, preset, inner, device):
        seen["presets"].append(preset)
        seen["device"] = device
        return {"cases": {}}

    def write(a, *rest):
        seen.update(out=view_cost.Path(a.out_dir) / "x.json", budget_s=a.budget_s)
        return seen["out"], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(view_cost, "one_production", one)
    monkeypatch.setattr(view_cost, "write_results", write)
    monkeypatch.setattr(view_cost, "git_commit", lambda: "stub")
    view_cost.main(args + ["--repeats", "1"])
    return seen


def test_the_session_plans_tests_the_evidence_then_the_rest_within_its_budget(tmp_path, monkeypatch):
    """`all`, dry: the GPU tests (50 % of what is left), the attention at phoenix-prod (the Flash tab's headline:
    a session whose tests ran long once left it no time behind the views), the trunk at phoenix-prod and
    phoenix-2026, every view at five presets, every view at the production presets split into build, forward,
    first and warm calls (view_cost --production, into $OUT), then the other attention presets, each within the
    call's 540 s; every benchmark command's arguments are ones the CLI takes (run through its own parser with the
    measurements stubbed)."""
    from benchmarks import attention as cli
    plan = session_plan(tmp_path)
    assert [cmd[2] for _, cmd in plan] == (["pytest"] + ["benchmarks.attention"] * 3 + ["benchmarks.view_cost"]
                                           + ["benchmarks.attention"] * 3)
    assert "-m" in plan[0][1] and "gpu" in plan[0][1] and plan[0][0] <= 0.50 * 540
    assert all(s <= 540 for s, _ in plan)
    kernels = plan[1][1]     # capped (150 s): the sixth session's, given all that was left, left the trunk 50 s
    assert "--preset" in kernels and kernels[kernels.index("--budget-s") + 1] == "150"
    (seconds, view_cost_cmd), = [(s, cmd) for s, cmd in plan if cmd[2] == "benchmarks.view_cost"]
    measured = view_cost_args(view_cost_cmd[3:], monkeypatch)
    assert measured["presets"] == ["phoenix-prod", "phoenix-2026"] and measured["device"] == "cuda"
    assert measured["out"].parent == tmp_path / "out" / "results" and measured["budget_s"] < seconds
    plan = [(s, cmd) for s, cmd in plan if cmd[2] != "benchmarks.view_cost"]
    asked = []
    monkeypatch.setattr(cli.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "matmul_tflops", lambda device: 1.0)
    monkeypatch.setattr(cli, "device_name", lambda device: "a stand-in GPU")
    monkeypatch.setattr(cli, "write_results", lambda *a, **k: tmp_path / "none.json")
    monkeypatch.setattr(cli, "sweep", lambda preset, *a, **k: asked.append(("attention", preset)) or iter(()))
    monkeypatch.setattr(cli, "sweep_trunks", lambda names, *a, **k: asked.append(("trunk", *names)) or iter(()))
    monkeypatch.setattr(cli, "time_views", lambda presets, *a, **k: presets and asked.append(("views", *presets))
                        or iter(()))
    for _, cmd in plan[1:]:
        cli.main(cmd[3:])
    assert asked == [("attention", "phoenix-prod"), ("trunk", "phoenix-prod"), ("trunk", "phoenix-2026"),
                     ("views", "lecture", "phoenix-nano", "phoenix-2026-nano", "phoenix-prod", "phoenix-2026"),
                     ("attention", "phoenix-2026"), ("attention", "phoenix-prod-b256"), ("attention", "long")]
