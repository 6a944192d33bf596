"""Fixtures shared by the test modules, and the guard that keeps bit-exact comparisons honest."""
import functools
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.localhost import launch_browser, running_app

TESTS = str(Path(__file__).resolve().parent)
TOLERANCES = str(Path(__file__).resolve().parent / "tolerances.py")


# --- bit-exact comparisons of floats only through tolerances.assert_bit_exact ---------------------------

def floating(x) -> bool:
    if torch.is_tensor(x):
        return x.is_floating_point() or x.is_complex()
    try:
        return np.asarray(x).dtype.kind in "fc"
    except (ValueError, TypeError):          # ragged or not an array at all: nothing numeric to round
        return False


def refuse_if_bits_of_floats(name: str, frame, a, b) -> None:
    """Fail when `frame` is a test's (a file under tests/ other than tolerances.py) comparing floating-point
    `a` and `b` bit for bit with `name`: it must say why the bits agree (assert_bit_exact) or compare within
    the rounding bound (assert_rounding_close)."""
    caller = frame.f_code.co_filename
    if caller.startswith(TESTS) and caller != TOLERANCES and (floating(a) or floating(b)):
        raise AssertionError(
            f"{name} on floating-point values in {Path(caller).name}:{frame.f_lineno}: bits agree only for the "
            f"same computation — say which with tolerances.assert_bit_exact(got, want, because), or compare "
            f"with tolerances.assert_rounding_close")


def refuse_float_bits(name: str, compare):
    """`compare` (a, b, ...) as before, but refused on floats from a test (refuse_if_bits_of_floats)."""
    @functools.wraps(compare)
    def guarded(a, b, *args, **kwargs):
        refuse_if_bits_of_floats(name, sys._getframe(1), a, b)
        return compare(a, b, *args, **kwargs)
    return guarded


def refuse_zero_tolerance(assert_allclose):
    """np.testing.assert_allclose with rtol=0 and atol=0 is a bit-for-bit comparison too."""
    @functools.wraps(assert_allclose)
    def guarded(actual, desired, rtol=1e-07, atol=0, *args, **kwargs):
        if rtol == 0 and atol == 0:
            refuse_if_bits_of_floats("np.testing.assert_allclose(rtol=0, atol=0)", sys._getframe(1), actual, desired)
        return assert_allclose(actual, desired, rtol, atol, *args, **kwargs)
    return guarded


torch.equal = refuse_float_bits("torch.equal", torch.equal)
np.array_equal = refuse_float_bits("np.array_equal", np.array_equal)
np.testing.assert_array_equal = refuse_float_bits("np.testing.assert_array_equal", np.testing.assert_array_equal)
np.testing.assert_equal = refuse_float_bits("np.testing.assert_equal", np.testing.assert_equal)
np.testing.assert_allclose = refuse_zero_tolerance(np.testing.assert_allclose)


# --- the app on localhost: one launch per test module -------------------------------------------------

SERVER_ENV = "EXPLORER_TEST_SERVER_ENV"


def server_env() -> dict:
    """What the server runs with beyond the tests' own environment: EXPLORER_TEST_SERVER_ENV, "NAME=value ..."
    (tests/test_cpu_variations.py gives the server other CPU kernels and threads than the test process)."""
    pairs = [item.partition("=") for item in os.environ.get(SERVER_ENV, "").split()]
    bad = [name for name, eq, _ in pairs if not eq or not name]
    if bad:
        raise ValueError(f"{SERVER_ENV}: got {os.environ[SERVER_ENV]!r}; allowed: NAME=value pairs separated by spaces")
    return {name: value for name, _, value in pairs}


@pytest.fixture(scope="module")
def server():
    """The app's url: app.py in its own process."""
    with running_app(env=server_env()) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client
    return Client(server, verbose=False)


@pytest.fixture(scope="module")
def browser(server):
    """(Debian chromium through playwright, the app's url)."""
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.fail("Debian chromium is required for the browser test (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = launch_browser(p)
        yield b, server
        b.close()
